"""``kernel-attention study NAME --list``: where each cell of a grid stands, read without running anything."""

import json

from kernel_attention.cli import main
from kernel_attention.study import StudyOptions, execute, get_study
from kernel_attention.study.runner import cell_dir, cell_lock
from kernel_attention.study.states import cell_states, format_states


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
    assert states[exp2.id].detail.startswith("logged to step 3 (")  # the kill came after step 3
    assert states[exp2.id].detail.endswith("; resumes from last.pt")
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
