"""End-to-end study on synthetic data: table, CSV, plots written; a second invocation resumes, not re-runs."""

import csv
import json
import re

import pytest

from kernel_attention.study import StudyOptions, execute, get_study, study_names
from kernel_attention.study.core import TableSpec
from kernel_attention.study.report import summarize_cell


def test_smoke_study_end_to_end_and_resume(tmp_path):
    out = tmp_path / "studies"
    logs = []
    execute("synthetic-smoke", StudyOptions(scale="small", seeds=1), out, command="test", log=logs.append)
    sdir = out / "synthetic-smoke"
    rows = list(csv.DictReader((sdir / "runs.csv").open()))
    assert sorted(r["row"] for r in rows) == ["exp", "rbf"]
    assert all(r["status"] == "ok" and r["steps"] == "6" for r in rows)
    from kernel_attention.machine import numerics
    assert all(r["machine"] == numerics() and "torch" in r["machine"] for r in rows)  # what decides the rounding
    assert all(r["command"] == "test" for r in rows)  # and what ran it
    from kernel_attention.tasks.runner import build_task
    cell = next(c for c in get_study("synthetic-smoke").cells(StudyOptions(scale="small", seeds=1))[0]
                if c.row == "exp")
    size = sum(p.numel() for p in build_task(cell.config).build_model().parameters())
    assert [int(r["params"]) for r in rows if r["row"] == "exp"] == [size]   # and the model's size
    table = (sdir / "table.md").read_text()
    assert "| exponential |" in table and "| RBF |" in table and "train.max_steps = 6" in table
    assert (sdir / "figures" / "curves_copy.png").stat().st_size > 1000
    cells = sorted((sdir / "cells").iterdir())
    assert len(cells) == 2 and all((c / "result.json").is_file() and (c / "last.pt").is_file() for c in cells)
    mtimes = {c.name: (c / "result.json").stat().st_mtime_ns for c in cells}
    ckpts = {c.name: (c / "last.pt").stat().st_mtime_ns for c in cells}

    # second invocation: both cells are finished and must be skipped (nothing rewritten)
    logs2 = []
    execute("synthetic-smoke", StudyOptions(scale="small", seeds=1), out, log=logs2.append)
    assert any("2 already finished, 0 to run" in m for m in logs2)
    assert {c.name: (c / "result.json").stat().st_mtime_ns for c in cells} == mtimes
    assert {c.name: (c / "last.pt").stat().st_mtime_ns for c in cells} == ckpts

    # a removed marker re-runs only that cell; the Trainer finds it finished and only re-collects it
    (cells[0] / "result.json").unlink()
    logs3 = []
    execute("synthetic-smoke", StudyOptions(scale="small", seeds=1), out, log=logs3.append)
    assert any("1 already finished, 1 to run" in m for m in logs3)
    assert json.loads((cells[0] / "result.json").read_text())["cell"] == cells[0].name     # written again
    assert (cells[0] / "last.pt").stat().st_mtime_ns == ckpts[cells[0].name]               # not trained again
    assert json.loads((cells[1] / "result.json").read_text())["cell"] == cells[1].name
    assert (cells[1] / "result.json").stat().st_mtime_ns == mtimes[cells[1].name]


def test_processes_sharing_a_study_skip_each_others_cells(tmp_path):
    """A cell whose lock another process holds is skipped, not run twice; the lock goes with its process
    (a killed holder leaves the cell free for the next invocation)."""
    import signal
    import subprocess
    import sys

    from kernel_attention.study.locks import cell_lock
    from kernel_attention.study.runner import cell_dir

    out = tmp_path / "studies"
    opts = StudyOptions(scale="small", seeds=1)
    study = get_study("synthetic-smoke")
    first, second = (cell_dir(out, study, c) for c in study.build(opts)[0])
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; "
         "from kernel_attention.study.locks import cell_lock\n"
         "with cell_lock(Path(sys.argv[1])) as held:\n print(held, flush=True); time.sleep(600)", str(first)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "True"
        logs = []
        execute("synthetic-smoke", opts, out, log=logs.append)
        assert any(first.name in m and "running in another process, skipped" in m for m in logs)
        assert not (first / "result.json").exists() and (second / "result.json").is_file()
        with cell_lock(first) as held:
            assert not held
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    logs = []
    execute("synthetic-smoke", opts, out, log=logs.append)
    assert any("1 already finished, 1 to run" in m for m in logs)
    assert (first / "result.json").is_file()


def test_collect_only_keeps_the_machine_and_command_the_cells_ran_with(tmp_path):
    """Cells run on one machine (a GPU node, say) and collected on another: the table names the
    machine and command recorded when they ran, not the collecting host."""
    out = tmp_path / "studies"
    execute("synthetic-smoke", StudyOptions(scale="small", seeds=1), out, command="run-cmd", log=lambda m: None)
    meta = out / "synthetic-smoke" / "study.json"
    recorded = json.loads(meta.read_text())
    recorded["machine"] = "x86_64 16 CPU cores, Linux, torch 2.11.0+cu130, 2 thread(s), GPU NVIDIA H100 80GB HBM3"
    meta.write_text(json.dumps(recorded))
    execute("synthetic-smoke", StudyOptions(scale="small", seeds=1), out, log=lambda m: None, run=False,
            figures=False)
    table = (out / "synthetic-smoke" / "table.md").read_text()
    assert "GPU NVIDIA H100 80GB HBM3" in table and "`run-cmd`" in table
    assert json.loads(meta.read_text())["machine"] == recorded["machine"]


def test_records_name_their_command_and_older_ones_the_folders_earlier_invocation(tmp_path):
    """Each record keeps the command line that finished it, and the table lists every command with its cells.
    Records written before that (no "command", no "machine"; here one cell's fields stripped) are put under the
    command and machine an older study.json recorded for the folder, and later invocations keep them."""
    out = tmp_path / "studies"
    opts = StudyOptions(scale="small", seeds=1)
    execute("synthetic-smoke", opts, out, command="old-cmd", log=lambda m: None, figures=False)
    sdir = out / "synthetic-smoke"
    old, new = sorted((sdir / "cells").iterdir())
    rec = json.loads((old / "result.json").read_text())
    del rec["command"], rec["machine"]
    (old / "result.json").write_text(json.dumps(rec))
    gpu = "x86_64 16 CPU cores, Linux, torch 2.11.0+cu130, 1 thread(s), GPU NVIDIA H100 80GB HBM3"
    (sdir / "study.json").write_text(json.dumps({"command": "old-cmd on a GPU", "machine": gpu}))  # older format
    (new / "result.json").unlink()
    execute("synthetic-smoke", opts, out, command="new-cmd", log=lambda m: None, figures=False)
    for collect in (False, True):
        if collect:
            execute("synthetic-smoke", opts, out, log=lambda m: None, figures=False, run=False)
        table = (sdir / "table.md").read_text()
        assert "Commands, each with the number of cells it finished:\n\n- `new-cmd` (1 cell)\n" \
               "- 1 cell whose records name no command; the folder's earlier record says: old-cmd on a GPU\n" in table
        from kernel_attention.machine import numerics
        assert f"min on {numerics()} (1 cell); " in table and f"min on {gpu} (1 cell)." in table
        assert json.loads((sdir / "study.json").read_text())["earlier"] == {"command": "old-cmd on a GPU",
                                                                           "machine": gpu}
    rows = {r["cell"]: r for r in csv.DictReader((sdir / "runs.csv").open())}
    assert rows[new.name]["command"] == "new-cmd" and rows[old.name]["command"] == ""


def test_command_lines_of_the_table():
    """Rows of an older runs.csv alone: the invocation's command, as one line.  Records that name their
    commands: each command with its cells, the first twelve (then how many more the CSV names)."""
    from kernel_attention.study.report import render_tables

    study = get_study("synthetic-smoke")
    rec = {"table": "copy", "row": "exp", "col": "copy", "seed": 1, "status": "ok", "valid": 0.5, "test": 0.5}
    text = render_tables(study, [rec], [], "small", command="kernel-attention study x", wall_s=60, machine="host")
    assert "\nCommand: `kernel-attention study x`\nWall time of the cells (sum): 1.0 min on host.\n" in text
    assert "Commands," not in render_tables(study, [rec], [], "small")
    many = [dict(rec, seed=i, command=f"kernel-attention study x --only c{i}") for i in range(14)]
    text = render_tables(study, many + many[:1], [], "small")
    assert "- `kernel-attention study x --only c0` (2 cells)\n" in text and "--only c11` (1 cell)\n" in text
    assert "--only c12`" not in text and "- 2 more commands (2 cells): the `command` column of runs.csv\n" in text


def test_protocols():
    t = TableSpec("t", "t", "bleu", True, [("a", "a")], [("c", "c")], {})
    runs = [{"seed": 1, "status": "ok", "valid": 10.0, "test": 30.0},
            {"seed": 2, "status": "ok", "valid": 12.0, "test": 20.0},
            {"seed": 3, "status": "diverged", "valid": float("nan"), "test": float("nan")}]
    best = summarize_cell("best_valid", t, runs)
    assert best["value"] == 20.0 and best["best_seed"] == 2 and "1/3 diverged" in best["text"]
    ms = summarize_cell("mean_std", t, runs[:2])
    assert ms["text"] == "25.00±5.00"
    assert summarize_cell("best_valid", t, runs[2:])["text"].startswith("not converge")


def test_every_paper_study_is_registered_and_builds():
    names = study_names()
    for name in ["dissection-positions", "dissection-kernels", "dissection-order", "dissection-values",
                 "ika-classification", "ika-translation", "ika-regression", "ika-graphs"]:
        assert name in names
        st = get_study(name)
        for scale in ("small", "paper"):
            cells, shrink = st.build(StudyOptions(scale=scale))
            assert cells and len({c.id for c in cells}) == len(cells)
            tables = {t.name for t in st.tables}
            assert {c.table for c in cells} <= tables
            if scale == "small":
                assert shrink  # small always says what it changed
    with pytest.raises(KeyError, match="accepted"):
        get_study("nope")


def test_a_scale_removes_a_setting_of_the_paper_config_and_says_so():
    """The paper's SP configs have Transformer-XL's adaptive soft-max, whose cutoffs exceed WikiText-2's
    vocabulary: the small scale removes the setting (a full soft-max) and lists the removal among its changes;
    a setting of None (eval.max_sentences at the converged scale: all sentences) stays a setting."""
    st = get_study("dissection-positions")
    paper = {c.id: c for c in st.build(StudyOptions(scale="paper"))[0]}
    cells, shrink = st.build(StudyOptions(scale="small"))
    sp = [c for c in cells if c.table == "t1-sp"]
    assert sp and all("adaptive" not in c.config["model"] for c in sp)
    assert all(paper[c.id].config["model"]["adaptive"]["cutoffs"] == [20000, 40000, 200000] for c in sp)
    assert any("model.adaptive removed" in line for line in shrink)
    nmt = [c for c in st.build(StudyOptions(scale="converged"))[0] if c.table == "t1-nmt"]
    assert all(c.config["eval"]["max_sentences"] is None for c in nmt)


def test_classification_runs_differ_on_every_dataset():
    """Cross-validated datasets vary the fold; TREC and SST, which have one given split, vary the seed
    (otherwise their runs would be copies of one another and report a std of 0)."""
    cells, _ = get_study("ika-classification").build(StudyOptions(scale="small", seeds=3))
    for ds in ("mr", "cr", "subj", "trec", "sst2"):
        runs = [c.config for c in cells if c.col == ds and c.row == "ikan"]
        assert len(runs) == 3
        key = "seed" if ds in ("trec", "sst2") else "fold"
        values = [r["seed"] if key == "seed" else r["task"]["fold"] for r in runs]
        assert len(set(values)) == 3, (ds, values)


def test_small_dissection_cells_are_shrunk():
    cells, shrink = get_study("dissection-kernels").build(StudyOptions(scale="small", seeds=2))
    sp = [c for c in cells if c.tags["kind"] == "sp"]
    assert len(cells) == 32 and {c.seed for c in cells} == {1, 2}
    assert all(c.config["model"]["d_model"] == 64 and c.config["data"]["dataset"] == "wikitext-2" for c in sp)
    assert any("WikiText-103 is not staged" in s for s in shrink)


@pytest.mark.parametrize("name", ["dissection-positions", "dissection-kernels", "dissection-order",
                                  "dissection-values", "ika-translation"])
def test_converged_cells_train_until_the_validation_metric_stops_improving(name):
    """--scale converged: three seeds, the staged data, early stopping on whole-split validation, the best
    checkpoint tested; the model sized by CONVERGED_NMT / CONVERGED_SP over each paper config's choices."""
    from kernel_attention.study.dissection import CONVERGED_NMT, CONVERGED_SP, load_paper_config

    cells, shrink = get_study(name).cells(StudyOptions(scale="converged"))
    assert {c.scale for c in cells} == {"converged"}
    by_variant = {}
    for c in cells:
        by_variant.setdefault((c.table, c.row, c.col), []).append(c.seed)
        cfg, nmt = c.config, c.config["task"]["name"] == "translation"
        over = CONVERGED_NMT if nmt else CONVERGED_SP
        for sec, kv in over.items():
            assert {k: cfg[sec][k] for k in kv} == kv, (c.id, sec)
        assert cfg["data"]["dataset"] == ("multi30k" if nmt else "wikitext-2")
        assert cfg["train"]["patience"] >= 1 and cfg["train"]["eval_every"] > 0
        assert cfg["train"].get("test_best", True) and "max_epochs" not in cfg["train"]
        paper = load_paper_config(c.tags["config"]) if "config" in c.tags else None
        if paper is not None:   # the variant's own choices (kernel, positions, value) are the paper config's
            for place in ("encoder_attention", "decoder_attention", "cross_attention", "attention"):
                if place in paper["model"]:
                    assert cfg["model"][place] == paper["model"][place], (c.id, place)
    assert all(len(s) == 3 and len(set(s)) == 3 for s in by_variant.values())
    assert any("patience" in line for line in shrink) and any("whole" in line for line in shrink)


def test_each_scale_runs_in_its_own_folder_and_a_missing_scale_is_named(tmp_path, capsys):
    from kernel_attention.cli import main
    from kernel_attention.study.runner import cell_dir

    study = get_study("dissection-positions")
    (small,) = [c for c in study.cells(StudyOptions(scale="small"))[0] if c.id == "t1-nmt__vaswani__nmt__s1"]
    (conv,) = [c for c in study.cells(StudyOptions(scale="converged"))[0] if c.id == small.id]
    assert cell_dir(tmp_path, study, small) == tmp_path / "dissection-positions" / "cells" / small.id
    assert cell_dir(tmp_path, study, conv) == tmp_path / "dissection-positions-converged" / "cells" / small.id
    with pytest.raises(ValueError, match="study ika-graphs has no 'converged' scale; accepted: small, paper"):
        get_study("ika-graphs").cells(StudyOptions(scale="converged"))
    assert main(["study", "ika-graphs", "--scale", "converged", "--list"]) == 2
    assert "has no 'converged' scale" in capsys.readouterr().err


def test_probe_adds_similarity_and_magnitude(tmp_path):
    """Fig. 3 data: a probed cell logs per-place max similarity (in (0, 1]) and mean log magnitude."""
    from kernel_attention.study.core import Cell
    from kernel_attention.study.runner import run_cell

    c = get_study("synthetic-smoke").build(StudyOptions(scale="small"))[0][0]
    c = Cell(c.study, c.table, c.row, c.col, c.seed, c.config, {"probe": True})
    rec = run_cell(c, tmp_path / "cell", "exact_match")
    assert rec["status"] == "ok"
    valid = [json.loads(x) for x in (tmp_path / "cell" / "metrics.jsonl").read_text().splitlines()]
    valid = [r for r in valid if r["split"] == "valid"]
    sims = [v for r in valid for k, v in r.items() if k.endswith(".max_similarity")]
    mags = [k for r in valid for k in r if k.endswith(".mean_log_magnitude")]
    assert len(sims) == 3 * len(valid) and len(mags) == len(sims)  # encoder self, decoder self, cross
    assert all(0.0 < s <= 1.0 + 1e-6 for s in sims)


def test_training_curves_leave_out_columns_without_logged_runs(tmp_path):
    """A column whose cells have no metrics.jsonl (results carried over without their run folder) gets
    no panel; a table with no curve at all gets no figure."""
    import matplotlib.image

    from kernel_attention.study.core import Cell
    from kernel_attention.study.figures import training_curves

    table = TableSpec("t", "T", "accuracy", True, [("a", "A")], [("x", "X"), ("y", "Y")], {})
    cells = [Cell("s", "t", "a", col, 1, {}) for col in ("x", "y")]
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "metrics.jsonl").write_text(
        "\n".join(json.dumps({"split": "train", "step": s, "loss": 1.0 / s}) for s in range(1, 6)))
    dir_of = lambda c: tmp_path / c.col  # noqa: E731
    done = [{"cell": c.id, "status": "ok"} for c in cells]
    one = training_curves(tmp_path / "fig", table, cells, dir_of, done)
    h, w = matplotlib.image.imread(one).shape[:2]
    assert w < 1.5 * h  # one panel (4.2 x 3.2 in), not two side by side
    (tmp_path / "x" / "metrics.jsonl").unlink()
    assert training_curves(tmp_path / "fig2", table, cells, dir_of, done) is None


def test_paper_scale_with_fewer_runs_says_so():
    for name, expected in (("ika-graphs", "seeds: 2 of the paper's 10"), ("ika-regression", "the first 2 of the 10"),
                           ("ika-classification", "the first 2 of the 10")):
        _, shrink = get_study(name).build(StudyOptions(scale="paper", seeds=2))
        assert any(expected in s for s in shrink), (name, shrink)
        _, shrink = get_study(name).build(StudyOptions(scale="paper"))
        assert not any(expected in s for s in shrink)


def test_import_runs_carries_finished_cells_and_rejects_other_studies(tmp_path):
    """A runs.csv carried into a new folder: its cells count as finished (not re-run), the table renders
    the same numbers, more seeds run on top, and a CSV of another study or scale is refused."""
    first = tmp_path / "first"
    execute("synthetic-smoke", StudyOptions(scale="small", seeds=1), first, log=lambda m: None, figures=False)
    csv_path = first / "synthetic-smoke" / "runs.csv"
    table = (first / "synthetic-smoke" / "table.md").read_text()

    out = tmp_path / "second"
    logs = []
    res = execute("synthetic-smoke", StudyOptions(scale="small", seeds=2), out, log=logs.append, figures=False,
                  import_from=(csv_path,))
    assert any("imported 2 finished cell(s)" in m for m in logs)
    assert any("4 cells, 2 already finished, 2 to run" in m for m in logs)
    cells = out / "synthetic-smoke" / "cells"
    assert sorted(p.name for p in cells.iterdir() if (p / "last.pt").is_file()) == \
        ["copy__exp__exact__s1", "copy__rbf__exact__s1"]  # only the new seed trained here
    carried = json.loads((cells / "copy__exp__exact__s0" / "result.json").read_text())
    original = json.loads((first / "synthetic-smoke" / "cells" / "copy__exp__exact__s0" / "result.json").read_text())
    assert carried["imported_from"] == str(csv_path)
    assert carried["test"] == pytest.approx(original["test"], rel=1e-12) and carried["seed"] == 0
    assert len(res["results"]) == 4

    # collecting only the imported seed renders the first folder's table (the numbers, not the command line)
    logs = []
    execute("synthetic-smoke", StudyOptions(scale="small", seeds=1), tmp_path / "third", run=False,
            figures=False, log=logs.append, import_from=(csv_path,))
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    assert rows and all(r in (tmp_path / "third" / "synthetic-smoke" / "table.md").read_text() for r in rows)
    # importing again changes nothing: the cells are finished here now
    execute("synthetic-smoke", StudyOptions(scale="small", seeds=1), tmp_path / "third", run=False,
            figures=False, log=logs.append, import_from=(csv_path,))
    assert any("imported 0 finished cell(s)" in m and "2 already finished here" in m for m in logs)

    text = csv_path.read_text()
    (tmp_path / "other.csv").write_text(text.replace("synthetic-smoke,small", "dissection-kernels,small"))
    (tmp_path / "paper.csv").write_text(text.replace("synthetic-smoke,small", "synthetic-smoke,paper"))
    (tmp_path / "bad.csv").write_text(text.replace(",rbf,exact,0,", ",rbf,exact,1,"))  # the second row
    for name, message in (("other.csv", "a row of study 'dissection-kernels'"), ("paper.csv", "scale 'paper'"),
                          ("bad.csv", "line 3: cell copy__rbf__exact__s0 but {'seed': 1}"), ("missing.csv", "no such file")):
        with pytest.raises(ValueError, match=re.escape(message)):
            execute("synthetic-smoke", StudyOptions(scale="small", seeds=1), tmp_path / "fourth", run=False,
                    figures=False, log=lambda m: None, import_from=(tmp_path / name,))
        assert not list((tmp_path / "fourth").glob("*/cells/*/result.json"))  # nothing of a wrong file


def test_training_curves_name_a_row_whose_first_seeds_were_carried(tmp_path, monkeypatch):
    """Seeds 1-3 carried (no log), seeds 4-5 run here: the row still gets its legend entry, once, on the
    line of one logged seed."""
    from kernel_attention.study import figures
    from kernel_attention.study.core import Cell

    table = TableSpec("t", "T", "ppl", False, [("a", "A"), ("b", "B")], [("x", "X")], {})
    cells = [Cell("s", "t", row, "x", seed, {}) for row in ("a", "b") for seed in range(1, 6)]
    for c in cells:
        if c.seed >= 4:
            (tmp_path / c.id).mkdir()
            (tmp_path / c.id / "metrics.jsonl").write_text(
                "\n".join(json.dumps({"split": "train", "step": s, "loss": 1.0 / s}) for s in range(1, 6)))
    saved = []
    monkeypatch.setattr(figures, "_save", lambda fig, path: saved.append(fig) or str(path))
    done = [{"cell": c.id, "status": "ok"} for c in cells]
    figures.training_curves(tmp_path / "fig", table, cells, lambda c: tmp_path / c.id, done)
    lines, labels = saved[0].axes[0].get_legend_handles_labels()
    assert labels == ["A", "B"] and len(saved[0].axes[0].get_lines()) == 2


def test_a_resumed_cell_records_the_time_of_its_earlier_runs(tmp_path, monkeypatch):
    """``wall_s`` of a cell finished over several invocations is their training time together: this
    invocation's plus the ``elapsed_s`` of the checkpoint it resumed from."""
    from kernel_attention.study.runner import run_cell
    from kernel_attention.training.checkpoint import load_checkpoint, save_checkpoint

    c = get_study("synthetic-smoke").build(StudyOptions(scale="small"))[0][0]
    monkeypatch.setenv("KA_STOP_AFTER", "3")  # killed after step 3; last.pt is step 2's
    run_cell(c, tmp_path / "cell", "exact_match")
    monkeypatch.delenv("KA_STOP_AFTER")
    ck = load_checkpoint(tmp_path / "cell" / "last.pt")
    assert ck["step"] == 2 and 0.0 < ck["elapsed_s"] < 600.0
    ck["elapsed_s"] = 5000.0  # as if the first invocation had trained for 5000 s up to step 2
    save_checkpoint(tmp_path / "cell" / "last.pt", ck)
    rec = run_cell(c, tmp_path / "cell", "exact_match")
    assert rec["status"] == "ok" and rec["steps"] == 6
    assert 5000.0 < rec["wall_s"] < 5600.0
    last = json.loads((tmp_path / "cell" / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["wall_s"] > 5000.0


def test_checkpoint_minutes_is_a_setting_of_the_invocation_not_of_the_cells(tmp_path, capsys):
    """``--checkpoint-minutes`` reaches each cell's trainer (its last.pt records it) and leaves the cells'
    configurations, so their keys, as they are; a value that is not positive is refused by name."""
    from kernel_attention.cli import main
    from kernel_attention.study.runner import cell_dir
    from kernel_attention.training.checkpoint import load_checkpoint

    out = tmp_path / "st"
    assert main(["study", "synthetic-smoke", "--out", str(out), "--checkpoint-minutes", "0.5", "--no-figures"]) == 0
    study = get_study("synthetic-smoke")
    for c in study.build(StudyOptions(scale="small"))[0]:
        d = cell_dir(out, study, c)
        assert load_checkpoint(d / "last.pt")["config"]["checkpoint_minutes"] == 0.5
        assert "checkpoint_minutes" not in json.dumps(c.config)
        assert json.loads((d / "result.json").read_text())["config"] == c.key
    for bad in ("0", "-1", "nan"):
        assert main(["study", "synthetic-smoke", "--out", str(out), "--checkpoint-minutes", bad]) == 2
        assert "--checkpoint-minutes must be > 0" in capsys.readouterr().err


def test_wall_time_line_names_each_machine_the_cells_ran_on():
    """Cells run on two machines and collected in one folder: the table's wall time is split by the machine
    each record names, not given to the collecting host alone."""
    from kernel_attention.study.report import render_tables

    study = get_study("synthetic-smoke")
    rec = {"table": "copy", "row": "exp", "col": "copy", "status": "ok", "valid": 0.5, "test": 0.5}
    cpu, gpu = "AMD EPYC (AVX512), torch 2.13.0+cpu", "Intel Xeon, torch 2.11.0+cu130, GPU NVIDIA H100"
    runs = [dict(rec, seed=1, machine=cpu, wall_s=600), dict(rec, seed=2, machine=cpu, wall_s=300),
            dict(rec, seed=3, machine=gpu, wall_s=120), dict(rec, seed=4, machine="", wall_s=60)]
    line = next(x for x in render_tables(study, runs, [], "small", wall_s=1080, machine="host").splitlines()
                if x.startswith("Wall time"))
    assert line == (f"Wall time of the cells (sum): 18.0 min: 15.0 min on {cpu} (2 cells); 2.0 min on {gpu} "
                    "(1 cell); 1.0 min on machines not recorded (1 cell).")
    one = render_tables(study, runs[:2], [], "small", wall_s=900, machine="host")
    assert "Wall time of the cells (sum): 15.0 min on host." in one
    # one machine named and the others not: not all on the host; the unnamed under the folder's earlier machine
    mixed = render_tables(study, runs[:2] + runs[3:], [], "small", wall_s=960, machine="host",
                          earlier={"machine": gpu})
    assert f"Wall time of the cells (sum): 16.0 min: 15.0 min on {cpu} (2 cells); 1.0 min on {gpu} (1 cell)." in mixed
    # cells carried over from a twin (wall 0) are neither summed under a machine nor left unsaid
    twin = dict(rec, seed=5, machine=gpu, wall_s=0, same_config_as="other-set/cell")
    carried = render_tables(study, runs[:2] + [twin], [], "small", wall_s=900, machine="host")
    assert ("Wall time of the cells (sum): 15.0 min on host. 1 cell carried over from a run of the same "
            "configuration, not counted.") in carried
    only = render_tables(study, [twin], [], "small", wall_s=0, machine="host")
    assert ("Wall time of the cells: none trained for this set yet. 1 cell carried over from a run of the same "
            "configuration, not counted.") in only


def test_regression_study_runs_the_gp_rows_on_the_attention_rows_splits():
    """IKA Table 4's GP (RBF) and GP (SM) rows are cells like the others: a GP model on the very task (data,
    scaling, split, selection) of the Transformer's cell of the same column and split."""
    study = get_study("ika-regression")
    for scale in ("small", "paper"):
        cells, _ = study.build(StudyOptions(scale=scale, seeds=2))
        by = {(c.row, c.col, c.seed): c.config for c in cells if c.table == "t4"}
        for ds in ("co2", "airline", "housing", "concrete", "parkinsons"):
            for split in (0, 1):
                transformer = by[("transformer", ds, split)]
                for row, kernel in (("gp_rbf", "rbf"), ("gp_sm", "sm")):
                    gp = by[(row, ds, split)]
                    assert gp["model"]["name"] == "gp" and gp["model"]["kernel"] == kernel
                    assert gp["task"] == transformer["task"] and gp["data"] == transformer["data"]
                    assert gp["train"]["max_epochs"] == (100 if scale == "small" else 200)
    labels = dict(study.tables[0].rows)
    assert labels["gp_rbf"] == "GP (RBF)" and labels["gp_sm"] == "GP (SM)"


def test_regression_curves_leave_the_gp_rows_out(tmp_path, monkeypatch):
    """The GP rows train on a negative log likelihood (negative, on other axes than the MSE): Table 4's curves
    draw the attention rows alone, and a column only a GP logged gets no panel."""
    from kernel_attention.study import figures, ika
    from kernel_attention.study.ika import _reg_figures

    panels = []   # the column titles of each curve figure drawn

    def curves(fig_dir, table, cells, dir_of, results):
        fig = figures.training_curves_figure(table, cells, dir_of, results)
        if fig is not None:
            panels.append(sorted({ax.get_title().split(":")[0] for ax in fig.axes if ax.get_title()}))
        return figures.training_curves(fig_dir, table, cells, dir_of, results)
    monkeypatch.setattr(ika, "training_curves", curves)

    cells = [c for c in get_study("ika-regression").build(StudyOptions(scale="small", seeds=1))[0]
             if c.table == "t4" and c.col in ("co2", "housing")]
    dir_of = lambda c: tmp_path / c.id  # noqa: E731

    def log(cell, losses):
        dir_of(cell).mkdir(parents=True, exist_ok=True)
        (dir_of(cell) / "metrics.jsonl").write_text("\n".join(
            json.dumps({"split": "train", "step": s, "loss": v}) for s, v in enumerate(losses, start=1)))
    for c in cells:
        if c.row.startswith("gp_"):
            log(c, [0.5, -1.0, -2.0])
    done = [{"cell": c.id, "table": c.table, "status": "ok"} for c in cells]
    assert _reg_figures(tmp_path / "fig", cells, dir_of, done) == [] and panels == []
    log(next(c for c in cells if c.row == "transformer" and c.col == "co2"), [1.0, 0.5, 0.2])
    assert len(_reg_figures(tmp_path / "fig", cells, dir_of, done)) == 1
    log(next(c for c in cells if c.row == "mikan" and c.col == "housing"), [1.0, 0.5, 0.2])
    assert len(_reg_figures(tmp_path / "fig2", cells, dir_of, done)) == 1
    assert len(panels[0]) == 1 and len(panels[1]) == 2   # Housing's GP curves opened no panel


def test_a_missing_package_stops_the_study_and_records_nothing(tmp_path, monkeypatch, capsys):
    """A cell that needs a package this machine lacks (the GP rows need GPyTorch) is not a failed cell: the study
    stops with the install hint, writes no result.json, and the cell runs once the package is there."""
    import kernel_attention.tasks.runner as task_runner
    from kernel_attention.cli import main

    prepare = task_runner.prepare

    def without_gpytorch(cfg):
        raise ImportError("model 'gp' needs GPyTorch (No module named 'gpytorch'); install it with: "
                          "pip install 'kernel-attention[baselines]'")
    monkeypatch.setattr(task_runner, "prepare", without_gpytorch)
    out = tmp_path / "st"
    assert main(["study", "synthetic-smoke", "--out", str(out), "--no-figures"]) == 2
    assert "pip install 'kernel-attention[baselines]'" in capsys.readouterr().err
    assert not list(out.rglob("result.json"))
    monkeypatch.setattr(task_runner, "prepare", prepare)
    assert main(["study", "synthetic-smoke", "--out", str(out), "--no-figures"]) == 0
    assert len(list(out.rglob("result.json"))) == 2


@pytest.mark.parametrize("signame,status", [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_stop_asked_during_a_cells_final_evaluation_stops_the_study_after_that_cell(
        tmp_path, monkeypatch, capsys, signame, status):
    """Ctrl-C or SIGTERM after a cell's last logged step (its final evaluation) lets the cell finish and record its
    result, then stops the study before the next cell, as a stop during training does; the same command then
    runs the cells left and only those."""
    import signal

    from kernel_attention.cli import main
    from kernel_attention.training.loop import Trainer

    signum = getattr(signal, signame)
    finish, asked = Trainer._finish, []

    def finish_with_a_signal(self):
        if not asked:
            asked.append(self.run_dir.name)
            signal.raise_signal(signum)  # the trainer's handler notes it; the evaluation goes on
        return finish(self)

    monkeypatch.setattr(Trainer, "_finish", finish_with_a_signal)
    before = signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)
    out = tmp_path / "st"
    try:
        assert main(["study", "synthetic-smoke", "--out", str(out), "--no-figures"]) == status
    finally:
        signal.signal(signum, before)
    err = capsys.readouterr().err
    assert f"interrupted: stopped after cell {asked[0]}, its result written" in err and "Traceback" not in err
    assert [p.parent.name for p in out.rglob("result.json")] == asked
    assert json.loads(next(out.rglob("result.json")).read_text())["status"] == "ok"
    assert main(["study", "synthetic-smoke", "--out", str(out), "--no-figures"]) == 0
    assert "1 already finished, 1 to run" in capsys.readouterr().out
    assert len(list(out.rglob("result.json"))) == 2
