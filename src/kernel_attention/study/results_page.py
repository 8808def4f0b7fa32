"""docs/results.md, generated: ``kernel-attention study report`` writes it from the result sets' runs.csv and
one prose file per section (:mod:`.resultset` for the manifest, :mod:`.placeholders` for the numbers in
prose).  ``--check`` renders it and compares it with the page on disk.

    page    = title + intro prose + findings checklist + one section per set (manifest order) + outro prose
    section = heading, its prose (placeholders filled; it says what the scale changes), what
              :func:`.report.render_tables` renders from the CSV (commands, wall time per machine, the
              tables), the revisions of the code that ran the cells, the marks of the study's comparisons
              on this set, the figures
    checklist = per finding (:data:`.findings.FINDINGS`): its comparisons marked on the set of its study that
              :meth:`.resultset.Manifest.checklist_marks` picks (converged scale first, else small)

Figures are linked as ``<results folder name>/<set>/<file>.png``: the page sits beside its results folder
(docs/results.md, docs/results/), wherever the two are written.
"""

from __future__ import annotations

import difflib
import textwrap
from pathlib import Path

from kernel_attention.atomic_write import write_text
from kernel_attention.study.findings import COMPARISONS, FINDINGS, Comparison
from kernel_attention.study.placeholders import fill
from kernel_attention.study.report import render_tables
from kernel_attention.study.resultset import Manifest, Marked, ResultSet, load_manifest
from kernel_attention.study.significance import ALPHA, MARKS

__all__ = ["render_page", "write_page", "check_page"]

TITLE = "# Results: our numbers beside the papers'"
_UNKNOWN_MACHINE = "a machine not recorded (unknown)"
#: how the name of a curves figure drawn where its cells trained ends, once a figure drawn from curves.csv took its
#: place (scripts/publish_converged.sh moves it aside)
WHERE_TRAINED = "_where-trained.png"


def _label(m: Marked) -> str:
    """"Shaw vs Vaswani" (rows) or "RBF: NMT sym vs NMT asym" (columns of one row)."""
    rows, cols, c = dict(m.table.rows), dict(m.table.cols), m.comparison
    if c.base_col != c.col:
        return f"{rows[c.row]}: {cols[c.col]} vs {cols[c.base_col]}"
    return f"{rows[c.row]} vs {rows[c.baseline]}, {cols[c.col]}"


def _pair_text(s: ResultSet, c: Comparison, table) -> tuple[str, str]:
    """(paper, ours): each the cell's value "vs" its baseline's, as the tables show them."""
    paper = f"{table.paper.get((c.row, c.col), '-')} vs {table.paper.get((c.baseline, c.base_col), '-')}"
    ours = f"{s.cell_text(c.table, c.row, c.col)} vs {s.cell_text(c.table, c.baseline, c.base_col)}"
    return paper, ours


def _marks_table(marked: list[tuple[ResultSet, Marked]]) -> list[str]:
    """One line per (set, comparison marked on it): the paper's two numbers, ours, the paired difference, the mark."""
    lines = ["| comparison | paper | ours | paired difference (ours) | mark |", "|---|---|---|---|---|"]
    for s, m in marked:
        paper, ours = _pair_text(s, m.comparison, m.table)
        lines.append(f"| {_label(m)} | {paper} | {ours} | {m.paired.text(m.table.digits) or '-'} | **{m.mark}** |")
    return lines


def _counts(marked: list[Marked]) -> dict[str, int]:
    return {k: sum(m.mark == k for m in marked) for k in MARKS}


def _checklist(man: Manifest) -> list[str]:
    """The findings checklist: a summary table, then each finding's comparisons with their marks."""
    out = ["## Findings checklist", "",
           "Each claim of the papers, tested by the comparisons of table cells it rests on (section \"How the "
           "marks are made\" below).  Each comparison is marked on the converged-scale set of its study where "
           "that set has two seeds or more of both cells, else on the small-scale set; the column \"marks "
           "from\" names the sets and scales.", "",
           "| finding | paper | marks from | holds | reversed | within noise | other |", "|---" * 7 + "|"]
    details = []
    for f in FINDINGS:
        studies = {c.study for c in _comparisons_of(f.id)}
        rows: list[tuple[ResultSet, Marked]] = []
        for study in sorted(studies):
            rows += [(s, m) for s, m in man.checklist_marks(study) if m.comparison.finding == f.id]
        src = ", ".join(sorted({f"`{s.name}` ({s.scale})" for s, _ in rows})) or "no set"
        n = _counts([m for _, m in rows])
        other = ", ".join(f"{v} {k}" for k, v in n.items() if v and k not in ("holds", "reversed", "within noise"))
        claim = f.claim + (" (a claim of equality: \"within noise\" agrees with it)" if f.level else "")
        out.append(f"| {claim} | {f.source} | {src} | {n['holds']} | {n['reversed']} | {n['within noise']} | "
                   f"{other or '-'} |")
        if rows:
            details += ["", f"**{f.source}: {f.claim}** (from {src})", ""] + _marks_table(rows)
    out += ["", "### The comparisons behind each finding"] + details
    return out


def _comparisons_of(finding: str) -> list[Comparison]:
    return [c for c in COMPARISONS if c.finding == finding]


def _method() -> list[str]:
    return ["## How the marks are made", "",
            "Each comparison sets one table cell against a baseline cell of the same table (a row against the "
            "table's baseline row, or one row's column against another) on the runs both have, paired by seed "
            "(TD: the seed; IKA: the fold, split or seed).  Per pair d = ours(cell) - ours(baseline), its sign "
            "flipped for perplexity and RMSE, so that d > 0 means the cell is better; the page gives the mean ± "
            "std of d over the n pairs.  The test is a paired t-test, two-sided at "
            f"{ALPHA:.0%} (`kernel_attention.study.significance`): **holds** where d differs from 0 in the "
            "direction of the paper's own numbers, **reversed** where it differs against it, **within noise** "
            "where it does not differ, **differs** where the paper's two numbers are equal but ours differ; "
            "one pair gives \"one seed, no test\".  The TD tables show the test score of the best-validation seed "
            "(the paper's protocol), the IKA tables the mean ± std; the paired differences use every seed's "
            "test score in both.  Where the two runs of a pair ran on different machines (the `machine` column: "
            "processor, torch build, GPU) the difference says how many pairs did: one configuration and seed "
            "come out differently on two machines, so such pairs carry that difference too "
            "([benchmarks.md](benchmarks.md#cost-of-a-converged-study-cell) measures it for one cell)."]


def _demote(text: str) -> list[str]:
    """render_tables' markdown under a section: its headings two levels down, its title line dropped."""
    lines = text.rstrip("\n").splitlines()
    return ["#" * 2 + line if line.startswith("#") else line for line in lines[1:]]


def _revisions(s: ResultSet) -> list[str]:
    counts: dict[str, int] = {}
    for r in s.records:
        k = r.get("revision") or "unknown"
        counts[k] = counts.get(k, 0) + 1
    listed = ", ".join(f"`{k}` ({n})" for k, n in sorted(counts.items()))
    return ["", "Code revisions (cells per revision; for rows run before the revision was recorded, the commit "
            f"that added the row's result): {listed}."]


def _section(man: Manifest, s: ResultSet) -> list[str]:
    records = s.records
    # the machine of the cells trained for this set: a cell carried over from a twin may have trained on
    # another machine, and it counts no wall time here
    machines = {r.get("machine") or "" for r in records if not r.get("same_config_as")}
    machine = next(iter(machines)) if len(machines) == 1 else ""
    tables = render_tables(s.study, records, [], s.scale, wall_s=sum(float(r.get("wall_s") or 0)
                                                                             for r in records),
                           machine=machine or _UNKNOWN_MACHINE, earlier={"machine": _UNKNOWN_MACHINE})
    out = ["", f"## {s.title}: `{s.name}`", "", _prose(man, s.prose)]
    out += _demote(tables)
    out += _revisions(s)
    run = [m for m in s.marked if m.paired.n]  # a comparison of cells the set did not run has no line here
    if run:
        out += ["", f"#### Paired differences and marks, `{s.name}` ({s.scale} scale)", ""]
        out += _marks_table([(s, m) for m in run])
    for png in s.figures():
        out += ["", f"![{s.name}/{png.name}]({man.root.name}/{s.name}/{png.name})"]
        if png.name.endswith(WHERE_TRAINED):
            out += ["", "The figure above was drawn where its cells trained, from logs that the set's curves.csv does "
                    "not hold: it has the curves of the variants that the figure before it names as not kept."]
    return out


_WIDTH = 120  # the guides' screen width; longer lines of text (a study's notes, say) are wrapped to it
#: lines neither wrapped nor joined: table rows, code, images, headings, code fences, listed commands (a list item
#: that opens with code: a command wrapped inside its backticks would no longer copy as one line)
_KEPT = ("|", "    ", "![", "#", "```", "- `")


def _wrap(lines: list[str]) -> list[str]:
    """Lines of text over :data:`_WIDTH` wrapped (a list item's continuation indented); those :data:`_KEPT`
    names kept whole."""
    out = []
    for line in lines:
        for part in line.split("\n"):
            if len(part) <= _WIDTH or part.startswith(_KEPT):
                out.append(part)
            else:
                out += textwrap.wrap(part, _WIDTH, subsequent_indent="  " if part.startswith("- ") else "",
                                     break_long_words=False, break_on_hyphens=False)
    return out


def _reflow(text: str) -> str:
    """Prose with its placeholders filled, each paragraph and list item joined into one line (so that
    :func:`_wrap` wraps it as a whole, not only the lines a placeholder made long); what :data:`_KEPT` names,
    and the lines between code fences, are left as they are."""
    blocks: list[str] = []
    joinable, fenced = False, False
    for line in text.split("\n"):
        fence = line.startswith("```")
        fenced ^= fence
        if fence or fenced or not line.strip() or line.startswith(_KEPT):
            blocks.append(line)
            joinable = False
        elif joinable and not line.startswith("- "):
            # a sentence that ended the line is followed by two spaces, as in the rest of the prose
            blocks[-1] += ("  " if blocks[-1].endswith((".", "?", "!")) else " ") + line.strip()
        else:
            blocks.append(line)
            joinable = True
    return "\n".join(blocks)


def _prose(man: Manifest, path: Path) -> str:
    """The prose file ``path`` with its placeholders filled and its paragraphs reflowed."""
    return _reflow(fill(path.read_text(), man, str(path)).strip())


def render_page(results: str | Path) -> str:
    """The markdown of the results page from the folder ``results`` (its sections.yaml, module docstring)."""
    man = load_manifest(results)
    out = [TITLE, "", _prose(man, man.intro), ""]
    out += _checklist(man) + [""] + _method()
    for s in man.sets:
        out += _section(man, s)
    if man.outro is not None:
        out += ["", _prose(man, man.outro)]
    return "\n".join(_wrap(out)) + "\n"


def write_page(results: str | Path, page: str | Path) -> Path:
    return write_text(page, render_page(results))


def check_page(results: str | Path, page: str | Path) -> str:
    """"" when ``page`` is the page :func:`render_page` renders, else the unified diff from it to the rendered
    page."""
    page = Path(page)
    have = page.read_text() if page.is_file() else ""
    want = render_page(results)
    if have == want:
        return ""
    return "".join(difflib.unified_diff(have.splitlines(True), want.splitlines(True), f"{page} (on disk)",
                                        f"{page} (generated)"))
