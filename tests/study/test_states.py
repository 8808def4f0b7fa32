"""``kernel-attention study NAME --list``: where each cell of a grid stands, read without running anything."""

import json
import re

from kernel_attention.cli import main
from kernel_attention.study import StudyOptions, execute, get_study
from kernel_attention.study.locks import cell_lock
from kernel_attention.study.runner import cell_dir
from kernel_attention.study.states import _how_far, cell_states, format_states


def test_each_state_of_a_cell_is_told_apart(tmp_path, monkeypatch, capsys):
    out, study = tmp_path / "st", get_study("synthetic-smoke")
    execute(study.name, StudyOptions(scale="small", seeds=1), out, figures=False, log=lambda m: None)
    monkeypatch.setenv("KA_STOP_AFTER", "3")  # seed 2's first cell is killed after step 3 (last.pt: step 2)
    execute(study.name, StudyOptions(scale="small", seeds=2, only=("exp",)), out, figures=False, log=lambda m: None)
    monkeypatch.delenv("KA_STOP_AFTER")
    opts = StudyOptions(scale="small", seeds=2)
    exp1, exp2, rbf1, rbf2 = sorted(study.build(opts)[0], key=lambda c: (c.row, c.seed))
    rec = json.loads((cell_dir(out, study, rbf1) / "result.json").read_text())
    rec["config"] = "0" * 16  # as if rbf's configuration had been corrected since it ran
    (cell_dir(out, study, rbf1) / "result.json").write_text(json.dumps(rec))
    (cell_dir(out, study, exp2) / "result.json").unlink()  # the killed run wrote its (interrupted) record

    with cell_lock(cell_dir(out, study, rbf2)) as held:  # another process training rbf, seed 2
        assert held
        states = {s.cell.id: s for s in cell_states(study, opts, out)}
    assert [states[c.id].state for c in (exp1, exp2, rbf1, rbf2)] == ["finished", "started", "stale", "running"]
    assert states[exp1.id].detail.startswith("ok, test ")
    # the kill came after step 3 of the 6 planned (the smoke study's max_steps)
    assert re.fullmatch(r"logged to step 3 of 6 \(\d+ s; about \d+m\d\ds left\); resumes from last\.pt",
                        states[exp2.id].detail)
    assert states[rbf2.id].detail == "nothing logged yet"
    with cell_lock(cell_dir(out, study, exp2)) as held:  # as if a process were training it now
        assert held
        running = {s.cell.id: s for s in cell_states(study, opts, out)}[exp2.id]
    assert running.state == "running" and running.detail.startswith("logged to step 3 of 6 (")
    assert rbf1.key in states[rbf1.id].detail and "0" * 16 in states[rbf1.id].detail
    after = {s.cell.id: s for s in cell_states(study, opts, out)}
    assert after[rbf2.id].state == "to run"  # the lock went with its holder
    (cell_dir(out, study, exp2) / "last.pt").unlink()
    assert {s.cell.id: s for s in cell_states(study, opts, out)}[exp2.id].detail.endswith("no last.pt: starts over")
    assert format_states(cell_states(study, opts, out)).splitlines()[-1] == \
        "4 cells: 1 finished, 1 stale, 1 started, 1 to run"

    assert main(["study", study.name, "--seeds", "2", "--out", str(out), "--list", "--only", "rbf"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[-1] == "2 cells: 1 stale, 1 to run" and len(printed) == 3
    assert main(["study", study.name, "--out", str(out), "--list", "--only", "nothing"]) == 2
    assert "selects no cell" in capsys.readouterr().err


def test_time_left_is_the_pace_so_far_over_the_planned_steps_and_older_logs_say_only_the_step():
    rows = [{"step": 50, "split": "train", "wall_s": 20.0, "planned_steps": 400},
            {"step": 100, "split": "valid", "wall_s": 50.0}]  # validation records name no plan
    assert _how_far(rows) == "logged to step 100 of 400 (50 s; about 2m30s left)"
    assert _how_far([{"step": 100, "split": "train", "wall_s": 7200.0, "planned_steps": 160}]) == \
        "logged to step 100 of 160 (7200 s; about 1h12m left)"
    assert _how_far([{"step": 100, "split": "train", "wall_s": 50.0}]) == "logged to step 100 (50 s)"


def test_a_cell_to_run_names_its_twins_here_and_in_the_other_studies(tmp_path):
    opts = StudyOptions(scale="converged")
    states = {s.cell.id: s for s in cell_states(get_study("dissection-kernels"), opts, tmp_path)}
    assert states["t2-nmt__exp__nmt-asym__s2"].detail == (
        "same configuration as dissection-positions/t1-nmt__vaswani__nmt__s2, ika-translation/t3__transformer__bleu__s2")
    assert states["t2-nmt__rbf__nmt-asym__s2"].detail == ""
    assert format_states(list(states.values())).splitlines()[-1] == \
        "48 cells: 48 to run (6 of them sharing their configuration with another cell: it trains once)"
