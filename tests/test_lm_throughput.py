"""``benchmarks/lm_throughput.py``: our LM against torch.nn's, and our LM on several backends (the last the
reference), on a tiny configuration."""

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "lm_throughput.py"
TINY = ["--vocab", "40", "--d-model", "16", "--heads", "2", "--d-ff", "32", "--layers", "1", "--seq", "12",
        "--batch", "2", "--steps", "1", "--repeats", "2", "--threads", "1", "--device", "cpu"]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("lm_throughput", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_against_torch(bench, capsys):
    bench.main(TINY)
    out = capsys.readouterr().out
    assert "| ours |" in out and "| torch |" in out and "ratio ours / torch" in out


def test_backends_with_positions_in_bf16(bench, capsys):
    bench.main(TINY + ["--position", "xl", "--backends", "blockwise", "dense", "--bf16"])
    out = capsys.readouterr().out
    assert "positions xl, bf16" in out and "ratio blockwise / dense" in out and "| torch |" not in out
    params = out.split("params ")[1].splitlines()[0]
    assert params.split(", ")[0].split()[1] == params.split(", ")[1].split()[1]  # one model, two backends
