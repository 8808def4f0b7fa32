"""A larger ``train.max_steps`` continues finished cells from their ``last.pt`` (the longer run, exactly), keeps
the result of cells that early stopping ended, re-carries their twins, and leaves a change the continuation
cannot reproduce (a schedule that anneals over max_steps) stale."""

import copy
import json

from kernel_attention.study import StudyOptions
from kernel_attention.study.core import Cell, Study, TableSpec
from kernel_attention.study.runner import cell_dir, run_study
from kernel_attention.study.states import cell_states
from kernel_attention.study.smoke import _config


def _cfg(steps: int, lr: float = 3e-3, patience=None, schedule="constant") -> dict:
    cfg = copy.deepcopy(_config("exp", steps))
    cfg["train"].update(eval_every=1, lr=lr, schedule=schedule, **({"patience": patience} if patience else {}))
    return cfg


def _study(steps: int, schedule: str = "constant") -> Study:
    """exp (trains to the limit), a cell whose learning rate is too small to improve (early stopping ends it
    at step 2) and table b's twin of the exp cell."""
    def build(opts):
        return [Cell("ext", "a", "exp", "x", 0, _cfg(steps, schedule=schedule)),
                Cell("ext", "a", "still", "x", 0, _cfg(steps, lr=1e-12, patience=1, schedule=schedule)),
                Cell("ext", "b", "exp", "x", 0, _cfg(steps, schedule=schedule))], []
    tables = [TableSpec(t, t, "exact_match", True, [("exp", "exp"), ("still", "still")], [("x", "x")], {})
              for t in ("a", "b")]
    return Study("ext", "ext", "best_valid", tables, build, {"small": 1, "paper": 1})


def _records(out, study):
    cells = study.build(StudyOptions(scale="small"))[0]
    return {c.id: json.loads((cell_dir(out, study, c) / "result.json").read_text()) for c in cells}


def test_a_larger_step_limit_trains_finished_cells_on_to_the_longer_runs_result(tmp_path):
    opts = StudyOptions(scale="small")
    run_study(_study(2), opts, tmp_path / "out", log=lambda m: None)
    before = _records(tmp_path / "out", _study(2))
    assert before["a__exp__x__s0"]["steps"] == 2 and before["a__still__x__s0"]["steps"] == 2
    assert before["b__exp__x__s0"]["same_config_as"] == "a__exp__x__s0"

    states = {s.cell.id: s for s in cell_states(_study(4), opts, tmp_path / "out")}
    assert states["a__exp__x__s0"].state == "started"
    assert states["a__exp__x__s0"].detail.endswith("trains on from last.pt to train.max_steps = 4")
    assert states["a__still__x__s0"].state == "finished" and "re-keyed on the next run" in states["a__still__x__s0"].detail
    assert states["b__exp__x__s0"].state == "stale"  # carried: it takes its twin's record once that has trained on
    assert states["b__exp__x__s0"].detail.startswith("carried from a__exp__x__s0 with configuration ")
    assert states["b__exp__x__s0"].detail.endswith("carried again once a twin has finished with it")
    logs = []
    _, results, _ = run_study(_study(4), opts, tmp_path / "out", log=logs.append)
    assert any("a__exp__x__s0: train.max_steps is larger than the run's: it trains on from its last.pt" in m
               for m in logs)
    assert any("a__still__x__s0" in m and "its result stands" in m for m in logs)
    assert not any("finished cell(s) ran with another configuration" in m for m in logs)  # none needs --rerun-stale
    waiting = [m for m in logs if "carried from a twin that ran with another configuration" in m]
    assert len(waiting) == 1 and "1 cell(s)" in waiting[0] and "b__exp__x__s0" in waiting[0]
    after = _records(tmp_path / "out", _study(4))
    fresh_out = tmp_path / "fresh"
    run_study(_study(4), opts, fresh_out, log=lambda m: None)
    fresh = _records(fresh_out, _study(4))
    keys = ("steps", "best_step", "valid", "test", "final_valid", "final_test", "status", "config")
    for cid in after:
        assert {k: after[cid][k] for k in keys} == {k: fresh[cid][k] for k in keys}, cid
    assert after["a__exp__x__s0"]["steps"] == 4 and after["a__still__x__s0"]["steps"] == 2
    still = after["a__still__x__s0"]
    assert still == {**before["a__still__x__s0"], "config": still["config"]}  # the record stands, re-keyed
    assert after["b__exp__x__s0"]["same_config_as"] == "a__exp__x__s0"
    assert len(results) == 3


def test_a_limit_the_schedule_anneals_over_is_not_continued(tmp_path):
    opts = StudyOptions(scale="small")
    run_study(_study(2, "cosine"), opts, tmp_path / "out", log=lambda m: None)
    logs = []
    _, results, _ = run_study(_study(4, "cosine"), opts, tmp_path / "out", log=logs.append)
    assert results == [] and any("2 finished cell(s) ran with another configuration" in m for m in logs)
    assert any("1 cell(s) carried from a twin that ran with another configuration" in m for m in logs)
