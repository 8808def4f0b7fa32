"""The papers' figures from finished cells (PNG, small: dpi 80).

* :func:`training_curves`   per table: training loss (top) and the table's validation metric (bottom) against
                            the training step, one panel pair per column, one line per (row, column): the seed
                            with the best validation score (protocol "best_valid") or the mean over seeds with
                            a ± 1 std band ("mean_std"); 'x' marks a divergence (the curve stops at NaN).
* :func:`attention_heatmaps` IKA Fig. 2: attention weights per head for one input, one figure row per model.
* :func:`similarity_magnitude` IKA Fig. 3: max similarity and mean log magnitude per evaluation (ProbedTask).
* :func:`p_histograms`      IKA Fig. 4: histogram of attention weights for two values of p, and error vs p.

Each ``X`` that writes a PNG has an ``X_figure`` that returns the open matplotlib Figure instead (tests read
its axes, labels and legends; close it with ``plt.close(fig)``).

Where a curve comes from: the cell folder ``dir_of(cell)`` (``OUT/<study>/cells/<cell id>/``, see
:mod:`.runner`) holds the run's ``metrics.jsonl`` (:mod:`kernel_attention.training.loop`): its ``"train"``
records give the training loss, its ``"valid"`` records the table's metric (``TableSpec.metric``), both at
their ``step`` (optimiser updates).  A cell carried over from a twin (:mod:`.twins`: its record's
``same_config_as``) draws the twin's log, the same run; one imported from a ``runs.csv`` draws the rows of the
``curves.csv`` beside it (:mod:`.curves`), and has no curve without one.  A cell with
no record among ``results`` (still training, or run with another configuration) is not drawn, as the table leaves
it out.
"""

from __future__ import annotations

import math
import textwrap
import warnings
from pathlib import Path
from typing import Any, Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import FuncFormatter, MaxNLocator  # noqa: E402

from kernel_attention.study.curves import cell_log  # noqa: E402

__all__ = ["training_curves", "training_curves_figure", "attention_heatmaps", "attention_heatmaps_figure",
           "similarity_magnitude", "similarity_magnitude_figure", "p_histograms", "metric_name", "STEP_LABEL"]

DPI = 80
STEP_LABEL = "training step (updates)"

#: how a table's metric (the key of the task's evaluate() dict) reads on an axis
_METRIC_NAMES = {"bleu": "BLEU", "ppl": "perplexity", "accuracy": "accuracy", "rmse": "RMSE",
                 "exact_match": "exact match", "loss": "loss"}


def _save(fig, path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return str(path)


def metric_name(table, scaled: bool = False) -> str:
    """The validation axis label of ``table``: "validation BLEU", "validation accuracy (%)", ...; a
    ``scaled_units`` table's RMSE is on the scaled target where ``scaled`` (every run's ``unit_factor``
    known), else in the target's own units."""
    name = _METRIC_NAMES.get(table.metric, table.metric.replace("_", " "))
    if table.scale_factor == 100.0:
        name += " (%)"
    elif table.scale_factor != 1.0:
        name += f" (x {table.scale_factor:g})"
    if table.scaled_units:
        name += ", scaled target" if scaled else ", target units"
    return f"validation {name}"


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _series(records: list[dict], split: str, key: str, factor: float = 1.0) -> tuple[list[int], list[float]]:
    """(steps, values) of ``key`` in the ``split`` records, one value per step (a step logged twice, such as
    the final evaluation of the last periodic one, keeps its last record); a non-finite value is NaN."""
    by_step: dict[int, float] = {}
    for r in records:
        if r.get("split") == split and key in r and "step" in r:
            v = r[key]
            by_step[int(r["step"])] = float(v) * factor if _finite(v) else float("nan")
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


def _best_score(values: list[float], higher: bool) -> float | None:
    finite = [v for v in values if math.isfinite(v)]
    return (max(finite) if higher else min(finite)) if finite else None


def _mean_band(series: list[tuple[list[int], list[float]]]):
    """(steps, mean, std) over runs on the union of their steps; each run counts, linearly interpolated,
    between its first and its last finite point (a diverged run drops out where it stopped)."""
    grid = np.array(sorted({s for steps, _ in series for s in steps}), dtype=float)
    stack = []
    for steps, values in series:
        s, v = np.asarray(steps, float), np.asarray(values, float)
        ok = np.isfinite(v)
        row = np.full_like(grid, np.nan)
        if ok.any():
            inside = (grid >= s[ok][0]) & (grid <= s[ok][-1])
            row[inside] = np.interp(grid[inside], s[ok], v[ok])
        stack.append(row)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a step no run covers: NaN, not a warning
        return grid, np.nanmean(stack, axis=0), np.nanstd(stack, axis=0)


def _last_finite(steps, values):
    pts = [(s, v) for s, v in zip(steps, values) if math.isfinite(v)]
    return pts[-1] if pts else None


class _Variant:
    """The logged runs of one (row, column) of a table, and what the figure draws of them."""

    def __init__(self, label: str, runs: list[dict], higher: bool):
        self.label, self.runs, self.higher = label, runs, higher

    def lines(self, part: str, mode: str) -> list[tuple[list, list, Any]]:
        """[(steps, values, std or None)] to draw for ``part`` ("train" | "valid")."""
        if mode == "mean":
            series = [r[part] for r in self.runs if r[part][0]]
            if not series:
                return []
            if len(series) == 1:
                return [(series[0][0], series[0][1], None)]
            steps, mean, std = _mean_band(series)
            return [(list(steps), list(mean), std)]
        return [(*self.best()[part], None)] if self.best()[part][0] else []

    def best(self) -> dict:
        """The run with the best validation score (the result record's ``valid``, else the best "valid"
        record of its log), as the table's protocol picks it: a diverged or failed run only where every run
        is (then the first)."""
        scored = [r for r in self.runs if r["score"] is not None]
        if not scored:
            return self.runs[0]
        return (max if self.higher else min)(scored, key=lambda r: r["score"])

    def diverged(self, mode: str) -> bool:
        return any(r["diverged"] for r in self.runs) if mode == "mean" else self.best()["diverged"]


def _variants(table, cells, dir_of: Callable, results: list[dict]) -> tuple[dict, bool, list[str]]:
    """{(row id, col id): _Variant} of the (row, column)s with a logged run, whether every plotted
    run's validation metric is in scaled units (``scaled_units`` tables with each run's ``unit_factor``), and
    the labels of the (row, column)s with results but no logged run (carried in without their curves).
    A cell without a record in ``results`` is not drawn: it is still training (its curve would stop short
    of the others) or ran with another configuration, and the table leaves it out too."""
    by_id = {r["cell"]: r for r in results if "cell" in r}
    multi_col = len(table.cols) > 1
    out, scaled, unlogged = {}, bool(table.scaled_units), []
    for rid, rlab in table.rows:
        for cid, clab in table.cols:
            label = f"{rlab} \N{EM DASH} {clab}" if multi_col else rlab
            runs, finished = [], False
            for c in sorted((c for c in cells if c.row == rid and c.col == cid), key=lambda c: c.seed):
                if c.id not in by_id:
                    continue
                res = by_id[c.id]
                finished |= res.get("status") != "error"
                records = cell_log(dir_of(c), res)
                factor = table.scale_factor
                if table.scaled_units:
                    if _finite(res.get("unit_factor")):
                        factor *= res["unit_factor"]
                    else:
                        scaled = False
                run = {"cell": c, "train": _series(records, "train", "loss"),
                       "valid": _series(records, "valid", table.metric, factor),
                       "diverged": res.get("status") == "diverged"}
                if not (run["train"][0] or run["valid"][0]):
                    continue  # no log: carried over without its run folder
                score = res.get("valid")
                run["score"] = (None if res.get("status") in ("diverged", "error") else float(score)
                                if _finite(score) else _best_score(run["valid"][1], table.higher_is_better))
                runs.append(run)
            if runs:
                out[(rid, cid)] = _Variant(label, runs, table.higher_is_better)
            elif finished:
                unlogged.append(label)
    return out, scaled, unlogged


def _seed_mode(cells, seeds: str | None) -> str:
    """"best" or "mean": ``seeds`` as given, else from the study's protocol (best_valid -> best)."""
    if seeds is not None:
        if seeds not in ("best", "mean"):
            raise ValueError(f"seeds={seeds!r}: 'best' or 'mean'")
        return seeds
    from kernel_attention.study.core import STUDIES
    study = STUDIES.get(cells[0].study) if cells else None
    return "mean" if study is not None and study.protocol == "mean_std" else "best"


def _study_title(cells) -> str | None:
    from kernel_attention.study.core import STUDIES
    study = STUDIES.get(cells[0].study) if cells else None
    return study.title if study is not None else None


#: a training loss logged at more than this many steps is drawn as its running mean over 1/SMOOTH of them
SMOOTH = 50


def _running_mean(values: list[float]) -> np.ndarray:
    """The trailing mean of ``values`` over max(1, len / SMOOTH) points (fewer at the start), so that a loss
    logged every step reads as a curve; NaN (a diverged step) stays NaN."""
    v = np.asarray(values, float)
    w = max(1, len(v) // SMOOTH) if len(v) > 2 * SMOOTH else 1
    if w == 1:
        return v
    c = np.cumsum(np.where(np.isfinite(v), v, 0.0))
    n = np.minimum(np.arange(1, len(v) + 1), w)
    mean = (c - np.concatenate([np.zeros(w), c[:-w]])) / n
    return np.where(np.isfinite(v), mean, np.nan)


def _draw(ax, variant: _Variant, part: str, mode: str, colour) -> bool:
    """The lines of ``variant`` for ``part`` on ``ax``; True when something was drawn."""
    drawn = False
    marker = {"marker": "o", "ms": 3} if part == "valid" else {}
    for steps, values, std in variant.lines(part, mode):
        if part == "train":
            values = _running_mean(values)
        ax.plot(steps, values, color=colour, lw=0.9, alpha=0.9, label=variant.label, **marker)
        if std is not None:
            v = np.asarray(values, float)
            ax.fill_between(steps, v - std, v + std, color=colour, alpha=0.2, lw=0)
        end = _last_finite(steps, values)
        if variant.diverged(mode) and end is not None:
            ax.plot(*end, "x", color=colour, ms=8)
        drawn = True
    return drawn


def _positive_log(ax) -> None:
    """Log y when every drawn value is positive (losses, perplexities).  The limits follow the lines, 5% of
    their log range beyond them: a ± std band whose lower edge nears or crosses zero is cut at the axis
    rather than stretching it over decades no line reaches."""
    ys = np.concatenate([np.asarray(l.get_ydata(), float) for l in ax.get_lines()] or [np.zeros(0)])
    ys = ys[np.isfinite(ys)]
    if ys.size and (ys > 0).all():
        ax.set_yscale("log")
        lo, hi = ys.min(), ys.max()
        pad = (hi / lo) ** 0.05 if hi > lo else 1.5
        ax.set_ylim(lo / pad, hi * pad)
        # 3, 5, 300 rather than 3 x 10^0; between the powers of ten only 2, 3 and 5 x 10^k, which do not crowd
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda y, _: f"{y:g}" if f"{y:e}"[0] in "235" else ""))


def training_curves_figure(table, cells, dir_of: Callable, results: list[dict], seeds: str | None = None):
    """The Figure of :func:`training_curves` (None when no cell of ``table`` has a log)."""
    cells = [c for c in cells if c.table == table.name]
    mode = _seed_mode(cells, seeds)
    variants, scaled, unlogged = _variants(table, cells, dir_of, results)
    cols = [(cid, clab) for cid, clab in table.cols if any(k[1] == cid for k in variants)]
    if not cols:
        return None
    n_seeds = max(len(v.runs) for v in variants.values())
    fig, axes = plt.subplots(2, len(cols), figsize=(4.4 * len(cols), 6.4), squeeze=False, layout="constrained")
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    valid_label = metric_name(table, scaled)
    for j, (cid, clab) in enumerate(cols):
        for part, ax, ylabel in (("train", axes[0][j], "training loss"), ("valid", axes[1][j], valid_label)):
            drawn = False
            for i, (rid, _) in enumerate(table.rows):
                if (rid, cid) in variants:
                    drawn |= _draw(ax, variants[(rid, cid)], part, mode, colours[i % len(colours)])
            if drawn:
                if part == "train" or table.metric == "ppl":
                    _positive_log(ax)
                ax.legend(fontsize=6, framealpha=0.7)
            else:
                ax.text(0.5, 0.5, f"no {'training' if part == 'train' else 'validation'} records",
                        ha="center", va="center", transform=ax.transAxes, fontsize=8, color="grey")
            ax.set_title(f"{clab}: {ylabel}", fontsize=9)
            ax.set_xlabel(STEP_LABEL, fontsize=8)
            ax.set_ylabel(ylabel, fontsize=8)
            ax.tick_params(labelsize=7)
    how = ("one line per variant: the seed with the best validation score" if mode == "best" else
           "one line per variant: mean over seeds, band \N{PLUS-MINUS SIGN} 1 std")
    how += f" (up to {n_seeds} seed{'s' if n_seeds != 1 else ''}); x: diverged\n" \
        f"a training loss logged at over {2 * SMOOTH} steps: its running mean over 1/{SMOOTH} of them"
    if unlogged:
        how += "\n" + textwrap.fill("no curves kept for: " + ", ".join(unlogged), 100)
    fig.suptitle("\n".join(t for t in (_study_title(cells), f"{table.title}: training loss and "
                                                            f"{valid_label} per step", how) if t), fontsize=9)
    return fig


def training_curves(fig_dir: Path, table, cells, dir_of: Callable, results: list[dict],
                    seeds: str | None = None) -> str | None:
    """One PNG per table, ``fig_dir/curves_<table>.png``: training loss (top row) and the table's validation
    metric (bottom row) against the training step, one column of panels per table column with a log;
    colour = row, one line per (row, column), legend = the row label (with the column label where the
    table has several).  ``seeds``: "best" (the seed with the best validation score, Transformer
    Dissection's protocol) or "mean" (mean over seeds, band ± 1 std); None takes the study's protocol.
    A column none of whose cells logged training (e.g. results carried over without their run folder) gets
    no panels, and the title names each variant with results but no curve; None when no column has a curve."""
    fig = training_curves_figure(table, cells, dir_of, results, seeds=seeds)
    return None if fig is None else _save(fig, fig_dir / f"curves_{table.name}.png")


def attention_heatmaps_figure(maps: dict[str, Any], tokens: list[str] | None = None, title: str | None = None):
    """The Figure of :func:`attention_heatmaps`."""
    n_rows = len(maps)
    n_heads = max(m.shape[0] for m in maps.values())
    fig, axes = plt.subplots(n_rows, n_heads, figsize=(1.9 * n_heads + 1.0, 1.9 * n_rows + 0.8), squeeze=False,
                             layout="constrained")
    vmax = max(float(np.nanmax(np.asarray(w, dtype=float))) for w in maps.values()) or 1.0
    image = None
    for i, (label, w) in enumerate(maps.items()):
        for h in range(n_heads):
            ax = axes[i][h]
            if h >= w.shape[0]:
                ax.axis("off")  # a model with fewer heads
                continue
            image = ax.imshow(np.asarray(w[h], dtype=float), cmap="viridis", vmin=0.0, vmax=vmax)
            t_q, t_k = w.shape[-2], w.shape[-1]
            if tokens is not None and len(tokens) == t_k == t_q:
                ax.set_xticks(range(t_k), tokens, rotation=90, fontsize=5)
                ax.set_yticks(range(t_q), tokens, fontsize=5)
            else:
                ax.xaxis.set_major_locator(MaxNLocator(4, integer=True))
                ax.yaxis.set_major_locator(MaxNLocator(4, integer=True))
                ax.tick_params(labelsize=6)
            ax.set_xlabel("key position", fontsize=7)
            ax.set_ylabel(f"{label}\nquery position" if h == 0 else "query position", fontsize=7)
            if i == 0:
                ax.set_title(f"head {h + 1}", fontsize=8)
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.8, label="attention weight")
    fig.suptitle(title or "IKA Fig. 2: attention weights per head (first layer, one training input)", fontsize=9)
    return fig


def attention_heatmaps(path: Path, maps: dict[str, Any], tokens: list[str] | None = None,
                       title: str | None = None) -> str:
    """``maps``: {model label: (H, T, T) weights}; one figure row per model, one panel per head (query
    position down, key position across), one colour scale (bar: attention weight) for every panel."""
    return _save(attention_heatmaps_figure(maps, tokens, title), path)


def similarity_magnitude_figure(series: dict[str, list[tuple[float, float, float]]], place: str,
                                title: str | None = None):
    """The Figure of :func:`similarity_magnitude`."""
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.3), layout="constrained")
    for label, pts in series.items():
        if not pts:
            continue
        e, s, m = zip(*pts)
        axes[0].plot(e, s, marker=".", label=label)
        axes[1].plot(e, m, marker=".", label=label)
    for ax, name in zip(axes, ("max similarity (mean over queries of max over keys)",
                               "mean log magnitude (over query-key pairs)")):
        ax.set_title(f"{name.split(' (')[0]} ({place})", fontsize=9)
        ax.set_xlabel("epoch (one point per validation)", fontsize=8)
        ax.set_ylabel(name, fontsize=7)
        if ax.get_lines():
            ax.legend(fontsize=7)
    fig.suptitle(title or f"IKA Fig. 3: similarity and magnitude of the attention kernel during training, {place}",
                 fontsize=9)
    return fig


def similarity_magnitude(path: Path, series: dict[str, list[tuple[float, float, float]]], place: str,
                         title: str | None = None) -> str:
    """``series``: {model label: [(epoch, max_similarity, mean_log_magnitude), ...]} -> two panels."""
    return _save(similarity_magnitude_figure(series, place, title), path)


def p_histograms(path: Path, weights: dict[float, Any], errors: dict[float, list[float]], metric: str,
                 title: str | None = None) -> str:
    """Left: histogram of attention weights for each p in ``weights``; right: ``metric`` against p."""
    fig, axes = plt.subplots(1, 2, figsize=(8.5, 3.3), layout="constrained")  # the right panel's label clears the left
    for p, w in sorted(weights.items()):
        axes[0].hist(w.reshape(-1).numpy(), bins=60, alpha=0.55, label=f"p = {p:g}", log=True)
    axes[0].set_xlabel("attention weight")
    axes[0].set_ylabel("count (log)")
    axes[0].legend(fontsize=7)
    ps = sorted(errors)
    means = [sum(errors[p]) / len(errors[p]) for p in ps]
    axes[1].plot(ps, means, marker="o", label="mean")
    for i, p in enumerate(ps):
        axes[1].scatter([p] * len(errors[p]), errors[p], s=8, color="grey", label=None if i else "one run")
    axes[1].legend(fontsize=7)
    axes[1].set_xscale("log")
    axes[1].set_xlabel("p")
    axes[1].set_ylabel(metric)
    fig.suptitle(title or "IKA Fig. 4: attention weights and error against p", fontsize=9)
    return _save(fig, path)
