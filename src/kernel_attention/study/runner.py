"""Run a study's cells, each a normal training run in ``OUT/<study>/cells/<cell id>/``, resumable.

    results = run_study(study, options, out="studies")      # prints a progress line per cell

A cell is finished when its ``result.json`` exists; it is skipped on a second invocation.  An unfinished
cell resumes from its ``last.pt`` (the Trainer's exact resume).  ``result.json``::

    {"cell": id, "table", "row", "col", "seed", "status": "ok" | "diverged" | "error", "metric",
     "valid": best validation score, "test": test score of the best-validation checkpoint,
     "final_valid", "final_test", "best_step", "steps", "error": message | null, "tags",
     "wall_s": seconds the cell took, over every invocation that trained it (the time up to the checkpoint
     a resume started from, kept in it as ``elapsed_s``, plus the resuming invocation's),
     "machine": what decides the run's rounding (:func:`kernel_attention.machine.numerics`),
     "command": the command line of the invocation that finished the cell ("" from the Python API),
     "revision": the git revision of the code that ran it (:func:`.revision.code_revision`),
     "config": the cell's configuration key (:attr:`.core.Cell.key`),
     "params": the number of the model's parameters}

A finished cell whose record names another configuration than the grid's -- a config corrected after the cell
ran -- is *stale*: it is neither run over (its folder holds that run's checkpoints, which a resume would
continue) nor read into the table; the runner says which cells are stale.  ``rerun_stale=True``
(``--rerun-stale``) moves each stale folder aside, to ``<cell>.stale-<its key>`` beside it, and runs the cell
with the current configuration.  A record without ``config`` (written before it was recorded) is checked
against the ``config.yaml`` its run wrote into the cell folder; one without either (a row imported from an
older runs.csv) is taken as it is.  A stale cell whose configuration differs only by a larger
``train.max_steps`` is not stale for long: it trains on from its ``last.pt`` to the new limit, or keeps its
result where early stopping had ended it first (:mod:`.extend`).

The same cell run again on the same code and machine gives the same numbers; on another CPU it may not.
So a cell whose configuration equals that of a finished cell of the study (a twin, :mod:`.twins`), or of a
finished cell of another study under the same ``out``, is not trained again: that record is carried over,
``"same_config_as"`` naming its cell.

"diverged": a non-finite training loss or validation score (TD's "not converge"); "error": an exception
(its message is kept; delete the cell folder, or pass ``retry_errors=True``, to run it again).  An
``ImportError`` (a package this machine lacks) is not recorded: it stops the study, and the cell runs once the
package is installed.

Several processes may run one study into the same OUT at once (one per core, say): each trains a cell only while
it holds the cell's lock (:mod:`.locks`), and skips the cells another holds.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from kernel_attention.atomic_write import write_text
from kernel_attention.data.files import MissingDataError
from kernel_attention.machine import numerics
from kernel_attention.study.carry import import_runs
from kernel_attention.study.core import Cell, Study, StudyOptions
from kernel_attention.study.extend import extension, rekey
from kernel_attention.study.locks import cell_lock, running_elsewhere
from kernel_attention.study.revision import code_revision
from kernel_attention.study.twins import finished_elsewhere, finished_twin, other_studies_results, twins_of
from kernel_attention.training.interrupt import stop_if_asked
from kernel_attention.training.run_log import read_metrics
from kernel_attention.training.progress_line import format_duration

__all__ = ["run_cell", "run_study", "read_results", "cell_dir", "select_cells", "is_stale", "format_duration"]


def cell_dir(out: str | Path, study: Study | str, cell: Cell) -> Path:
    """``OUT/<study folder>/cells/<cell id>``: the folder is the study's at the cell's scale
    (:meth:`.core.Study.folder`; ``study`` given by name: that folder)."""
    folder = study if isinstance(study, str) else study.folder(cell.scale)
    return Path(out) / folder / "cells" / cell.id


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(float(x))


def run_cell(cell: Cell, run_dir: Path, metric: str, checkpoint_minutes: float | None = None,
             command: str = "") -> dict[str, Any]:
    """Train one cell (resuming from ``last.pt``) and return its result record.  ``checkpoint_minutes``:
    write ``last.pt`` at least this often instead of the config's ``train.checkpoint_minutes`` (a setting of
    the machine, such as a lease that ends, not of the run: the cell's configuration and key stay).
    ``command``: the invocation's command line, kept in the record so that each row names what ran it."""
    from kernel_attention.config import dump_config
    from kernel_attention.study.probes import ProbedTask
    from kernel_attention.tasks.runner import prepare
    from kernel_attention.training import Trainer

    cfg = copy.deepcopy(cell.config)
    run_dir.mkdir(parents=True, exist_ok=True)
    rec: dict[str, Any] = {"cell": cell.id, "table": cell.table, "row": cell.row, "col": cell.col,
                           "seed": cell.seed, "metric": metric, "tags": cell.tags, "error": None,
                           "config": cell.key}
    t0 = time.time()
    summary: dict[str, Any] = {}
    before = 0.0  # training time of earlier invocations, up to the checkpoint this one resumes from
    try:
        task, train_cfg = prepare(cfg)
        if checkpoint_minutes is not None:
            train_cfg = dataclasses.replace(train_cfg, checkpoint_minutes=checkpoint_minutes)
        if cell.tags.get("probe"):
            task = ProbedTask(task)
        dump_config(cfg, run_dir)
        trainer = Trainer(task, train_cfg, run_dir, resume=True, extra={"config": copy.deepcopy(cfg)})
        before = trainer.resumed_elapsed
        rec["params"] = sum(p.numel() for p in trainer.raw_model.parameters())
        summary = trainer.fit()
    except (ImportError, MissingDataError):  # a package (GPyTorch for the GP rows) or data missing here is the
        raise  # machine's, not the cell's: no record, so that the cell runs once it is installed or placed
    except Exception as e:  # a cell failing must not stop the study; the message goes into the CSV
        rec["error"] = f"{type(e).__name__}: {e}"
        traceback.print_exc(file=sys.stderr)
    rec["wall_s"] = round(before + time.time() - t0, 1)
    rec["machine"] = numerics()
    rec["command"] = command
    rec["revision"] = code_revision()
    rows = read_metrics(run_dir)
    train_losses = [r.get("loss") for r in rows if r.get("split") == "train"]
    valids = [r[metric] for r in rows if r.get("split") == "valid" and metric in r]
    final = summary.get("final") or {}
    best_test = summary.get("best_test") or {}
    best = summary.get("best") or {}
    rec["steps"] = summary.get("step")
    rec["best_step"] = best.get("step")
    rec["valid"] = best.get("value")
    rec["test"] = best_test.get(metric)
    rec["final_valid"] = (final.get("valid") or {}).get(metric)
    rec["final_test"] = (final.get("test") or {}).get(metric)
    if rec["test"] is None:  # no best.pt (nothing ever improved): the final model is the only one
        rec["test"], rec["valid"] = rec["final_test"], rec["final_valid"] if rec["valid"] is None else rec["valid"]
    nonfinite = any(not _finite(x) for x in train_losses if x is not None) or any(not _finite(v) for v in valids)
    if nonfinite or (rec["error"] is None and not _finite(rec["valid"])):
        rec["status"] = "diverged"
    elif rec["error"] is not None:
        rec["status"] = "error"
    else:
        rec["status"] = "ok"
    return rec


def unit_factor(config: dict) -> float | None:
    """For a regression cell: d(scaled target) / d(target) of the split's fitted target scaler, so that
    ``rmse * factor`` is the RMSE in the scaled units the IKA code reports; ``None`` for other tasks."""
    import torch
    task_cfg = config.get("task") or {}
    if (task_cfg.get("name") if isinstance(task_cfg, dict) else task_cfg) != "regression":
        return None
    from kernel_attention.tasks import build_task
    task = build_task(config)
    task.prepare_data()
    if task.y_scaler is None:
        return 1.0
    y = torch.tensor([[0.0], [1.0]])
    t = task.y_scaler.transform(y)
    return float((t[1] - t[0]).abs().reshape(-1)[0])


def _recorded_key(rec: dict, d: Path, cell: Cell) -> str | None:
    """The configuration key that the record ``rec`` of the cell folder ``d`` ran with: its ``config``, else
    that of the ``config.yaml`` its run wrote there, else None (unknown)."""
    if "config" in rec:
        return rec["config"]
    if (d / "config.yaml").is_file():
        from kernel_attention.config import load_config
        return dataclasses.replace(cell, config=load_config(d / "config.yaml")).key
    return None


def is_stale(rec: dict, d: Path, cell: Cell) -> bool:
    """Whether the record ``rec`` of the cell folder ``d`` was run with another configuration than ``cell``'s
    (module docstring).  Sets ``rec["config"]`` where the folder's config.yaml tells it."""
    key = _recorded_key(rec, d, cell)
    if key is not None:
        rec["config"] = key
    return key is not None and key != cell.key


def read_results(out: str | Path, study: Study, cells: list[Cell]) -> list[dict]:
    """The result records of the finished cells, stale ones left out (module docstring; regression ones
    get ``unit_factor``, see above)."""
    res = []
    for c in cells:
        p = cell_dir(out, study, c) / "result.json"
        if p.is_file():
            r = json.loads(p.read_text())
            if is_stale(r, p.parent, c):
                continue
            if "unit_factor" not in r:
                f = unit_factor(c.config)
                if f is not None:
                    r["unit_factor"] = f
                    r["test_scaled"] = None if r.get("test") is None else r["test"] * f
            res.append(r)
    return res


def select_cells(cells: list[Cell], only: tuple[str, ...], study_name: str) -> list[Cell]:
    """The cells that ``only`` (``--only``) names: each item a table, row or column id, or ``a/b`` for the
    cells that match both; all cells when ``only`` is empty.  ``-`` and ``_`` are one character here, so
    a row is named by its kernel's registry name too (``ikan-direct`` for row ``ikan_direct``).  Raises
    ValueError, listing the ids there are, when an item selects none."""
    if not only:
        return cells

    def norm(s: str) -> str:
        return s.replace("-", "_")

    def match(c: Cell, item: str) -> bool:
        ids = {norm(c.table), norm(c.row), norm(c.col)}
        return all(norm(part) in ids for part in item.split("/"))
    idle = [item for item in only if not any(match(c, item) for c in cells)]
    if idle:  # each item must select a cell: a misspelt one beside a good one would be dropped silently
        def listed(attr: str) -> str:
            return ", ".join(dict.fromkeys(getattr(c, attr) for c in cells))
        what = f"--only {list(only)} selects" if len(idle) == len(only) else f"--only's {idle} select"
        raise ValueError(f"{what} no cell of study {study_name}; its tables are "
                         f"{listed('table')}, rows {listed('row')}, columns {listed('col')}")
    return [c for c in cells if any(match(c, item) for item in only)]


def _status(path: Path) -> str | None:
    """The status of the cell record at ``path`` (``ok``, ``error``, ...), None where there is none."""
    return json.loads(path.read_text()).get("status") if path.is_file() else None


def _finished(path: Path, retry_errors: bool) -> bool:
    """Whether the cell with ``result.json`` at ``path`` counts as finished."""
    return path.is_file() and not (retry_errors and _status(path) == "error")


def _stale_cells(cells: list[Cell], dir_of) -> list[tuple[Cell, dict]]:
    """(cell, its record) for each stale cell of ``cells``."""
    out = []
    for c in cells:
        p = dir_of(c) / "result.json"
        if p.is_file():
            rec = json.loads(p.read_text())
            if is_stale(rec, p.parent, c):
                out.append((c, rec))
    return out


def _move_aside(d: Path, key: str) -> Path | None:
    """Renames the stale cell folder ``d`` to ``<name>.stale-<key>`` (a free name) unless another process
    holds its lock (it is being moved or run there); returns the new path, or None."""
    with cell_lock(d) as held:
        if not held:
            return None
        target, n = d.with_name(f"{d.name}.stale-{key}"), 1
        while target.exists():
            target, n = d.with_name(f"{d.name}.stale-{key}-{n}"), n + 1
        d.rename(target)
        return target


def run_study(study: Study, options: StudyOptions, out: str | Path, retry_errors: bool = False,
              log=print, run: bool = True, import_from: tuple[str | Path, ...] = (), rerun_stale: bool = False,
              checkpoint_minutes: float | None = None, command: str = "") -> tuple[list[Cell], list[dict], list[str]]:
    """Run every unfinished cell of ``study`` that ``options.only`` selects (``run=False``: none, only
    collect); returns ``(cells, results, shrink)`` of the whole grid, so that the study's runs.csv and tables,
    written from them, keep the cells finished outside ``options.only``.  ``import_from``: runs.csv files
    whose finished cells are carried in first (:mod:`.carry`), over the whole grid, ``options.only``
    notwithstanding.  ``rerun_stale``: move the folders of cells finished with another configuration aside
    and run them (module docstring).
    ``checkpoint_minutes``: how often each cell writes ``last.pt``; ``command``: the command line each record
    keeps (:func:`run_cell`)."""
    code_revision()  # read HEAD now: the code this process imported, not the checkout when its first cell ends
    cells, shrink = study.cells(options)
    twins = twins_of(cells)  # over the whole grid: a twin outside ``options.only`` is carried too

    def dir_of(c: Cell) -> Path:
        return cell_dir(out, study, c)

    elsewhere = other_studies_results(out, study.folder(options.scale))

    def carry(c: Cell) -> bool:
        rec = finished_twin(c, twins.get(c.id, []), dir_of, is_stale) or finished_elsewhere(c, elsewhere.get(c.key, []))
        if rec is not None:
            dir_of(c).mkdir(parents=True, exist_ok=True)
            write_text(dir_of(c) / "result.json", json.dumps(rec, indent=1, default=str))
            log(f"[{study.name}] {c.id}: the configuration of {rec['same_config_as']}, its result carried over")
        return rec is not None

    for path in import_from:
        n = import_runs(path, study, cells, options.scale, dir_of)
        log(f"study {study.name}: imported {n['imported']} finished cell(s) from {path} "
            f"({n['already_finished']} already finished here, {n['outside_grid']} outside this grid, "
            f"{n['other_config']} run with another configuration)")
    grid, cells = cells, select_cells(cells, options.only, study.name)
    ids = [c.id for c in cells]
    if len(set(ids)) != len(ids):
        raise ValueError(f"study {study.name}: duplicate cell ids")
    table_of = {t.name: t for t in study.tables}
    if rerun_stale and run:
        for c, rec in _stale_cells(cells, dir_of):
            moved = _move_aside(dir_of(c), rec["config"])
            if moved is not None:
                log(f"[{study.name}] {c.id}: ran with another configuration ({rec['config']}); moved to "
                    f"{moved.name}")

    def extended(c: Cell) -> str | None:  # a stale record that a larger train.max_steps continues (.extend)
        p = dir_of(c) / "result.json"
        if not p.is_file():
            return None
        rec = json.loads(p.read_text())
        return extension(c, p.parent, rec) if is_stale(rec, p.parent, c) else None

    def pending(c: Cell, how: str | None) -> bool:  # ``how``: extended(c), which reads the cell's last.pt
        return not _finished(dir_of(c) / "result.json", retry_errors) or how == "train"

    def recarry() -> None:  # stale carried records whose twin has trained on to the current configuration
        for c, rec in _stale_cells(cells, dir_of):
            if "same_config_as" in rec:
                carry(c)

    if run:
        for c in cells:
            if extended(c) == "rekey":
                write_text(dir_of(c) / "result.json", json.dumps(rekey(c, dir_of(c)), indent=1, default=str))
                log(f"[{study.name}] {c.id}: its run ends where the larger train.max_steps would end it (early "
                    f"stopping): its result stands")
        recarry()
    how = {c.id: extended(c) for c in cells}
    todo = [c for c in cells if pending(c, how[c.id]) and not carry(c)]
    n, done = len(cells), len(cells) - len(todo)
    log(f"study {study.name} ({options.scale}): {n} cells, {done} already finished, {len(todo)} to run")
    running = {c.id for c in todo}
    failed = [c.id for c in cells if c.id not in running and _status(dir_of(c) / "result.json") == "error"]
    if failed:
        log(f"study {study.name}: {len(failed)} cell(s) ended in an error ({', '.join(failed[:3])}"
            f"{', ...' if len(failed) > 3 else ''}; --list says which): --retry-errors runs them again")
    stale, waiting = [], []  # waiting: records carried from a twin, carried again once one has trained on
    for c, rec in _stale_cells(cells, dir_of):
        if how[c.id] is None:
            (waiting if "same_config_as" in rec else stale).append(c.id)
    if waiting:
        log(f"study {study.name}: {len(waiting)} cell(s) carried from a twin that ran with another configuration "
            f"({', '.join(waiting[:3])}{', ...' if len(waiting) > 3 else ''}): left out of the table until a twin "
            f"has finished with the current one, then carried again")
    if stale:
        log(f"study {study.name}: {len(stale)} finished cell(s) ran with another configuration than the current "
            f"one ({', '.join(stale[:3])}{', ...' if len(stale) > 3 else ''}): left out of the table and not run "
            f"again; --rerun-stale runs them (their folders under "
            f"{Path(out) / study.folder(options.scale) / 'cells'} moved aside)")
    if not run:
        return grid, read_results(out, study, grid), shrink
    start, spent = time.time(), []
    for i, c in enumerate(todo):
        d = dir_of(c)
        with cell_lock(d) as held:
            # another process may be running the cell, or have finished it (or a twin) since the list was made
            now = extended(c)  # another process may have trained it on since the list was made
            if not held or not pending(c, now):
                log(f"[{study.name}] {c.id}: " + ("running in another process, skipped" if not held else
                                                  "finished by another process"))
                continue
            if carry(c):
                continue
            busy = next((t.id for t in twins.get(c.id, []) if running_elsewhere(dir_of(t))), None)
            if busy is not None:
                log(f"[{study.name}] {c.id}: its twin {busy} (the same configuration) is running in another "
                    f"process, skipped; a later invocation carries its result over")
                continue
            if now == "train":
                log(f"[{study.name}] {c.id}: train.max_steps is larger than the run's: it trains on from its "
                    f"last.pt")
            metric = table_of[c.table].metric if c.table in table_of else c.tags.get("metric", "loss")
            t0 = time.time()
            rec = run_cell(c, d, metric, checkpoint_minutes=checkpoint_minutes, command=command)
            rec["scale"] = options.scale
            write_text(d / "result.json", json.dumps(rec, indent=1, default=str))
        spent.append(time.time() - t0)
        done += 1
        eta = sum(spent) / len(spent) * (len(todo) - i - 1)
        log(f"[{study.name}] {done}/{n} cells done | {c.id}: {rec['status']} valid={rec['valid']} "
            f"test={rec['test']} ({format_duration(spent[-1])}) | elapsed {format_duration(time.time() - start)}, "
            f"about {format_duration(eta)} left")
        # a SIGINT or SIGTERM during the cell's final evaluation: the cell is recorded, the study stops here
        stop_if_asked(f"stopped after cell {c.id}, its result written")
    recarry()
    return grid, read_results(out, study, grid), shrink
