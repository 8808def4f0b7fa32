"""The study scripts of ``scripts/``: their queues name cells that exist, and the CPU queue leaves none out."""

from __future__ import annotations

import fcntl
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kernel_attention.study.core import StudyOptions, get_study
from kernel_attention.study.results_page import WHERE_TRAINED
from kernel_attention.study.runner import select_cells

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
#: the studies whose converged cells scripts/converged_on_cpu.sh trains
CONVERGED = ("dissection-positions", "dissection-kernels", "dissection-order", "dissection-values", "ika-translation")


def _array(script: str, name: str) -> list[str]:
    """The words of the bash array ``name=( ... )`` in ``scripts/<script>``: the first assignment of a list of
    words (not ``"$@"``)."""
    text = (SCRIPTS / script).read_text()
    m = re.search(rf"\b{name}=\(([a-z].*?)\)", text, re.S)
    assert m, f"no array {name} in scripts/{script}"
    return m.group(1).split()


def _selected(entry: str, scale: str = "converged") -> list:
    """The cells a ``STUDY:ONLY[@N]`` entry runs (ONLY empty: the whole study; N processes)."""
    name, _, only = entry.partition("@")[0].partition(":")
    cells, _ = get_study(name).cells(StudyOptions(scale=scale))
    return select_cells(cells, tuple(o for o in only.split(",") if o), name)


@pytest.mark.parametrize("script", sorted(p.name for p in SCRIPTS.glob("*.sh")))
def test_scripts_parse(script):
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    subprocess.run(["bash", "-n", str(SCRIPTS / script)], check=True)


def test_the_cpu_queue_names_cells_and_leaves_no_converged_cell_out():
    queue = _array("converged_on_cpu.sh", "QUEUE")
    covered = set()
    for entry in queue:
        cells = _selected(entry)
        assert cells, entry
        covered |= {(c.study, c.id) for c in cells}
    for name in CONVERGED:
        cells, _ = get_study(name).cells(StudyOptions(scale="converged"))
        missing = [c.id for c in cells if (c.study, c.id) not in covered]
        assert not missing, f"scripts/converged_on_cpu.sh never runs {name}'s {missing[:3]}"


def test_the_cpu_queue_runs_the_nmt_columns_and_ika_table_3_before_the_sp_columns():
    """The order the converged results need: the SP baseline first, then every NMT column, then the SP ones."""
    queue = _array("converged_on_cpu.sh", "QUEUE")
    first_sp = min(i for i, e in enumerate(queue[1:], 1) if any(c.table.endswith("-sp") for c in _selected(e)))
    assert {c.table for c in _selected(queue[0])} == {"t1-sp"}
    for entry in queue[1:first_sp]:
        assert all(not c.table.endswith("-sp") for c in _selected(entry)), entry
    assert any(e.startswith("ika-translation") for e in queue[1:first_sp])
    assert all(c.table.endswith("-sp") for e in queue[first_sp:] for c in _selected(e))


def test_the_cpu_queue_runs_the_sp_cells_with_finished_partners_before_table_2s_symmetric_column():
    """Table 3's and Table 4's SP cells and Table 2's asymmetric SP column pair with Table 1's cells; Table 2's
    symmetric column pairs with its own exponential row, still to train, so it comes after them."""
    queue = _array("converged_on_cpu.sh", "QUEUE")
    first_sym = min(i for i, e in enumerate(queue) if any(c.col == "sp-sym" for c in _selected(e)))
    before = {c.id for e in queue[:first_sym] for c in _selected(e)}
    for name in ("dissection-order", "dissection-values", "dissection-kernels"):
        cells, _ = get_study(name).cells(StudyOptions(scale="converged"))
        paired = [c.id for c in cells if c.table.endswith("-sp") and c.col != "sp-sym"]
        assert paired and not set(paired) - before, f"{name}: {sorted(set(paired) - before)[:3]}"


def test_the_gpu_window_defaults_name_sp_cells():
    """The window's default sets are SP columns: an NMT cell outlasts a window (and the TD NMT columns train on
    from last.pt files that only the CPU machine holds)."""
    for entry in _array("study_on_gpu.sh", "SETS"):
        cells = _selected(entry)
        assert cells, entry
        assert all(c.table.endswith("-sp") for c in cells), entry
        assert entry.rpartition("@")[2].isdigit(), f"{entry}: no process count"


def _cell(folder: Path, status: str | None = None, **files: str) -> Path:
    folder.mkdir(parents=True)
    if status is not None:
        (folder / "result.json").write_text(f'{{"status": "{status}", "test": 1.0}}')
    for name, text in files.items():
        (folder / name.replace("_", ".")).write_text(text)
    return folder


def test_import_cells_brings_finished_cells_and_leaves_the_rest(tmp_path):
    """A window's studies folder, tarred: finished cells come in with their logs, a failed one does not, a cell
    finished here is not overwritten, and a cell started here keeps its checkpoint aside."""
    if shutil.which("bash") is None or shutil.which("flock") is None or shutil.which("tar") is None:
        pytest.skip("needs bash, flock and tar")
    there = tmp_path / "there" / "studies" / "dissection-positions-converged" / "cells"
    _cell(there / "a", "ok", metrics_jsonl="there", config_yaml="cfg")
    _cell(there / "b", "error", metrics_jsonl="there")
    _cell(there / "c", "ok", metrics_jsonl="there")
    _cell(there / "d", "ok", metrics_jsonl="there")
    _cell(there / "e", None, metrics_jsonl="unfinished")
    _cell(there / "f", "ok", metrics_jsonl="there")
    here = tmp_path / "here" / "dissection-positions-converged" / "cells"
    _cell(here / "c", "ok", metrics_jsonl="here")
    _cell(here / "d", None, metrics_jsonl="here", last_pt="checkpoint")
    lock = open(_cell(here / "f", None, metrics_jsonl="here") / "running.lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)   # a process here is training f
    subprocess.run(["tar", "czf", str(tmp_path / "studies.tar.gz"), "-C", str(tmp_path / "there"), "studies"],
                   check=True)
    out = subprocess.run(["bash", str(SCRIPTS / "import_cells.sh"), str(tmp_path / "studies.tar.gz")],
                         env={"OUT": str(tmp_path / "here"), "KA": "true", "PYTHON": sys.executable,
                              "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, check=True).stdout
    lock.close()
    assert (here / "a" / "metrics.jsonl").read_text() == "there" and (here / "a" / "config.yaml").exists()
    assert not (here / "b").exists() and not (here / "e").exists()
    assert (here / "c" / "metrics.jsonl").read_text() == "here"
    assert (here / "d" / "metrics.jsonl").read_text() == "there" and (here / "d" / "result.json").exists()
    assert (here / "d" / "last.pt.replaced").read_text() == "checkpoint" and not (here / "d" / "last.pt").exists()
    assert "dissection-positions-converged/a: imported" in out and "c: finished here already" in out
    assert "b: did not finish ok there, not imported" in out
    assert (here / "f" / "metrics.jsonl").read_text() == "here" and "f: being trained here" in out


def test_publish_converged_puts_the_figures_drawn_here_and_keeps_those_drawn_where_cells_trained(tmp_path):
    """A curves figure drawn here replaces the committed one; where a variant of its table has imported cells
    without curves only, the committed figure (drawn where they trained, with their curve) moves aside to
    ``curves_<table>_where-trained.png`` once, and goes when every variant has curves here.  A committed figure not
    drawn here (an attention map, from checkpoints elsewhere) stays."""
    if shutil.which("bash") is None:
        pytest.skip("needs bash")
    (tmp_path / "scripts").mkdir()
    shutil.copy(SCRIPTS / "publish_converged.sh", tmp_path / "scripts")
    sets = tmp_path / "docs" / "results"
    committed = sets / "toy-converged"
    committed.mkdir(parents=True)
    (sets / "sections.yaml").write_text("- set: toy-converged\n")
    (committed / "prose.md").write_text("prose")
    for name in ("curves_t1.png", "curves_t2.png", "fig2_heads.png"):
        (committed / name).write_text("committed")
    study = tmp_path / "studies" / "toy-converged"
    _cell(study / "cells" / "t1__a__c__s1", "ok", metrics_jsonl="{}")
    _cell(study / "cells" / "t2__a__c__s1", "ok", metrics_jsonl="{}")
    imported = _cell(study / "cells" / "t2__b__c__s1")
    (imported / "result.json").write_text('{"status": "ok", "imported_from": "x"}')
    (study / "figures").mkdir()
    (study / "runs.csv").write_text("runs")
    (study / "curves.csv").write_text("curves")

    def publish(drawn: str) -> str:
        for name in ("curves_t1.png", "curves_t2.png"):
            (study / "figures" / name).write_text(drawn)
        return subprocess.run(["bash", str(tmp_path / "scripts" / "publish_converged.sh"), "toy"],
                              env={"OUT": str(tmp_path / "studies"), "KA": "true", "PATH": "/usr/bin:/bin"},
                              cwd=tmp_path, capture_output=True, text=True, check=True).stdout

    out = publish("drawn here")
    assert (committed / "runs.csv").read_text() == "runs" and (committed / "curves.csv").read_text() == "curves"
    assert (committed / "curves_t1.png").read_text() == "drawn here"
    assert not (committed / f"curves_t1{WHERE_TRAINED}").exists()  # the ending the page captions
    assert (committed / "curves_t2.png").read_text() == "drawn here"
    assert (committed / f"curves_t2{WHERE_TRAINED}").read_text() == "committed" and "curves_t2.png to" in out
    assert (committed / "fig2_heads.png").read_text() == "committed" and "fig2_heads.png: not drawn here" in out
    publish("drawn again")  # the figure moved aside stays as it is
    assert (committed / "curves_t2.png").read_text() == "drawn again"
    assert (committed / f"curves_t2{WHERE_TRAINED}").read_text() == "committed"
    (imported / "metrics.jsonl").write_text("{}")  # every variant of t2 has its curves here now
    publish("complete")
    assert (committed / "curves_t2.png").read_text() == "complete"
    assert not (committed / f"curves_t2{WHERE_TRAINED}").exists()


def test_a_walk_of_the_cpu_queue_ends_where_a_study_was_stopped_by_a_signal(tmp_path):
    """A study process that a SIGTERM stopped (exit 128 + 15) ends its walk of the queue: the next set is not
    started; the script still collects every study at the end."""
    if shutil.which("bash") is None:
        pytest.skip("needs bash")
    (tmp_path / "scripts").mkdir()
    shutil.copy(SCRIPTS / "converged_on_cpu.sh", tmp_path / "scripts")
    ka = tmp_path / "ka"
    ka.write_text('#!/bin/bash\necho "$*" >> "$(dirname "$0")/calls"\n'
                  'case "$*" in *--no-figures*) [ "$(grep -c -- --no-figures "$(dirname "$0")/calls")" = 1 ] '
                  '&& exit 143;; esac\nexit 0\n')  # the first study the walk starts stops as on a SIGTERM
    ka.chmod(0o755)
    subprocess.run(["bash", str(tmp_path / "scripts" / "converged_on_cpu.sh")],
                   env={"PROCS": "1", "KA": str(ka), "OUT": str(tmp_path / "studies"), "PATH": "/usr/bin:/bin"},
                   cwd=tmp_path, capture_output=True, text=True, check=True)
    calls = (tmp_path / "calls").read_text().splitlines()
    trained = [c for c in calls if "--no-figures" in c]
    assert len(trained) == 1 and trained[0].startswith("study dissection-positions"), calls
    assert len([c for c in calls if "--collect-only" in c]) == len(CONVERGED), calls
    log = (tmp_path / "studies" / "logs" / "queue.1.log").read_text()
    assert "walk stopped: dissection-positions exited 143" in log
