"""From cell results to ``runs.csv`` and ``table.md`` (our numbers beside the paper's).

Protocol per table cell (row, col) over its runs (seeds / folds / splits):

* ``best_valid`` (TD): the run with the best validation score (max for BLEU/accuracy, min for ppl/RMSE;
  ties to the lowest seed; non-finite never wins) -> its test score.  All runs diverged -> "not converge".
* ``mean_std`` (IKA): mean ± std (ddof 0, as the IKA code's numpy) of the runs' test scores; diverged or
  failed runs are counted and named, not averaged.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

from kernel_attention.atomic_write import replacing
from kernel_attention.data.protocols import mean_std, select_best
from kernel_attention.study.core import Study, TableSpec

__all__ = ["write_csv", "read_csv", "summarize_cell", "render_tables", "finished_ok", "CSV_FIELDS"]

CSV_FIELDS = ["study", "scale", "table", "row", "col", "seed", "status", "metric", "valid", "test", "final_valid",
              "final_test", "best_step", "steps", "wall_s", "unit_factor", "test_scaled", "cell", "error", "machine",
              "config", "same_config_as", "command", "revision", "params"]


def write_csv(path: str | Path, study: Study, results: list[dict]) -> Path:
    path = Path(path)
    with replacing(path) as tmp, tmp.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in results:
            w.writerow({**r, "study": study.name, "error": (r.get("error") or "")[:300]})
    return path


_FLOATS = ("valid", "test", "final_valid", "final_test", "wall_s", "unit_factor", "test_scaled")
_INTS = ("seed", "best_step", "steps", "params")


def read_csv(path: str | Path) -> list[dict]:
    """The result records of a runs.csv written by :func:`write_csv`, typed as the runner keeps them
    (floats, ints; empty fields absent), so that :func:`render_tables` renders them again."""
    records = []
    with Path(path).open(newline="") as f:
        for row in csv.DictReader(f):
            r = {k: v for k, v in row.items() if v != ""}
            for k in _FLOATS:
                if k in r:
                    r[k] = float(r[k])
            for k in _INTS:
                if k in r:
                    r[k] = int(float(r[k]))
            records.append(r)
    return records


def finished_ok(r: dict) -> bool:
    """Whether a run counts in a table: status "ok" and finite validation and test scores."""
    return r.get("status") == "ok" and r.get("test") is not None and math.isfinite(float(r["test"])) \
        and r.get("valid") is not None and math.isfinite(float(r["valid"]))


def summarize_cell(protocol: str, table: TableSpec, runs: list[dict]) -> dict[str, Any]:
    """``{"text": shown value, "value": number | None, "n": runs, ...}`` of one table cell."""
    if not runs:
        return {"text": "not run", "value": None, "n": 0}
    if table.scaled_units:  # regression: the RMSE in the scaled target units (see runner.unit_factor)
        runs = [{**r, "test": r["test"] * r.get("unit_factor", 1.0), "valid": r["valid"] * r.get("unit_factor", 1.0)}
                if finished_ok(r) else r for r in runs]
    good = [r for r in runs if finished_ok(r)]
    bad = [r for r in runs if not finished_ok(r)]
    f, dg = table.scale_factor, table.digits
    note = ""
    if bad:
        kinds = sorted({r.get("status", "?") for r in bad})
        note = f" ({len(bad)}/{len(runs)} {'/'.join(kinds)})"
    if not good:
        if all(r.get("status") == "diverged" for r in runs):
            return {"text": f"not converge (n={len(runs)})", "value": None, "n": len(runs)}
        return {"text": f"failed{note}", "value": None, "n": len(runs)}
    if protocol == "best_valid":
        sel = select_best(good, "valid", "test", "max" if table.higher_is_better else "min", "seed")
        return {"text": f"{sel.test * f:.{dg}f}{note}", "value": sel.test * f, "n": len(runs),
                "best_seed": sel.best_seed}
    s = mean_std([r["test"] * f for r in good])
    return {"text": f"{s.mean:.{dg}f}±{s.std:.{dg}f}{note}", "value": s.mean, "std": s.std, "n": len(runs)}


def _cells(n: int) -> str:
    return f"{n} cell{'s' if n != 1 else ''}"


def _wall_line(results: list[dict], wall_s: float, machine: str, earlier_machine: str = "") -> str:
    """The summed wall time of the cells, on ``machine`` (the invocation's host); when the records name more
    than one machine (``machine``: cells run on a CPU and a GPU, say, and collected in one folder), or name one
    and leave others unnamed, the sum per machine instead, since one host would misname the others' cells.
    Records that name none (written before the field was) are summed under ``earlier_machine``, the machine a
    study folder says they ran on (``study.json``), else as "machines not recorded".  Cells carried over from a
    twin (``same_config_as``: trained once, under another cell) cost nothing here and are counted apart."""
    carried = sum(1 for r in results if r.get("same_config_as"))
    results = [r for r in results if not r.get("same_config_as")]
    tail = f" {_cells(carried)} carried over from a run of the same configuration, not counted." if carried else ""
    if carried and not results:
        return "Wall time of the cells: none trained for this set yet." + tail
    return _machine_sums(results, wall_s, machine, earlier_machine) + tail


def _machine_sums(results: list[dict], wall_s: float, machine: str, earlier_machine: str) -> str:
    named: dict[str, list[float]] = {}
    for r in results:
        if r.get("machine"):
            named.setdefault(r["machine"], []).append(float(r.get("wall_s") or 0))
    unnamed = [r for r in results if not r.get("machine")]
    if len(named) + bool(unnamed) <= 1:
        return f"Wall time of the cells (sum): {wall_s / 60:.1f} min{(' on ' + machine) if machine else ''}."
    parts = [f"{sum(w) / 60:.1f} min on {m} ({_cells(len(w))})" for m, w in sorted(named.items())]
    if unnamed:
        parts.append(f"{sum(float(r.get('wall_s') or 0) for r in unnamed) / 60:.1f} min on "
                     f"{earlier_machine or 'machines not recorded'} ({_cells(len(unnamed))})")
    return f"Wall time of the cells (sum): {wall_s / 60:.1f} min: " + "; ".join(parts) + "."


_MAX_COMMANDS = 12  # listed in a table's header; the CSV names every row's


def _command_lines(results: list[dict], command: str, earlier_command: str = "") -> list[str]:
    """The table's command: the command line each record names (:func:`.runner.run_cell`), one line per command
    with the number of cells it finished, in the order the grid first meets it; records that name none (run
    before the field was, or imported from an older runs.csv) under ``earlier_command``.  When no record
    names one, ``command`` (the invocation's) alone, as before."""
    counts: dict[str, int] = {}
    for r in results:
        if r.get("command"):
            counts[r["command"]] = counts.get(r["command"], 0) + 1
    if not counts:
        return ["", f"Command: `{command}`"] if command else []
    lines = ["", "Commands, each with the number of cells it finished:", ""]
    lines += [f"- `{c}` ({_cells(n)})" for c, n in list(counts.items())[:_MAX_COMMANDS]]
    if len(counts) > _MAX_COMMANDS:  # one invocation per cell, say: the CSV's column names each
        rest = list(counts.values())[_MAX_COMMANDS:]
        lines.append(f"- {len(rest)} more commands ({_cells(sum(rest))}): the `command` column of runs.csv")
    unnamed = sum(1 for r in results if not r.get("command"))
    if unnamed:
        lines.append(f"- {_cells(unnamed)} whose records name no command"
                     + (f"; the folder's earlier record says: {earlier_command}" if earlier_command
                        else " (run before commands were recorded)"))
    return lines + [""]


def render_tables(study: Study, results: list[dict], shrink: list[str], scale: str, command: str = "",
                  wall_s: float | None = None, machine: str = "", earlier: dict | None = None) -> str:
    """The markdown of table.md: one table per TableSpec, ours then paper per column.  ``earlier``: the
    ``"command"`` and ``"machine"`` of records that name neither (:func:`_command_lines`, :func:`_wall_line`)."""
    earlier = earlier or {}
    lines = [f"# {study.title}", "", f"Scale: `{scale}`. Protocol: "
             + ("best validation of N seeds -> its test score (TD)." if study.protocol == "best_valid"
                else "mean ± std over runs (IKA).")]
    lines += _command_lines(results, command, earlier.get("command", ""))
    if wall_s is not None:
        lines += [_wall_line(results, wall_s, machine, earlier.get("machine", ""))]
    if shrink:
        lines += ["", "What this scale changes relative to the paper's configuration:", ""]
        lines += [f"- {s}" for s in shrink]
    for note in study.notes:
        lines += ["", note]
    for t in study.tables:
        lines += ["", f"## {t.title}", "", f"Metric: {t.metric} ({'higher' if t.higher_is_better else 'lower'} "
                  f"is better); our runs per cell in parentheses where not all succeeded.", ""]
        header = ["row"] + [x for _, lab in t.cols for x in (f"{lab} (ours)", f"{lab} (paper)")] + ["runs"]
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + "---|" * len(header))
        for rid, rlab in t.rows:
            cells, ns = [], []
            for cid, _ in t.cols:
                runs = [r for r in results if r["table"] == t.name and r["row"] == rid and r["col"] == cid]
                s = summarize_cell(study.protocol, t, runs)
                cells += [s["text"], t.paper.get((rid, cid), "-")]
                ns.append(str(s["n"]))
            lines.append("| " + " | ".join([rlab] + cells + ["/".join(ns)]) + " |")
    return "\n".join(lines) + "\n"
