"""Cells of a study with equal configurations train once: the second carries the first's result.  A result
run with another configuration than its cell's current one (a corrected config) is stale: not read, not
imported."""

import json

from kernel_attention.study import StudyOptions, get_study
from kernel_attention.study.core import Cell, Study, TableSpec
from kernel_attention.study.locks import cell_lock
from kernel_attention.study.runner import cell_dir, run_study
from kernel_attention.study.smoke import _config
from kernel_attention.study.twins import twins_of


def _study() -> Study:
    """Table "a" (exp, rbf) and table "b" whose exp row is a's exp cell again, plus a probed exp cell:
    its probe makes it no twin."""
    def build(opts):
        return [Cell("twins", "a", "exp", "x", 0, _config("exp", 4)),
                Cell("twins", "a", "rbf", "x", 0, _config("rbf", 4)),
                Cell("twins", "b", "exp", "x", 0, _config("exp", 4), {"p": 3.0}),
                Cell("twins", "b", "probed", "x", 0, _config("exp", 4), {"probe": True})], []
    tables = [TableSpec(t, t, "exact_match", True, [("exp", "exp"), ("rbf", "rbf"), ("probed", "probed")],
                        [("x", "x")], {}) for t in ("a", "b")]
    return Study("twins", "twins", "best_valid", tables, build, {"small": 1, "paper": 1})


def test_the_configuration_key_compares_numbers_by_value_and_keeps_probes_apart():
    cfg = {"model": {"attention": {"kernel": {"name": "ikan-direct", "p": 3}}}, "flag": True, "data": {"dataset": "x"}}
    same = {"flag": True, "model": {"attention": {"kernel": {"p": 3.0, "name": "ikan-direct"}}},
            "data": {"dataset": {"name": "x", "root": "/elsewhere"}}}  # where the data are read from is not in it
    assert Cell("s", "t", "r", "c", 0, cfg).key == Cell("s", "u", "q", "c", 1, same).key
    assert Cell("s", "t", "r", "c", 0, {**cfg, "flag": 1}).key != Cell("s", "t", "r", "c", 0, cfg).key
    assert Cell("s", "t", "r", "c", 0, cfg, {"probe": True}).key != Cell("s", "t", "r", "c", 0, cfg).key
    assert Cell("s", "t", "r", "c", 0, {**cfg, "data": {"dataset": "y"}}).key != Cell("s", "t", "r", "c", 0, cfg).key
    cells, _ = get_study("ika-regression").build(StudyOptions(scale="small", seeds=2))
    twins = twins_of(cells)  # Fig. 4's sweep at p = 3 is Table 4's IKAN-direct Housing column, split by split
    assert {k: [t.id for t in v] for k, v in twins.items()} == {
        f"{a}__s{s}": [f"{b}__s{s}"] for s in range(2) for a, b in
        (("t4__ikan_direct__housing", "p-sweep__p=3__housing"), ("p-sweep__p=3__housing", "t4__ikan_direct__housing"))}


def test_an_attention_option_spelled_at_its_default_is_the_same_configuration():
    cfg = {"model": {"encoder_attention": {"position": "shaw"}, "attention": {"kernel": "exp"}}}
    spelled = {"model": {"encoder_attention": {"position": "shaw", "value_position": "none"},
                         "attention": {"kernel": "exp", "value_position": False}}}
    other = {"model": {"encoder_attention": {"position": "shaw", "value_position": "absolute"},
                       "attention": {"kernel": "exp"}}}
    key = Cell("s", "t", "r", "c", 0, cfg).key
    assert Cell("s", "t", "r", "c", 0, spelled).key == key != Cell("s", "t", "r", "c", 0, other).key
    assert spelled["model"]["encoder_attention"]["value_position"] == "none"  # the cell's config is not edited
    # TD Table 4's column II (no positions in the value) is Table 1's row for Shaw, XL and Eq. 9, not Vaswani's
    # (Table 1 adds the PE at the input, so to the value as well)
    for scale in ("small", "converged"):
        t1 = {c.key: c.id for c in get_study("dissection-positions").cells(StudyOptions(scale=scale, seeds=1))[0]}
        t4 = get_study("dissection-values").cells(StudyOptions(scale=scale, seeds=1))[0]
        assert {c.id: t1[c.key] for c in t4 if c.key in t1} == {
            f"t4-{t}__{r}__{t}-II__s1": f"t1-{t}__{r}__{t}__s1" for t in ("sp", "nmt") for r in ("shaw", "xl", "eq9")}
        # Table 2's exp kernel (kernel: exp, symmetric: false spelled) is Table 1's Vaswani (NMT) and XL (SP) row
        t2 = get_study("dissection-kernels").cells(StudyOptions(scale=scale, seeds=1))[0]
        assert {c.id: t1[c.key] for c in t2 if c.key in t1} == {
            "t2-nmt__exp__nmt-asym__s1": "t1-nmt__vaswani__nmt__s1", "t2-sp__exp__sp-asym__s1": "t1-sp__xl__sp__s1"}


def test_a_twin_carries_its_result_and_is_not_trained_again(tmp_path):
    study, opts, out = _study(), StudyOptions(scale="small"), tmp_path / "out"
    cells = {c.id: c for c in study.build(opts)[0]}
    d = {k: cell_dir(out, study, c) for k, c in cells.items()}
    a, b, probed = "a__exp__x__s0", "b__exp__x__s0", "b__probed__x__s0"

    # only b selected, a not finished: b trains itself
    logs = []
    run_study(study, StudyOptions(scale="small", only=("b/exp",)), out, log=logs.append)
    assert (d[b] / "last.pt").is_file() and not (d[a] / "result.json").exists()
    # then a is b's twin: carried over, not trained; the probed cell and rbf train
    logs = []
    _, results, _ = run_study(study, opts, out, log=logs.append)
    assert any(a in m and f"the configuration of {b}, its result carried over" in m for m in logs)
    assert any("4 cells, 2 already finished, 2 to run" in m for m in logs)  # b, and a carried before the list
    assert not (d[a] / "last.pt").exists() and (d[probed] / "last.pt").is_file()
    ra, rb = (json.loads((d[k] / "result.json").read_text()) for k in (a, b))
    assert ra["same_config_as"] == b and "same_config_as" not in rb
    assert (ra["table"], ra["row"], ra["cell"], ra["tags"], ra["wall_s"]) == ("a", "exp", a, {}, 0.0)
    assert {k: v for k, v in ra.items() if k not in ("table", "row", "cell", "tags", "wall_s", "same_config_as")} \
        == {k: v for k, v in rb.items() if k not in ("table", "row", "cell", "tags", "wall_s")}
    assert len(results) == 4

    # a twin that failed is not carried: the cell trains
    (d[a] / "result.json").unlink()
    rb["status"], rb["error"] = "error", "RuntimeError: out of memory"
    (d[b] / "result.json").write_text(json.dumps(rb))
    logs = []
    run_study(study, opts, out, log=logs.append)
    assert not any("carried over" in m for m in logs)
    assert json.loads((d[a] / "result.json").read_text()).get("same_config_as") is None
    assert (d[a] / "last.pt").is_file()


def test_a_cell_whose_twin_runs_elsewhere_waits_for_it(tmp_path):
    """The twin's lock held (by another open file, as another process would): the cell is skipped, and
    collecting after the twin finished carries it over."""
    study, opts, out = _study(), StudyOptions(scale="small"), tmp_path / "out"
    cells = {c.id: c for c in study.build(opts)[0]}
    a, b = "a__exp__x__s0", "b__exp__x__s0"
    da, db = cell_dir(out, study, cells[a]), cell_dir(out, study, cells[b])
    logs = []
    with cell_lock(da) as held:
        assert held
        run_study(study, StudyOptions(scale="small", only=("b",)), out, log=logs.append)
    assert any(b in m and f"its twin {a} (the same configuration) is running in another process" in m for m in logs)
    probed = cell_dir(out, study, cells["b__probed__x__s0"])
    assert not (db / "result.json").exists() and (probed / "result.json").is_file()
    run_study(study, StudyOptions(scale="small", only=("a/exp",)), out, log=lambda m: None)
    logs = []
    run_study(study, opts, out, log=logs.append, run=False)  # collecting only
    assert json.loads((db / "result.json").read_text())["same_config_as"] == a


def test_a_result_of_another_configuration_is_stale(tmp_path):
    """A config corrected after its cells ran: their results are left out of the table, not run over and
    not imported from a runs.csv; a new folder runs them with the current configuration."""
    from kernel_attention.study.carry import import_runs
    from kernel_attention.study.report import read_csv, write_csv

    study, opts, out = _study(), StudyOptions(scale="small", only=("a/rbf",)), tmp_path / "out"
    logs = []
    _, results, _ = run_study(study, opts, out, log=logs.append)
    (cell,) = [c for c in study.build(opts)[0] if c.id == "a__rbf__x__s0"]
    assert len(results) == 1 and results[0]["config"] == cell.key
    write_csv(tmp_path / "runs.csv", study, results)
    assert read_csv(tmp_path / "runs.csv")[0]["config"] == cell.key

    corrected = _study()
    build = corrected.build
    corrected.build = lambda o: ([Cell(c.study, c.table, c.row, c.col, c.seed,
                                       {**c.config, "train": {**c.config["train"], "lr": 1e-3}}, c.tags)
                                  for c in build(o)[0]], [])
    logs = []
    _, results, _ = run_study(corrected, opts, out, log=logs.append)
    assert results == []
    assert any("1 already finished, 0 to run" in m for m in logs)  # not run over: its folder is the old run's
    assert any("1 finished cell(s) ran with another configuration than the current one (a__rbf__x__s0)" in m
               for m in logs)
    # a record written before keys were recorded: the config.yaml of its run tells the configuration
    rec_path = cell_dir(out, corrected, cell) / "result.json"
    legacy = json.loads(rec_path.read_text())
    del legacy["config"]
    rec_path.write_text(json.dumps(legacy))
    assert run_study(corrected, opts, out, log=lambda m: None, run=False)[1] == []
    assert run_study(study, opts, out, log=lambda m: None, run=False)[1][0]["config"] == cell.key
    cells, _ = corrected.build(opts)
    n = import_runs(tmp_path / "runs.csv", corrected, cells, "small", lambda c: tmp_path / "new" / c.id)
    assert n == {"imported": 0, "already_finished": 0, "outside_grid": 0, "other_config": 1}
    _, results, _ = run_study(corrected, opts, tmp_path / "new", log=lambda m: None)
    assert len(results) == 1 and results[0]["config"] != cell.key

    # asked to, the stale cell runs again here, its old folder kept aside
    d = cell_dir(out, corrected, cell)
    logs = []
    _, results, _ = run_study(corrected, opts, out, log=logs.append, rerun_stale=True)
    aside = d.with_name(f"{d.name}.stale-{cell.key}")
    assert any(f"moved to {aside.name}" in m for m in logs) and any("0 already finished, 1 to run" in m for m in logs)
    assert (aside / "result.json").is_file() and (aside / "last.pt").is_file()  # named by the key it ran with
    (now,) = [c for c in cells if c.id == cell.id]
    assert len(results) == 1 and results[0]["config"] == now.key != cell.key


def test_a_cell_of_another_study_with_the_same_configuration_is_carried_over(tmp_path):
    """Studies sharing an output folder (TD Tables 1 and 3 share cells): a finished cell of one is carried into
    the other, named ``<study>/<cell>``, and a cell carried that way passes on the cell that trained."""
    out = tmp_path / "out"
    run_study(_study(), StudyOptions(scale="small", only=("a/exp",)), out, log=lambda m: None)
    trained = "twins/a__exp__x__s0"

    def other(name: str) -> Study:
        def build(opts):
            return [Cell(name, "t", "exp", "x", 0, _config("exp", 4)),
                    Cell(name, "t", "rbf", "x", 0, {**_config("rbf", 4), "seed": 7})], []
        return Study(name, name, "best_valid", [TableSpec("t", "t", "exact_match", True, [("exp", "exp"),
                     ("rbf", "rbf")], [("x", "x")], {})], build, {"small": 1, "paper": 1})

    for name in ("second", "third"):  # third finds the record in twins and the one carried into second
        logs = []
        _, results, _ = run_study(other(name), StudyOptions(scale="small"), out, log=logs.append)
        assert any(f"t__exp__x__s0: the configuration of {trained}, its result carried over" in m for m in logs)
        exp, rbf = (out / name / "cells" / f"t__{r}__x__s0" for r in ("exp", "rbf"))
        assert json.loads((exp / "result.json").read_text())["same_config_as"] == trained
        assert not (exp / "last.pt").exists() and len(results) == 2
        # rbf's seed differs from every cell of twins: second trains it, third carries it from second
        assert (rbf / "last.pt").is_file() == (name == "second")
        assert json.loads((rbf / "result.json").read_text()).get("same_config_as") == \
            (None if name == "second" else "second/t__rbf__x__s0")

    # a record that failed is not carried
    for p in out.glob("*/cells/*exp__x__s0/result.json"):
        p.write_text(json.dumps({**json.loads(p.read_text()), "status": "error"}))
    logs = []
    run_study(other("fourth"), StudyOptions(scale="small", only=("exp",)), out, log=logs.append)
    assert not any("carried over" in m for m in logs)
    assert (out / "fourth" / "cells" / "t__exp__x__s0" / "last.pt").is_file()
