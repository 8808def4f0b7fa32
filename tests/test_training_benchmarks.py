"""The training benchmarks on a tiny config: ``benchmarks/train_ab.py`` trains it under its two settings,
alternately, with the policy field changed in B's runs only; ``benchmarks/optimizer_step.py`` times Adam's
implementations over its parameters."""

import importlib
import importlib.util
from pathlib import Path

import pytest
import torch
import yaml

from kernel_attention.training.config import TrainConfig

policy_module = importlib.import_module("kernel_attention.backends.policy")

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "train_ab.py"
CFG = {
    "task": {"name": "synthetic", "kind": "copy", "vocab": 5, "min_len": 2, "max_len": 3, "batch_size": 8,
             "train_size": 16, "valid_size": 4, "test_size": 4},
    "model": {"d_model": 8, "n_heads": 2, "d_ff": 8, "enc_layers": 1, "dec_layers": 1, "dropout": 0.0},
    "train": {"max_steps": 50, "lr": 0.01, "progress": False},
}


@pytest.fixture
def bench(tmp_path):
    spec = importlib.util.spec_from_file_location("train_ab_bench", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(CFG))
    return mod, str(path)


def test_policy_runs_alternate_with_the_field_changed_in_b_only(bench, capsys, monkeypatch):
    mod, cfg = bench
    seen = []

    def recording_train(c, out, resume):
        seen.append((c["train"]["max_steps"], policy_module.policy("cpu").sdpa_float32_max_keys))
        return real_train(c, out, resume=resume)

    real_train = mod.train
    monkeypatch.setattr(mod, "train", recording_train)
    shipped = policy_module.POLICIES["cpu"]
    mod.main([cfg, "--policy", "sdpa_float32_max_keys=None", "--steps", "2", "--repeats", "2"])
    assert seen == [(2, shipped.sdpa_float32_max_keys), (2, None)] * 2
    assert policy_module.POLICIES["cpu"] is shipped
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split(":")[0] for ln in lines if "updates in" in ln] == [
        f"sdpa_float32_max_keys={shipped.sdpa_float32_max_keys} (shipped)", "sdpa_float32_max_keys=None"] * 2
    assert lines[-1].startswith("sdpa_float32_max_keys=None / sdpa_float32_max_keys=")
    assert float(lines[-1].split(": ")[1].split()[0]) > 0


def test_compile_sets_train_compile_in_b_only(bench, monkeypatch):
    mod, cfg = bench
    seen = []
    monkeypatch.setattr(mod, "train", lambda c, out, resume: seen.append(c["train"].get("compile", False)))
    mod.main([cfg, "--compile", "--steps", "2"])
    assert seen == [False, True]


def test_per_parameter_adam_in_b_only(bench, monkeypatch):
    """B's trainer builds Adam without the fused implementation, A's with it, and the setting is restored."""
    mod, cfg = bench
    seen = []

    def recording_train(c, out, resume):
        opt = mod.optimizer_module.make_optimizer([torch.nn.Parameter(torch.zeros(2))], TrainConfig(max_steps=1),
                                                  torch.device("cpu"))
        seen.append(bool(opt.param_groups[0]["fused"]))

    monkeypatch.setattr(mod, "train", recording_train)
    mod.main([cfg, "--per-parameter-adam", "--steps", "2", "--repeats", "2"])
    assert seen == [True, False] * 2 and mod.optimizer_module.FUSED_DEVICES == ("cpu", "cuda")


def test_whole_shaw_table_in_b_only(bench, monkeypatch):
    """B's Shaw scheme reads its whole table at the default positions, A's the rows the distances reach, and the
    scheme is restored."""
    mod, cfg = bench
    seen = []
    layer = mod.ShawPosition(8, 2, 4, clip=100)
    monkeypatch.setattr(mod, "train", lambda c, out, resume: seen.append(layer.reach(5, 5, 0)))
    mod.main([cfg, "--whole-shaw-table", "--steps", "2", "--repeats", "2"])
    assert seen == [7, 100] * 2 and layer.reach(5, 5, 0) == 7


@pytest.mark.parametrize("bad", ["sdpa_float32_max_keys", "no_such_field=1", "sdpa_float32_max_keys=many"])
def test_a_bad_policy_argument_exits_2_naming_what_is_accepted(bench, capsys, bad):
    mod, cfg = bench
    with pytest.raises(SystemExit) as e:
        mod.main([cfg, "--policy", bad])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "sdpa_float32_max_keys" in err and ("integer or None" in err or "FIELD=VALUE" in err)


def test_optimizer_step_prints_a_row_per_implementation_and_thread_count(bench, capsys):
    """``benchmarks/optimizer_step.py`` on the same tiny config."""
    _, cfg = bench
    spec = importlib.util.spec_from_file_location("optimizer_step_bench", SCRIPT.parent / "optimizer_step.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.main([cfg, "--threads", "1", "0", "--repeats", "2"])
    rows = [r.split("|") for r in capsys.readouterr().out.splitlines() if r.startswith("| ") and "ms" not in r]
    assert [r[2].strip() for r in rows] == list(mod.IMPLEMENTATIONS) * 2
    assert all(float(r[3]) > 0 for r in rows) and [float(r[4]) for r in rows][2::3] == [1.0, 1.0]
