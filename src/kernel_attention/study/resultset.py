"""A study result set (a folder ``docs/results/<set>/``: runs.csv and figures) and the marks of its comparisons.

The results page lists its sets in a manifest, ``docs/results/sections.yaml``::

    intro: intro.md                   # prose above the findings checklist
    outro: not-run.md                 # prose at the end (optional)
    sections:
      - set: dissection-positions     # the folder: runs.csv and the figures (*.png), the set's only copy
        title: "TD Table 1 (positions)"
        prose: dissection-positions/prose.md
        checklist: true               # false: the set does not feed the findings checklist
                                      # (a set of a superseded configuration, say)

The study and scale of a set are read from its runs.csv (columns ``study``, ``scale``), so a new set --
``dissection-positions-converged`` with scale ``converged`` -- needs its folder (a study run's runs.csv and
figures), a prose file (what the set runs, what its scale changes) and one more manifest entry.  The table.md a
study run writes beside runs.csv is not kept: the page renders the tables from runs.csv.
"""

from __future__ import annotations

import dataclasses
from functools import cached_property
from pathlib import Path

import yaml

from kernel_attention.study.core import Study, TableSpec, get_study
from kernel_attention.study.findings import COMPARISONS, Comparison, paper_direction
from kernel_attention.study.report import read_csv, summarize_cell
from kernel_attention.study.significance import Paired, mark, paired_difference, paired_machines, paired_values

__all__ = ["ResultSet", "Marked", "Manifest", "load_manifest", "SCALE_PREFERENCE"]

#: The scale whose marks the checklist takes, first that a study has a set of.
SCALE_PREFERENCE = ("converged", "small", "paper")


@dataclasses.dataclass(frozen=True)
class Marked:
    """One comparison computed on one set: the paper's direction, the paired difference and its mark."""

    comparison: Comparison
    table: TableSpec
    paper: int | None
    paired: Paired
    mark: str


@dataclasses.dataclass
class ResultSet:
    name: str
    folder: Path
    title: str
    prose: Path
    checklist: bool = True

    @cached_property
    def records(self) -> list[dict]:
        path = self.folder / "runs.csv"
        if not path.is_file():
            raise FileNotFoundError(f"result set {self.name}: {path} is missing")
        records = read_csv(path)
        if not records:
            raise ValueError(f"result set {self.name}: {path} has no rows")
        kinds = {(r.get("study"), r.get("scale")) for r in records}
        if len(kinds) > 1:  # one set, one study at one scale: its tables and marks would mix them
            raise ValueError(f"result set {self.name}: {path} mixes studies / scales {sorted(kinds)}")
        return records

    @property
    def study(self) -> Study:
        return get_study(self.records[0]["study"])

    @property
    def scale(self) -> str:
        return self.records[0].get("scale", "")

    def runs(self, table: str, row: str, col: str) -> list[dict]:
        return [r for r in self.records if r["table"] == table and r["row"] == row and r["col"] == col]

    def cell_text(self, table: str, row: str, col: str) -> str:
        """The value the set's table shows for a cell (:func:`.report.summarize_cell`)."""
        return summarize_cell(self.study.protocol, self.study.table(table), self.runs(table, row, col))["text"]

    def paired(self, table: str, row: str, col: str, base_row: str, base_col: str) -> Paired:
        t = self.study.table(table)
        cell, base = self.runs(table, row, col), self.runs(table, base_row, base_col)
        return paired_difference(paired_values(cell, t.scale_factor, t.scaled_units),
                                 paired_values(base, t.scale_factor, t.scaled_units), t.higher_is_better,
                                 (paired_machines(cell), paired_machines(base)))

    @cached_property
    def marked(self) -> list[Marked]:
        """Every comparison of the set's study (:data:`.findings.COMPARISONS`) computed on this set."""
        out = []
        for c in COMPARISONS:
            if c.study != self.study.name:
                continue
            t = self.study.table(c.table)
            direction = paper_direction(t, c)
            p = self.paired(c.table, c.row, c.col, c.baseline, c.base_col)
            out.append(Marked(c, t, direction, p, mark(p, direction or 0)))
        return out

    def figures(self) -> list[Path]:
        return sorted(self.folder.glob("*.png"))


@dataclasses.dataclass
class Manifest:
    root: Path
    intro: Path
    outro: Path | None
    sets: list[ResultSet]

    def get(self, name: str) -> ResultSet:
        for s in self.sets:
            if s.name == name:
                return s
        raise KeyError(f"no result set {name!r} in {self.root / 'sections.yaml'}; sets: "
                       f"{', '.join(s.name for s in self.sets)}")

    def checklist_marks(self, study: str) -> list[tuple[ResultSet, Marked]]:
        """The marks the checklist shows for ``study``'s comparisons: each from the first set (``checklist``
        true) in the order of :data:`SCALE_PREFERENCE`, then of the manifest, on which the comparison is
        tested (two pairs or more), else from the first set that has it at all -- so a converged set that
        holds some seeds yet takes over each comparison as soon as it can test it."""
        mine = [s for scale in SCALE_PREFERENCE for s in self.sets
                if s.checklist and s.study.name == study and s.scale == scale]
        by_set = [(s, {m.comparison: m for m in s.marked}) for s in mine]
        out = []
        for m in mine[0].marked if mine else []:
            options = [(s, marks[m.comparison]) for s, marks in by_set]
            tested = [o for o in options if o[1].paired.n >= 2]
            out.append((tested or options)[0])
        return out


def load_manifest(root: str | Path) -> Manifest:
    """The manifest ``root/sections.yaml`` (module docstring), paths resolved under ``root``."""
    root = Path(root)
    spec = yaml.safe_load((root / "sections.yaml").read_text())
    sets = []
    for s in spec["sections"]:
        unknown = set(s) - {"set", "title", "prose", "checklist"}
        if unknown:
            raise ValueError(f"{root / 'sections.yaml'}: section {s.get('set')}: unknown keys {sorted(unknown)}")
        sets.append(ResultSet(s["set"], root / s["set"], s["title"], root / s["prose"], bool(s.get("checklist", True))))
    names = [s.name for s in sets]
    if len(set(names)) != len(names):
        raise ValueError(f"{root / 'sections.yaml'}: a set is listed twice")
    return Manifest(root, root / spec["intro"], root / spec["outro"] if spec.get("outro") else None, sets)
