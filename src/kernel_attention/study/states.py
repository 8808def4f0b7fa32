"""Where each cell of a study stands in an output folder, read without running anything (a cell's lock is
only tried and let go, as the runner tries it, to tell a cell another process is training).

    kernel-attention study ika-regression --scale paper --seeds 10 --out studies --list

One :class:`CellState` per cell of the grid (``--only`` applies), in the grid's order:

- ``finished``: ``result.json`` with the current configuration; ``status`` ("ok", "diverged", "error"), the
  test score, and the twin it was carried from (``same_config_as``, :mod:`.twins`) if any;
- ``stale``: finished with another configuration (:mod:`.runner`): left out of the table, ``--rerun-stale``
  runs it; a record carried from a twin is carried again once a twin has finished with the grid's
  configuration; one that a larger ``train.max_steps`` continues (:mod:`.extend`) is ``running`` or ``started``
  instead (it trains on from its ``last.pt``), or ``finished`` (early stopping had ended it: it is re-keyed);
- ``running``: another process holds the cell's lock; ``detail`` gives its last logged step of the planned
  steps, its training time and, at its pace so far (validation included), about how long it has left;
- ``started``: a run began and did not finish; ``detail`` gives the same for its last logged step (a
  resume goes back to the step of ``last.pt``, at most ``train.checkpoint_minutes`` earlier), and whether a
  ``last.pt`` is there to resume from (without one the next run starts over);
- ``to run``: nothing yet (a cell whose twin has finished is carried over when a run or ``--collect-only``
  reaches it, :mod:`.twins`); ``detail`` names its twins in this study and in the other studies at this
  scale (the first of them to run trains, the others take its result), and the count line says how
  many have one.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from kernel_attention.study.core import STUDIES, Cell, Study, StudyOptions
from kernel_attention.study.extend import extension
from kernel_attention.study.locks import running_elsewhere
from kernel_attention.study.runner import cell_dir, format_duration, is_stale, select_cells
from kernel_attention.training.run_log import read_metrics

__all__ = ["CellState", "cell_states", "format_states"]

STATES = ("finished", "stale", "running", "started", "to run")


@dataclasses.dataclass(frozen=True)
class CellState:
    cell: Cell
    state: str  # one of STATES
    detail: str = ""


def _state(c: Cell, d: Path) -> CellState:
    res = d / "result.json"
    if res.is_file():
        rec = json.loads(res.read_text())
        stale = is_stale(rec, d, c)  # a legacy record gets its key from the folder's config.yaml here
        how = extension(c, d, rec) if stale else None
        if how == "train":
            rows = read_metrics(d)
            where = _how_far(rows) if rows else "no log"
            limit = f"train.max_steps = {c.config['train']['max_steps']}"
            if running_elsewhere(d):
                return CellState(c, "running", f"{where}; trains on to {limit}")
            return CellState(c, "started", f"{where}; trains on from last.pt to {limit}")
        if stale and how is None and rec.get("same_config_as"):
            return CellState(c, "stale", f"carried from {rec['same_config_as']} with configuration {rec['config']}, "
                                         f"the grid's is {c.key}: carried again once a twin has finished with it")
        if stale and how is None:
            return CellState(c, "stale", f"ran with configuration {rec['config']}, the grid's is {c.key}")
        test = rec.get("test")
        detail = f"{rec.get('status')}, test {test:.6g}" if isinstance(test, (int, float)) else f"{rec.get('status')}"
        if how == "rekey":
            detail += ", early stopping ended it before the larger train.max_steps (re-keyed on the next run)"
        if rec.get("same_config_as"):
            detail += f", carried from {rec['same_config_as']}"
        elif rec.get("error"):
            detail += f": {str(rec['error'])[:80]}"
        return CellState(c, "finished", detail)
    rows = read_metrics(d)
    if running_elsewhere(d):
        return CellState(c, "running", _how_far(rows) if rows else "nothing logged yet")
    if rows or (d / "last.pt").is_file():
        where = _how_far(rows) if rows else "no log"
        resume = "resumes from last.pt" if (d / "last.pt").is_file() else "no last.pt: starts over"
        return CellState(c, "started", f"{where}; {resume}")
    return CellState(c, "to run")


def _how_far(rows: list[dict]) -> str:
    """``logged to step S of N (T s; about L left)`` from a run's metrics records: N from the last train
    record that names ``planned_steps`` (older logs do not: then no N and no L), L at the pace T / S."""
    step, wall = rows[-1].get("step"), rows[-1].get("wall_s", 0)
    planned = next((r["planned_steps"] for r in reversed(rows) if r.get("planned_steps")), None)
    if not planned or not step:
        return f"logged to step {step} ({wall:.0f} s)"
    left = wall / step * max(planned - step, 0)
    return f"logged to step {step} of {planned} ({wall:.0f} s; about {format_duration(left)} left)"


def cell_states(study: Study, options: StudyOptions, out: str | Path) -> list[CellState]:
    """The state of each cell of ``study`` (``options`` as for a run) under ``out``."""
    grid = study.cells(options)[0]
    twins = _twins(study, grid, options)
    states = [_state(c, cell_dir(out, study, c)) for c in select_cells(grid, options.only, study.name)]
    return [CellState(s.cell, s.state, f"same configuration as {', '.join(twins[s.cell.id])}")
            if s.state == "to run" and twins.get(s.cell.id) else s for s in states]


def _twins(study: Study, grid: list[Cell], options: StudyOptions) -> dict[str, list[str]]:
    """For each cell of ``grid``, its twins: the other cells of the grid with its configuration key, then
    ``<study>/<cell>`` of the other registered studies' grids at the same scale (:mod:`.twins`)."""
    by_key: dict[str, list[str]] = {}
    for c in grid:
        by_key.setdefault(c.key, []).append(c.id)
    for name, other in sorted(STUDIES.items()):
        if name == study.name or options.scale not in other.default_seeds:
            continue
        for c in other.cells(dataclasses.replace(options, only=()))[0]:
            if c.key in by_key:
                by_key[c.key].append(f"{name}/{c.id}")
    return {c.id: [t for t in by_key[c.key] if t != c.id] for c in grid}


def format_states(states: list[CellState]) -> str:
    """One line per cell, then the count of each state (and of the cells to run that have a twin)."""
    width = max((len(s.cell.id) for s in states), default=0)
    lines = [f"{s.cell.id:{width}s}  {s.state:8s}  {s.detail}".rstrip() for s in states]
    counts = {k: sum(s.state == k for s in states) for k in STATES}
    twinned = sum(s.state == "to run" and s.detail.startswith("same configuration as") for s in states)
    lines.append(f"{len(states)} cells: " + ", ".join(f"{n} {k}" for k, n in counts.items() if n)
                 + (f" ({twinned} of them sharing their configuration with another cell: it trains once)"
                    if twinned else ""))
    return "\n".join(lines)
