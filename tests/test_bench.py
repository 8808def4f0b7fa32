"""The backend benchmark: one tiny run end to end (cells in subprocesses, the table and its JSON), and
the report's ratios and target checks on hand-made results."""

from kernel_attention.backends.bench import main
from kernel_attention.backends.bench_report import Result, load, summary, table


def test_bench_runs_a_tiny_grid_and_writes_its_table(tmp_path, capsys):
    out = tmp_path / "bench.md"
    assert main(["--T", "32", "--B", "1", "--H", "2", "--D", "8", "--kernels", "exp", "poly",
                 "--filters", "causal", "--repeats", "1", "--threads", "1", "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("Command: `") and "Machine: " in text and "dtype float32" in text
    rows = load([str(out) + ".json"])
    got = {(r.kernel, r.backend) for r in rows}
    # "torch-sdpa": the plain scaled_dot_product_attention baseline; "auto": whichever backend auto picks
    assert got == {("exp", "torch-sdpa"), ("exp", "dense"), ("exp", "auto"), ("poly", "dense"), ("poly", "linear")}
    assert all(r.status == "ok" and r.fb_ms > 0 and r.fwd_ms > 0 for r in rows), [r.status for r in rows]
    assert all(r.sdpa_fb_ms > 0 for r in rows if r.backend != "torch-sdpa")  # the paired baseline
    assert "| 32 | exp / none / causal | auto |" in text and "Targets:" in capsys.readouterr().out


def test_bench_times_training_shaped_calls_with_dropout(tmp_path):
    """--dropout reaches every backend and the SDPA baseline; a kernel with magnitude dropout runs."""
    out = tmp_path / "bench.md"
    assert main(["--T", "32", "--B", "1", "--H", "2", "--D", "8", "--kernels", "ikan-direct:official=true",
                 "--backends", "dense", "blockwise", "--dropout", "0.1", "--repeats", "1", "--threads", "1",
                 "--out", str(out)]) == 0
    assert "dropout 0.1" in out.read_text()
    rows = load([str(out) + ".json"])
    assert {r.backend for r in rows} == {"torch-sdpa", "dense", "blockwise"}
    assert all(r.status == "ok" and r.fb_ms > 0 for r in rows), [r.status for r in rows]


def test_bench_times_a_padded_batch_and_refuses_a_bad_fraction(tmp_path, capsys):
    """--padding: a key mask for every backend and the same keys masked in the SDPA baseline."""
    out = tmp_path / "bench.md"
    assert main(["--T", "32", "--B", "2", "--H", "2", "--D", "8", "--kernels", "exp", "--filters", "causal",
                 "--backends", "auto", "--padding", "0.25", "--repeats", "1", "--threads", "1",
                 "--out", str(out)]) == 0
    assert "padding 0.25" in out.read_text()
    rows = load([str(out) + ".json"])
    assert len(rows) == 2 and all(r.status == "ok" and r.fb_ms > 0 for r in rows), [r.status for r in rows]
    assert main(["--T", "32", "--padding", "1"]) == 2 and "--padding must be a fraction" in capsys.readouterr().err


def test_bench_times_grouped_query_attention_and_refuses_a_bad_head_count(tmp_path, capsys):
    """--kv-heads gives k and v fewer heads, for every backend and the SDPA baseline (its own enable_gqa)."""
    out = tmp_path / "bench.md"
    assert main(["--T", "32", "--B", "1", "--H", "4", "--D", "8", "--kv-heads", "2", "--kernels", "exp",
                 "--positions", "xl", "--backends", "dense", "--repeats", "1", "--threads", "1",
                 "--out", str(out)]) == 0
    assert "2 key/value heads" in out.read_text()
    rows = load([str(out) + ".json"])
    assert {r.backend for r in rows} == {"torch-sdpa", "dense"} and all(r.status == "ok" for r in rows)
    assert main(["--H", "4", "--kv-heads", "3"]) == 2 and "--kv-heads must be a divisor" in capsys.readouterr().err


def test_report_ratios_and_targets():
    r = [Result(4096, "exp", "none", "full", "torch-sdpa", 1.0, 2.0, 10.0),
         Result(4096, "exp", "shaw", "full", "dense", 20.0, 40.0, 1000.0, sdpa_fwd_ms=1.0, sdpa_fb_ms=2.0),
         Result(4096, "exp", "shaw", "full", "banded", 2.0, 3.0, 100.0, sdpa_fwd_ms=1.0, sdpa_fb_ms=2.0),
         Result(2048, "poly", "none", "full", "dense", 1.0, 1.0, 50.0, sdpa_fwd_ms=1.0, sdpa_fb_ms=1.0),
         Result(2048, "poly", "none", "full", "linear", 1.0, 2.0, 5.0, sdpa_fwd_ms=1.0, sdpa_fb_ms=1.0),
         Result(4096, "poly", "none", "full", "dense", 1.0, 8.0, 50.0, sdpa_fwd_ms=1.0, sdpa_fb_ms=1.0),
         Result(4096, "poly", "none", "full", "linear", 1.0, 4.0, 5.0, sdpa_fwd_ms=1.0, sdpa_fb_ms=1.0),
         Result(4096, "xl", "none", "full", "blockwise", status="out of GPU memory")]
    t = table(r)
    # shaw on banded: 3 / 2 = 1.50 of SDPA, 40 / 3 = 13.3x faster than dense, 100 / 1000 of its peak
    assert "| 4096 | exp / shaw / full | banded | 2 | 3 | 100 | 2.00 | 1.50 | 13.3 | 0.100 |" in t
    assert "out of GPU memory" in t
    s = summary(r)
    assert "| fwd+bwd / SDPA <= 1.8 | exp / shaw / full | banded | 4096 | 1.50 | yes |" in s
    assert "| peak this / dense <= 0.25 | exp / shaw / full | banded | 4096 | 0.100 | yes |" in s
    # linear loses at 2048 and wins at 4096: the crossover is 4096
    assert "from T=4096 (T=2048: dense/linear 0.50, T=4096: dense/linear 2.00)" in s
    assert summary(r[:1]).startswith("none measured here: the targets read fast backends at T >= 1024")  # no header
