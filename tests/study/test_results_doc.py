"""docs/results.md is generated from the result sets' runs.csv and prose (``kernel-attention study report``):
the committed page is the generated one, any change to a CSV changes it, ``--check`` catches an edited page,
and the paired differences and marks it shows are those computed by hand on tiny inputs."""

import csv
import functools
import math
import re
import shutil
from pathlib import Path

import pytest

from kernel_attention.cli import main
from kernel_attention.study import StudyOptions, get_study, study_names
from kernel_attention.study.findings import COMPARISONS, FINDINGS, Comparison, paper_direction
from kernel_attention.study.placeholders import PlaceholderError, fill
from kernel_attention.study.report import CSV_FIELDS, read_csv, render_tables, write_csv
from kernel_attention.study.results_page import render_page, write_page
from kernel_attention.study.resultset import load_manifest
from kernel_attention.study.revision import code_revision
from kernel_attention.study.significance import mark, paired_difference, paired_machines

DOCS = Path(__file__).resolve().parents[2] / "docs"
RESULTS = DOCS / "results"
CSVS = sorted(RESULTS.glob("*/runs.csv"))


@pytest.fixture(scope="module")
def page() -> str:
    return render_page(RESULTS)


def test_the_committed_page_is_the_generated_one(tmp_path, page):
    written = write_page(RESULTS, tmp_path / "results.md")
    assert written.read_bytes() == (DOCS / "results.md").read_bytes(), \
        "docs/results.md is not the generated page: run `kernel-attention study report`"
    assert page == written.read_text()


def _copy_results(tmp_path: Path) -> Path:
    """docs/results without the figures' bytes (the page names the PNG files, it does not read them)."""
    dst = tmp_path / "results"
    shutil.copytree(RESULTS, dst, ignore=shutil.ignore_patterns("*.png"))
    for png in RESULTS.glob("*/*.png"):
        (dst / png.parent.name / png.name).touch()
    return dst


def _edit_rows(path: Path, edit) -> None:
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    rows = edit(rows)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        w.writerows(rows)


def _one_number(rows):
    rows[0]["test"] = str(float(rows[0]["test"]) * 0.9)
    return rows


def _add_row(rows):
    return rows + [{**rows[0], "seed": "6", "cell": rows[0]["cell"].replace("__s1", "__s6")}]


@pytest.mark.parametrize("edit", [_one_number, _add_row, lambda rows: rows[1:]],
                         ids=["one number", "a row added", "a row removed"])
def test_a_changed_csv_changes_the_page(tmp_path, page, edit):
    """The equality test above would fail on a CSV edited but not regenerated (the page's copy being the
    committed one, the numbers of a set's rows all reach it)."""
    root = _copy_results(tmp_path)
    assert render_page(root) == page  # the copy alone changes nothing
    _edit_rows(root / "dissection-positions" / "runs.csv", edit)
    assert render_page(root) != page


def test_check_fails_on_an_edited_page_and_passes_on_the_committed_one(tmp_path, capsys):
    copy = tmp_path / "results.md"
    copy.write_text((DOCS / "results.md").read_text())
    args = ["study", "report", "--check", "--results", str(RESULTS), "--page", str(copy)]
    assert main(args) == 0
    text = copy.read_text()
    number = re.search(r"\| (\d+\.\d\d) \|", text)  # the first shown value of a table
    copy.write_text(text[:number.start(1)] + "99.99" + text[number.end(1):])
    capsys.readouterr()
    assert main(args) == 1
    diff, err = capsys.readouterr()
    assert f"`kernel-attention study report --results {RESULTS} --page {copy}` writes it" in err
    assert diff.startswith("---") and "-" + text.splitlines()[text[:number.start()].count("\n")].replace(
        number.group(1), "99.99", 1) in diff.splitlines()


def test_report_writes_the_page(tmp_path):
    assert main(["study", "report", "--results", str(RESULTS), "--page", str(tmp_path / "p.md")]) == 0
    assert (tmp_path / "p.md").read_text() == (DOCS / "results.md").read_text()


def test_report_is_no_study_name():
    assert "report" not in study_names()


def test_report_outside_the_repository_names_the_folder_it_looks_for(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["study", "report"]) == 2
    assert "docs/results is no folder of result sets (run it from the repository's root, or name the folder with " \
           "--results)" in capsys.readouterr().err


# ---- paired differences and marks, by hand -----------------------------------------------------------------

def _p_two_dof(t: float) -> float:
    """The two-sided p of Student's t with 2 degrees of freedom, in closed form: 1 - |t| / sqrt(t^2 + 2)."""
    return 1.0 - abs(t) / math.sqrt(t * t + 2.0)


def test_holds():
    # d = 2, 3, 2: mean 7/3, std sqrt(1/3), t = 7; seed 4 has no pair and is left out
    p = paired_difference({1: 10.0, 2: 12.0, 3: 11.0, 4: 50.0}, {1: 8.0, 2: 9.0, 3: 9.0}, higher_is_better=True)
    assert p.n == 3 and p.mean == pytest.approx(7 / 3) and p.std == pytest.approx(math.sqrt(1 / 3))
    assert p.p == pytest.approx(_p_two_dof(7.0)) and p.p < 0.05
    assert mark(p, +1) == "holds"
    assert p.text(2) == "+2.33 ± 0.58 (n = 3, p = 0.02)"


def test_reversed_with_lower_is_better():
    # perplexities 10, 11, 10 above the baseline's: d = -10, -11, -10 (oriented), t = -31
    p = paired_difference({1: 110.0, 2: 113.0, 3: 111.0}, {1: 100.0, 2: 102.0, 3: 101.0}, higher_is_better=False)
    assert p.mean == pytest.approx(-31 / 3) and p.p == pytest.approx(_p_two_dof(31.0))
    assert mark(p, +1) == "reversed" and mark(p, -1) == "holds" and mark(p, 0) == "differs"


def test_within_noise():
    # d = 1, -1, 2: mean 2/3, std sqrt(7/3), t = (2/3) / sqrt(7/9)
    p = paired_difference({1: 1.0, 2: -1.0, 3: 2.0}, {1: 0.0, 2: 0.0, 3: 0.0}, higher_is_better=True)
    t = (2 / 3) / math.sqrt(7 / 9)
    assert p.std == pytest.approx(math.sqrt(7 / 3)) and p.p == pytest.approx(_p_two_dof(t))
    assert mark(p, +1) == "within noise" and mark(p, -1) == "within noise"


def test_one_seed_has_no_test():
    p = paired_difference({0: 77.0}, {0: 75.0}, higher_is_better=True)
    assert (p.n, p.mean, p.std, p.p) == (1, 2.0, None, None)
    assert mark(p, +1) == "one seed, no test" and p.text(2) == "+2.00 (n = 1)"
    none = paired_difference({0: 1.0}, {1: 1.0}, True)
    assert none.n == 0 and mark(none, +1) == "not run" and none.text(2) == ""


def test_pairs_across_machines_are_counted_and_said():
    """A pair counts as across machines where both runs name a machine and the two differ; a run that names none
    (rows from before the column) counts for neither; the mark does not change."""
    values = ({1: 10.0, 2: 12.0, 3: 11.0}, {1: 8.0, 2: 9.0, 3: 9.0})
    cpu, gpu = "AMD EPYC (AVX512), torch 2.13.0+cpu", "Intel Xeon, torch 2.11.0+cu130, GPU NVIDIA H100 80GB HBM3"
    machines = ({1: gpu, 2: gpu, 3: cpu}, {1: cpu, 2: cpu, 3: cpu})
    p = paired_difference(*values, True, machines)
    assert p.across == 2 and mark(p, +1) == mark(paired_difference(*values, True), +1) == "holds"
    assert p.text(2) == "+2.33 ± 0.58 (n = 3, p = 0.02, 2 pairs across machines)"
    assert paired_difference(*values, True, ({1: gpu}, {})).across == 0
    one = paired_difference({0: 77.0}, {0: 75.0}, True, ({0: gpu}, {0: cpu}))
    assert one.text(2) == "+2.00 (n = 1, 1 pair across machines)"
    rows = [{"seed": "1", "status": "ok", "valid": "1.0", "test": "1.0", "machine": cpu},
            {"seed": "2", "status": "ok", "valid": "2.0", "test": "2.0"},
            {"seed": "3", "status": "error", "valid": None, "test": None, "machine": gpu}]
    assert paired_machines(rows) == {1: cpu}


def test_identical_models_are_within_noise():
    p = paired_difference({1: 3.0, 2: 4.0}, {1: 3.0, 2: 4.0}, True)
    assert p.std == 0.0 and p.p == 1.0 and mark(p, +1) == "within noise"


def test_paper_direction_reads_the_papers_numbers():
    t2 = get_study("dissection-kernels").table("t2-sp")
    assert paper_direction(t2, Comparison("dissection-kernels", "t2-sp", "sp-asym", "poly", "exp", "")) == -1
    assert paper_direction(t2, Comparison("dissection-kernels", "t2-sp", "sp-asym", "linear", "exp", "")) == -1
    assert paper_direction(t2, Comparison("dissection-kernels", "t2-sp", "sp-sym", "exp", "exp", "",
                                          "sp-asym")) == +1  # 24.01 < 24.10 ppl
    t3 = get_study("ika-regression").table("t4")
    assert paper_direction(t3, Comparison("ika-regression", "t4", "co2", "gp_sm", "transformer", "")) == 0


def test_every_comparison_names_a_finding_and_cells_of_its_table():
    ids = {f.id for f in FINDINGS}
    for c in COMPARISONS:
        t = get_study(c.study).table(c.table)
        assert c.finding in ids
        assert {c.row, c.baseline} <= set(dict(t.rows)) and {c.col, c.base_col} <= set(dict(t.cols))
        assert paper_direction(t, c) is not None, c
    assert ids == {c.finding for c in COMPARISONS}


# ---- placeholders, sets, converged scale -------------------------------------------------------------------

def test_placeholders_fill_from_the_csv_and_refuse_unknown_ones():
    man = load_manifest(RESULTS)
    text = fill("{{ dissection-positions / t1-sp / vaswani / sp }} {{ seeds dissection-positions }}", man)
    study = get_study("dissection-positions")
    runs = [r for r in read_csv(RESULTS / "dissection-positions" / "runs.csv") if r["table"] == "t1-sp"
            and r["row"] == "vaswani"]
    assert text.split()[0] in render_tables(study, runs, [], "small") and text.split()[1] == "1-5"
    # the model size, from the CSV's params column (a model built from the cell's config counts the same)
    cls = [r for r in read_csv(RESULTS / "ika-classification-paper" / "runs.csv")
           if (r["row"], r["col"]) == ("transformer", "cr")]
    assert fill("{{ params ika-classification-paper / t2 / transformer / cr }}", man) == \
        f"{cls[0]['params'] / 1e6:.1f}M" == "8.9M"
    for bad in ("{{ nonsense }}", "{{ dissection-positions / t1-sp / nobody / sp }}", "{{ wall no-such-set }}",
                "{{ diff dissection-positions / t1-sp / xl / sp }}",
                "{{ params dissection-positions / t1-sp / vaswani / sp }}"):   # no params recorded there
        with pytest.raises(PlaceholderError):
            fill(bad, man)


def _tiny_set(root: Path, name: str, scale: str, seeds: int, better: float) -> None:
    """A TD Table 1 set: Vaswani and Shaw on SP, ``seeds`` seeds, Shaw ``better`` ppl under Vaswani (+ noise)."""
    study = get_study("dissection-positions")
    rows = []
    for s in range(1, seeds + 1):
        for row, ppl in (("vaswani", 100.0 + s), ("shaw", 100.0 + s - better + 0.1 * (s % 2))):
            rows.append({"scale": scale, "table": "t1-sp", "row": row, "col": "sp", "seed": s, "status": "ok",
                         "metric": "ppl", "valid": ppl, "test": ppl, "wall_s": 60.0,
                         "cell": f"t1-sp__{row}__sp__s{s}", "command": f"kernel-attention study {study.name} "
                         f"--scale {scale} --seeds {seeds}", "revision": "abc1234"})
    (root / name).mkdir(parents=True)
    write_csv(root / name / "runs.csv", study, rows)
    (root / name / "prose.md").write_text(f"Wall {{{{ wall {name} }}}}.\n")


def _one_converged_set(tmp_path: Path, better: float) -> Path:
    """A results folder whose page is one converged set made by :func:`_tiny_set`, ``positions-converged``."""
    root = tmp_path / "results"
    _tiny_set(root, "positions-converged", "converged", 3, better=better)
    (root / "intro.md").write_text("intro\n")
    (root / "sections.yaml").write_text(
        "intro: intro.md\nsections:\n"
        "  - {set: positions-converged, title: converged, prose: positions-converged/prose.md}\n")
    return root


def test_the_scale_changes_come_from_the_code_for_rows_run_with_the_current_configuration(tmp_path):
    root = _one_converged_set(tmp_path, better=-5.0)
    study = get_study("dissection-positions")
    cells, changes = study.cells(StudyOptions(scale="converged", seeds=3))
    key = {c.id: c.key for c in cells}
    path = root / "positions-converged" / "runs.csv"
    rows = read_csv(path)
    for r in rows:
        r["config"] = key[r["cell"]]
    write_csv(path, study, rows)
    text = fill("{{ changes positions-converged }}", load_manifest(root)).splitlines()
    assert all(line.startswith("- ") for line in text) and len(text) == 4  # NMT data, NMT's settings, SP's
    nmt = [c.removeprefix("NMT: ") for c in changes if c.startswith("NMT: ")]
    assert any(s.startswith("train.max_steps = ") for s in nmt) and text[1] == "- NMT: " + ", ".join(nmt)
    assert text[0] == f"- {changes[0]}" and text[0].startswith("- NMT data: ")
    rows[0]["wall_s"], rows[1]["wall_s"] = 0.0, 180.0   # carried over; trained in 3 min
    write_csv(path, study, rows)
    assert fill("{{ wall positions-converged / t1-sp }}", load_manifest(root)) == f"{(180 + 4 * 60) / 5 / 60:.1f} min"
    with pytest.raises(PlaceholderError):
        fill("{{ wall positions-converged / t9 }}", load_manifest(root))
    for r in rows:   # cells of one table run on a CPU and on a GPU: one mean per machine
        r["machine"] = "AMD EPYC (AVX512), torch 2.13.0+cpu"
    rows[4]["machine"] = rows[5]["machine"] = "Intel Xeon, torch 2.11.0+cu130, GPU NVIDIA H100 80GB HBM3"
    rows[4]["wall_s"] = rows[5]["wall_s"] = 6.0
    write_csv(path, study, rows)
    assert fill("{{ wall positions-converged / t1-sp }}", load_manifest(root)) == \
        f"{(180 + 2 * 60) / 3 / 60:.1f} min on AMD EPYC (AVX512) and 0.1 min on NVIDIA H100 80GB HBM3 (3 and 2 cells)"
    rows[2]["config"] = "0" * 16   # a row run with an earlier configuration of the scale
    write_csv(path, study, rows)
    with pytest.raises(PlaceholderError, match="1 row.* ran with another configuration"):
        fill("{{ changes positions-converged }}", load_manifest(root))


def test_stops_counts_early_stops_and_step_limits_from_the_rows(tmp_path):
    root = _one_converged_set(tmp_path, better=1.0)
    study = get_study("dissection-positions")
    cells, _ = study.cells(StudyOptions(scale="converged", seeds=3))
    train = {c.id: c.config["train"] for c in cells}
    path = root / "positions-converged" / "runs.csv"
    rows = read_csv(path)
    limit = train[rows[0]["cell"]]["max_steps"]
    for i, r in enumerate(rows):  # rows 0-1 stop early at 2000 and 2500; the others run to the limit
        r["steps"] = (2000, 2500)[i] if i < 2 else limit
        r["best_step"] = r["steps"] - 1500 if i < 2 else (limit if i < 4 else limit - 500)
    rows[-1]["status"] = "diverged"  # not counted: a run that did not finish
    write_csv(path, study, rows)

    def stops() -> str:
        return fill("{{ stops positions-converged / t1-sp }}", load_manifest(root))
    patience = train[rows[0]["cell"]]["patience"]
    assert stops() == (f"2 of 5 stopped early, after 2000-2500 updates, once {patience} validations in a row had "
                       f"not improved; 3 ran to the step limit ({limit} updates), 2 of them with their best "
                       f"validation at the last evaluation")
    for r in rows:
        r["steps"] = limit
    write_csv(path, study, rows)
    assert stops().startswith("all 5 ran to the step limit")
    with pytest.raises(PlaceholderError, match="no finished cell"):
        fill("{{ stops positions-converged / t1-nmt }}", load_manifest(root))


def test_finished_counts_the_cells_of_the_sets_grid_that_have_a_row(tmp_path):
    root = _one_converged_set(tmp_path, better=1.0)
    study = get_study("dissection-positions")
    grid, _ = study.cells(StudyOptions(scale="converged"))
    path = root / "positions-converged" / "runs.csv"
    rows = read_csv(path)

    def finished() -> str:
        return fill("{{ finished positions-converged }}", load_manifest(root))
    assert finished() == f"{len(rows)} of its grid's {len(grid)} cells" and len(rows) < len(grid)
    have = {r["cell"] for r in rows}
    rows += [{**rows[0], "table": c.table, "row": c.row, "col": c.col, "seed": c.seed, "cell": c.id}
             for c in grid if c.id not in have]
    rows.append({**rows[0], "seed": 9, "cell": "t1-sp__vaswani__sp__s9"})  # outside the grid: not counted
    write_csv(path, study, rows)
    assert finished() == f"all {len(grid)} cells of its grid"


def test_the_checklist_prefers_a_converged_set(tmp_path):
    root = tmp_path / "results"
    _tiny_set(root, "positions-small", "small", 1, better=5.0)            # one seed: no test
    _tiny_set(root, "positions-converged", "converged", 3, better=-5.0)   # Shaw worse: reversed
    (root / "intro.md").write_text("Intro.\n")
    (root / "sections.yaml").write_text(
        "intro: intro.md\nsections:\n"
        "  - {set: positions-small, title: small, prose: positions-small/prose.md}\n"
        "  - {set: positions-converged, title: converged, prose: positions-converged/prose.md}\n")
    text = render_page(root)
    line = next(x for x in text.splitlines() if x.startswith("| Positions in a product kernel"))
    assert "`positions-converged` (converged)" in line and "| 0 | 1 | 0 |" in line  # holds, reversed, noise
    assert "one seed, no test" in text and "Wall 2.0 min." in text  # the small set's own section
    # without the converged set the checklist takes the small one
    (root / "sections.yaml").write_text(
        "intro: intro.md\nsections:\n  - {set: positions-small, title: small, prose: positions-small/prose.md}\n")
    line = next(x for x in render_page(root).splitlines() if x.startswith("| Positions in a product kernel"))
    assert "`positions-small` (small)" in line and "1 one seed, no test" in line
    # a converged set of one seed cannot test: a small set that can keeps the mark
    for name in ("positions-small", "positions-converged"):
        shutil.rmtree(root / name)
    _tiny_set(root, "positions-small", "small", 3, better=5.0)            # Shaw better in every seed: holds
    _tiny_set(root, "positions-converged", "converged", 1, better=-5.0)
    (root / "sections.yaml").write_text(
        "intro: intro.md\nsections:\n"
        "  - {set: positions-small, title: small, prose: positions-small/prose.md}\n"
        "  - {set: positions-converged, title: converged, prose: positions-converged/prose.md}\n")
    line = next(x for x in render_page(root).splitlines() if x.startswith("| Positions in a product kernel"))
    assert "`positions-small` (small)" in line and "| 1 | 0 | 0 |" in line


def test_a_set_of_two_scales_is_refused(tmp_path):
    root = tmp_path / "results"
    _tiny_set(root, "mixed", "small", 2, better=1.0)
    _edit_rows(root / "mixed" / "runs.csv", lambda rows: rows[:1] + [{**rows[1], "scale": "converged"}])
    (root / "intro.md").write_text("Intro.\n")
    (root / "sections.yaml").write_text("intro: intro.md\nsections:\n  - {set: mixed, title: m, prose: mixed/prose.md}\n")
    with pytest.raises(ValueError, match="mixes studies / scales"):
        render_page(root)


def test_an_unknown_placeholder_in_prose_is_an_error(tmp_path):
    root = _copy_results(tmp_path)
    (root / "ika-graphs" / "prose.md").write_text("{{ ika-graphs / t5 / gat / pubmedd }}\n")
    with pytest.raises(PlaceholderError, match="pubmedd"):
        render_page(root)


# ---- the CSVs -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", CSVS, ids=[p.parent.name for p in CSVS])
def test_every_row_names_its_command_and_revision(path):
    """A row carried over from a twin of another study (``same_config_as`` = ``<study folder>/<cell>``) keeps the
    command that trained it, that study's."""
    records = read_csv(path)
    for r in records:
        folder = r.get("same_config_as", "").rpartition("/")[0]
        command = r.get("command", "").split()
        assert command[:2] == ["kernel-attention", "study"], r["cell"]
        trained_by = r["study"] if not folder else folder.removesuffix(f"-{r['scale']}")
        assert command[2] == trained_by, r["cell"]
    assert all(re.fullmatch(r"[0-9a-f]{7,}(\+dirty)?", r.get("revision", "")) for r in records)


def test_code_revision_names_the_checkout():
    rev = code_revision()
    assert rev == "" or re.fullmatch(r"[0-9a-f]{7,}(\+dirty)?", rev)
    assert "revision" in CSV_FIELDS


def test_a_cell_record_names_the_revision_that_ran_it(tmp_path):
    from kernel_attention.study.core import Cell
    from kernel_attention.study.runner import run_cell
    rec = run_cell(Cell("s", "t", "r", "c", 1, {"task": {"name": "none"}}), tmp_path / "cell", "loss")  # fails fast
    assert rec["status"] == "error" and rec["revision"] == code_revision()


def test_csv_round_trip_renders_the_same_tables(tmp_path):
    records = read_csv(CSVS[0])
    study = get_study(records[0]["study"])
    again = read_csv(write_csv(tmp_path / "runs.csv", study, records))
    assert render_tables(study, again, [], "small") == render_tables(study, records, [], "small")
    assert isinstance(again[0]["seed"], int) and isinstance(again[0]["test"], float)


def test_a_study_names_the_revision_it_started_with(tmp_path, monkeypatch):
    """The code a study process runs is what it imported: a commit made while its cells train does not
    rename them (the runner reads the revision before its first cell; the answer is cached)."""
    from kernel_attention.study import StudyOptions, execute, runner

    checkout = {"head": "1111111"}
    monkeypatch.setattr(runner, "code_revision", functools.lru_cache(maxsize=1)(lambda: checkout["head"]))
    train = runner.run_cell

    def run_cell(*args, **kwargs):
        checkout["head"] = "2222222"   # a commit while the cells train
        return train(*args, **kwargs)
    monkeypatch.setattr(runner, "run_cell", run_cell)
    execute("synthetic-smoke", StudyOptions(scale="small", seeds=1), tmp_path, log=lambda m: None, figures=False)
    records = read_csv(tmp_path / "synthetic-smoke" / "runs.csv")
    assert len(records) == 2 and {r["revision"] for r in records} == {"1111111"}


def test_prose_paragraphs_and_list_items_are_reflowed_tables_code_and_commands_kept():
    from kernel_attention.study.results_page import _reflow
    text = ("A paragraph\nbroken where a\nplaceholder was.\nA sentence.\n\n- an item\n  going on\n- `a command`\n"
            "| a | table |\n|---|---|\n\n```\ncode\n  kept\n```\n    indented code")
    assert _reflow(text).split("\n") == [
        "A paragraph broken where a placeholder was.  A sentence.", "", "- an item going on", "- `a command`",
        "| a | table |", "|---|---|", "", "```", "code", "  kept", "```", "    indented code"]


def test_rows_run_to_a_smaller_step_limit_are_named_and_their_stops_read_against_it(tmp_path):
    """A row whose configuration is its cell's but for a smaller train.max_steps (a cell the runner trains on,
    study.extend) is no error: the changes list counts it with its limit, and stops reads its steps against
    that limit; early-stopped rows of that limit too."""
    import dataclasses
    root = _one_converged_set(tmp_path, better=1.0)
    study = get_study("dissection-positions")
    cells = {c.id: c for c in study.cells(StudyOptions(scale="converged", seeds=3))[0]}
    path = root / "positions-converged" / "runs.csv"
    rows = read_csv(path)
    limit = cells[rows[0]["cell"]].config["train"]["max_steps"]
    old = limit // 2

    def key(cell_id: str, steps: int) -> str:
        c = cells[cell_id]
        return dataclasses.replace(c, config={**c.config, "train": {**c.config["train"], "max_steps": steps}}).key
    sp = [r for r in rows if r["table"] == "t1-sp"]
    for i, r in enumerate(rows):  # 3 rows ran to the old limit (one stopped early before it), the others the current
        r["steps"] = (old, old, old - 1000)[i] if i < 3 else limit
        r["best_step"] = r["steps"] if i != 2 else r["steps"] - 1500
        r["config"] = key(r["cell"], old) if i < 3 else cells[r["cell"]].key
    assert all(r in sp for r in rows[:3])
    write_csv(path, study, rows)
    changes = fill("{{ changes positions-converged }}", load_manifest(root)).splitlines()
    assert changes[-1].startswith(f"- 3 of the {len(rows)} rows ran with train.max_steps = {old}, not the limit above")
    assert fill("{{ stops positions-converged / t1-sp }}", load_manifest(root)) == (
        f"1 of {len(sp)} stopped early, after {old - 1000} updates, once 3 validations in a row had not improved; "
        f"{len(sp) - 1} ran to the step limit ({old}-{limit} updates), {len(sp) - 1} of them with their best validation "
        f"at the last evaluation")


def test_the_wall_time_line_names_the_machine_of_the_cells_trained_for_the_set(tmp_path):
    """A cell carried over from a twin that trained on another machine (a GPU) does not make the machine of the
    set's own cells unknown."""
    root = _one_converged_set(tmp_path, better=1.0)
    path = root / "positions-converged" / "runs.csv"
    rows = read_csv(path)
    for r in rows:
        r["machine"] = "AMD EPYC (AVX512), torch 2.13.0+cpu"
    rows[0].update(machine="Intel Xeon, torch 2.11.0+cu130, GPU NVIDIA H100 80GB HBM3", wall_s=0.0,
                   same_config_as="other-converged/t1-sp__vaswani__sp__s1")
    write_csv(path, get_study("dissection-positions"), rows)
    line = next(x for x in render_page(root).splitlines() if x.startswith("Wall time of the cells"))
    assert line.startswith("Wall time of the cells (sum): 5.0 min on AMD EPYC (AVX512), torch 2.13.0+cpu."), line


def test_a_figure_drawn_where_its_cells_trained_follows_the_one_drawn_from_curves_csv_and_says_so(tmp_path):
    root = _one_converged_set(tmp_path, better=1.0)
    for name in ("curves_t1-sp.png", "curves_t1-sp_where-trained.png"):
        (root / "positions-converged" / name).touch()
    lines = render_page(root).splitlines()
    images = [i for i, x in enumerate(lines) if x.startswith("![")]
    assert [lines[i].split("]")[0] for i in images] == ["![positions-converged/curves_t1-sp.png",
                                                        "![positions-converged/curves_t1-sp_where-trained.png"]
    assert lines[images[1] + 2].startswith("The figure above was drawn where its cells trained")
    assert not lines[images[0] + 2].startswith("The figure above")
