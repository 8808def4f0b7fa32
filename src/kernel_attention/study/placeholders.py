"""Placeholders in the results page's prose: every number a section's text names comes from a runs.csv.

    {{ SET / TABLE / ROW / COL }}                        the cell's shown value (as its table shows it)
    {{ diff SET / TABLE / ROW / COL / BROW / BCOL }}     the paired difference of the cell against the cell
                                                         (BROW, BCOL), positive = better (:mod:`.significance`)
    {{ wall SET }}                                       the summed wall time of the set's cells, in minutes
    {{ wall SET / TABLE }}                               the mean wall time of the table's trained cells (those
                                                         not carried over from a twin), in minutes; one mean
                                                         per machine where they ran on several
    {{ cells SET }}                                      the number of runs.csv rows of the set
    {{ finished SET }}                                   how many cells of the set's grid (its study at its
                                                         scale, the scale's seeds) have a row: "all 48 cells
                                                         of its grid", or "30 of its grid's 48 cells"
    {{ stops SET / TABLE }}                              how the table's finished cells stopped: early
                                                         (``train.patience`` validations without a better
                                                         one) or at ``train.max_steps``, and of the latter how
                                                         many had their best validation at the last one
    {{ seeds SET }}                                      the seeds (folds, splits) the set ran, e.g. "1-5"
    {{ params SET / TABLE / ROW / COL }}                 the cell's model size in parameters, e.g. "16.1M"
    {{ changes SET }}                                    what the set's scale changes relative to the paper's
                                                         configuration (a list: "- " and a change, or a task's
                                                         settings), read from the study's code: an error if a
                                                         row of the set ran with another configuration than
                                                         its cell's current one, unless only by a smaller
                                                         ``train.max_steps`` (a cell the runner trains on,
                                                         :mod:`.extend`), which the list then names

Ids are those of runs.csv (``t1-sp``, ``vaswani``, ``sp``).  A placeholder of another form, or one naming a
set, table, row or column there is not, is an error (:class:`PlaceholderError`), so a typo cannot pass as
text.
"""

from __future__ import annotations

import re

from kernel_attention.study.core import StudyOptions
from kernel_attention.study.extend import key_at_limit
from kernel_attention.study.resultset import Manifest

__all__ = ["fill", "PlaceholderError", "PLACEHOLDER"]

PLACEHOLDER = re.compile(r"\{\{(.*?)\}\}", re.S)
_SETTING = re.compile(r"^(\w+): (\S+ (?:= .*|removed))$")  # "NMT: train.lr = 0.002", one setting a scale changes


class PlaceholderError(ValueError):
    pass


def _seeds(seeds: list[int]) -> str:
    """"1-5", or "0, 2, 5" where they are not consecutive."""
    s = sorted(set(seeds))
    return f"{s[0]}-{s[-1]}" if s == list(range(s[0], s[-1] + 1)) and len(s) > 1 else ", ".join(map(str, s))


def _value(manifest: Manifest, expr: str) -> str:
    words = expr.split(None, 1)
    kind, rest = (words[0], words[1] if len(words) > 1 else "") if words and words[0] in (
        "diff", "wall", "cells", "finished", "seeds", "params", "changes", "stops") else ("cell", expr)
    parts = [p.strip() for p in rest.split("/")]
    try:
        s = manifest.get(parts[0])
        if kind == "wall" and len(parts) == 1:
            return f"{sum(float(r.get('wall_s') or 0) for r in s.records) / 60:.1f} min"
        if kind == "wall" and len(parts) == 2:
            s.study.table(parts[1])  # KeyError for an unknown table
            return _mean_wall(s, parts[1])
        if kind == "stops" and len(parts) == 2:
            s.study.table(parts[1])  # KeyError for an unknown table
            return _stops(s, parts[1])
        if kind == "cells" and len(parts) == 1:
            return str(len(s.records))
        if kind == "finished" and len(parts) == 1:
            return _finished(s)
        if kind == "seeds" and len(parts) == 1:
            return _seeds([int(r["seed"]) for r in s.records])
        if kind == "changes" and len(parts) == 1:
            return _changes(s)
        if kind == "cell" and len(parts) == 4:
            _known(s, *parts[1:])
            return s.cell_text(*parts[1:])
        if kind == "params" and len(parts) == 4:
            _known(s, *parts[1:])
            sizes = {int(r["params"]) for r in s.records if r.get("params") and
                     (r["table"], r["row"], r["col"]) == tuple(parts[1:])}
            if len(sizes) != 1:
                raise KeyError(f"the rows of {'/'.join(parts[1:])} record {len(sizes)} parameter counts, not one")
            return f"{sizes.pop() / 1e6:.1f}M"
        if kind == "diff" and len(parts) == 6:
            _known(s, *parts[1:4])
            _known(s, parts[1], *parts[4:])
            p = s.paired(*parts[1:])
            return p.text(s.study.table(parts[1]).digits) or "not run"
    except KeyError as e:
        raise PlaceholderError(f"placeholder {{{{ {expr} }}}}: {e.args[0]}") from None
    raise PlaceholderError(f"placeholder {{{{ {expr} }}}} is none of the forms of "
                           f"kernel_attention.study.placeholders (SET / TABLE / ROW / COL, diff ..., "
                           f"wall SET [/ TABLE], stops SET / TABLE, cells SET, finished SET, seeds SET, "
                           f"params SET / TABLE / ROW / COL, changes SET)")


def _machine_label(machine: str) -> str:
    """A runs.csv ``machine`` as a sentence names it: the GPU where the cells ran on one, else the processor
    ("AMD EPYC (AVX512), torch 2.13.0+cpu" -> "AMD EPYC (AVX512)"; "..., GPU NVIDIA H100 80GB HBM3" -> "NVIDIA
    H100 80GB HBM3")."""
    gpu = machine.rpartition(", GPU ")[2] if ", GPU " in machine else ""
    return gpu or machine.split(", torch ")[0]


def _mean_wall(s, table: str) -> str:
    """The mean wall time of the table's trained cells (a wall time of 0: carried over from a twin); one
    mean per machine, each with its cell count, where they ran on more than one (a GPU cell shares its
    device with others and a CPU cell its cores, so one mean over both would describe neither)."""
    walls: dict[str, list[float]] = {}
    for r in s.records:
        if r["table"] == table and float(r.get("wall_s") or 0) > 0:
            walls.setdefault(_machine_label(r.get("machine") or ""), []).append(float(r["wall_s"]))
    if not walls:
        raise KeyError(f"table {table} of {s.name} has no trained cell")
    if len(walls) == 1:
        w = next(iter(walls.values()))
        return f"{sum(w) / len(w) / 60:.1f} min"
    by_machine = sorted(walls.items())
    means = [f"{sum(w) / len(w) / 60:.1f} min on {m or 'a machine not recorded'}" for m, w in by_machine]
    counts = [str(len(w)) for _, w in by_machine]
    return f"{', '.join(means[:-1])} and {means[-1]} ({', '.join(counts[:-1])} and {counts[-1]} cells)"


def _finished(s) -> str:
    """The share of the set's grid that has a row, as :func:`_value`'s ``finished`` form writes it."""
    grid = {c.id for c in s.study.cells(StudyOptions(scale=s.scale))[0]}
    done = len(grid & {r["cell"] for r in s.records})
    return f"all {done} cells of its grid" if done == len(grid) else f"{done} of its grid's {len(grid)} cells"


def _grid(s):
    """``(cells, changes)`` of the set's study at its scale, with seeds enough for every row of the set."""
    seeds = max(int(r["seed"]) for r in s.records) + 1
    return s.study.cells(StudyOptions(scale=s.scale, seeds=seeds))


def _limits(s, grid: list) -> dict[str, int | None]:
    """Each row's ``train.max_steps``, by cell id: its cell's, or for a row whose configuration key differs
    from its cell's only by another step limit, that limit (tried: the steps of the set's rows).  Rows of
    another configuration are left out.  ``grid``: the set's cells (:func:`_grid`)."""
    cells = {c.id: c for c in grid}
    tried = sorted({int(r["steps"]) for r in s.records if r.get("steps") not in (None, "")})
    out: dict[str, int | None] = {}
    for r in s.records:
        c = cells.get(r["cell"])
        if c is None:
            continue
        if not r.get("config") or r["config"] == c.key:
            out[r["cell"]] = c.config.get("train", {}).get("max_steps")
            continue
        limit = next((n for n in tried if key_at_limit(c, c.config, n) == r["config"]), None)
        if limit is not None:
            out[r["cell"]] = limit
    return out


def _stops(s, table: str) -> str:
    """How the finished (``ok``) rows of ``table`` stopped, e.g. "all 12 ran to the step limit (3000
    updates), 9 of them with their best validation at the last evaluation"."""
    grid = _grid(s)[0]
    cfg = {c.id: c.config.get("train", {}) for c in grid}
    limits = _limits(s, grid)
    rows = [r for r in s.records if r["table"] == table and r.get("status") == "ok" and r["cell"] in limits]
    if not rows:
        raise KeyError(f"table {table} of {s.name} has no finished cell")
    if any(limits[r["cell"]] is None for r in rows):
        raise KeyError(f"the cells of table {table} of {s.name} have no train.max_steps")
    limit = [r for r in rows if int(r["steps"]) >= int(limits[r["cell"]])]
    early = [r for r in rows if int(r["steps"]) < int(limits[r["cell"]])]
    if any(cfg[r["cell"]].get("patience") is None for r in early):
        raise KeyError(f"cells of table {table} of {s.name} stopped before train.max_steps without train.patience")
    at_last = sum(1 for r in limit if r.get("best_step") and int(r["best_step"]) == int(r["steps"]))

    def span(values) -> str:
        v = sorted(set(values))
        return str(v[0]) if len(v) == 1 else f"{v[0]}-{v[-1]}"
    ran = (f"ran to the step limit ({span(int(limits[r['cell']]) for r in limit)} updates), {at_last} "
           f"of them with their best validation at the last evaluation") if limit else ""
    stopped = (f"stopped early, after {span(int(r['steps']) for r in early)} updates, once "
               f"{span(int(cfg[r['cell']]['patience']) for r in early)} validations in a row had not "
               f"improved") if early else ""
    if not limit:
        return f"all {len(rows)} {stopped}"
    if not early:
        return f"all {len(rows)} {ran}"
    return f"{len(early)} of {len(rows)} {stopped}; {len(limit)} {ran}"


def _changes(s) -> str:
    """The set's scale changes as a list, after checking that its rows ran with the cells' configurations."""
    cells, changes = _grid(s)
    key = {c.id: c.key for c in cells}
    limits = _limits(s, cells)
    other = [r["cell"] for r in s.records if r.get("config") and r.get("cell") in key and r["cell"] not in limits]
    if other:
        raise KeyError(f"{len(other)} row(s) of {s.name} ran with another configuration than the {s.scale} "
                       f"scale's current one (first: {other[0]}); run them again or describe them by hand")
    current = {c.id: c.config.get("train", {}).get("max_steps") for c in cells}
    shorter: dict[int, int] = {}
    for r in s.records:
        if r.get("cell") in limits and limits[r["cell"]] != current[r["cell"]]:
            shorter[limits[r["cell"]]] = shorter.get(limits[r["cell"]], 0) + 1
    changes = list(changes) + [
        f"{n} of the {len(s.records)} rows ran with train.max_steps = {old}, not the limit above: `kernel-attention "
        f"study` trains their cells on from there (kernel_attention.study.extend)" for old, n in sorted(shorter.items())]
    items: list[list[str]] = []  # [prefix, setting, ...]: a run of "NMT: key = value" lines becomes one item
    for c in changes:
        m = _SETTING.match(c)
        if m and items and items[-1][0] == m[1]:
            items[-1].append(m[2])
        else:
            items.append([m[1], m[2]] if m else ["", c])
    return "\n".join(f"- {p}: {', '.join(rest)}" if p else f"- {rest[0]}" for p, *rest in items)


def _known(s, table: str, row: str, col: str) -> None:
    t = s.study.table(table)  # KeyError for an unknown table
    if row not in dict(t.rows):
        raise KeyError(f"table {table} of {s.study.name} has no row {row!r}")
    if col not in dict(t.cols):
        raise KeyError(f"table {table} of {s.study.name} has no column {col!r}")


def fill(text: str, manifest: Manifest, where: str = "") -> str:
    """``text`` with every placeholder replaced by its value; :class:`PlaceholderError` names ``where``
    (the prose file) and the placeholder for one that is unknown."""
    def sub(m: re.Match) -> str:
        try:
            return _value(manifest, " ".join(m.group(1).split()))
        except PlaceholderError as e:
            raise PlaceholderError(f"{where}: {e}" if where else str(e)) from None
    return PLACEHOLDER.sub(sub, text)
