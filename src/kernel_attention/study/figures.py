"""The papers' figures from finished cells (PNG, small: dpi 80).

* :func:`training_curves`   train loss per step of every row, one panel per column (TD studies; a diverging
                            linear kernel shows as a curve that leaves the plot or stops at NaN).
* :func:`attention_heatmaps` IKA Fig. 2: attention weights per head for one input, one figure row per model.
* :func:`similarity_magnitude` IKA Fig. 3: max similarity and mean log magnitude per evaluation (ProbedTask).
* :func:`p_histograms`      IKA Fig. 4: histogram of attention weights for two values of p, and error vs p.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from kernel_attention.training.run_log import read_metrics  # noqa: E402

__all__ = ["training_curves", "attention_heatmaps", "similarity_magnitude", "p_histograms"]

DPI = 80


def _save(fig, path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return str(path)


def training_curves(fig_dir: Path, table, cells, dir_of: Callable, results: list[dict]) -> str | None:
    """One PNG per table: train loss vs step; colour = row, one line per seed; 'x' marks a divergence.
    A column none of whose cells logged training (e.g. results carried over without their run folder)
    gets no panel; None when no column has a curve."""
    cells = [c for c in cells if c.table == table.name]
    curves = {c.id: [r for r in read_metrics(dir_of(c)) if r.get("split") == "train" and "loss" in r] for c in cells}
    status = {r["cell"]: r.get("status") for r in results}
    cols = [c for c, _ in table.cols if any(x.col == c and curves[x.id] for x in cells)]
    if not cols:
        return None
    fig, axes = plt.subplots(1, len(cols), figsize=(4.2 * len(cols), 3.2), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, col in zip(axes[0], cols):
        for i, (rid, rlab) in enumerate(table.rows):
            logged = [x for x in cells if x.col == col and x.row == rid and curves[x.id]]
            for c in logged:
                m = curves[c.id]
                steps = [r["step"] for r in m]
                loss = [r["loss"] if r["loss"] is not None and math.isfinite(r["loss"]) else float("nan") for r in m]
                # one legend entry per row, on its first logged seed (carried cells have no curve)
                ax.plot(steps, loss, color=colours[i % len(colours)], lw=0.8, alpha=0.8,
                        label=rlab if c is logged[0] else None)
                if status.get(c.id) == "diverged":
                    finite = [(s, l) for s, l in zip(steps, loss) if math.isfinite(l)]
                    if finite:
                        ax.plot(*finite[-1], "x", color=colours[i % len(colours)], ms=8)
        ax.set_yscale("log")
        ax.set_title(dict(table.cols)[col], fontsize=9)
        ax.set_xlabel("step")
        ax.set_ylabel("train loss")
        ax.legend(fontsize=6)
    fig.suptitle(table.title, fontsize=9)
    return _save(fig, fig_dir / f"curves_{table.name}.png")


def attention_heatmaps(path: Path, maps: dict[str, Any], tokens: list[str] | None = None) -> str:
    """``maps``: {model label: (H, T, T) weights}; one figure row per model, one panel per head."""
    n_rows = len(maps)
    n_heads = max(m.shape[0] for m in maps.values())
    fig, axes = plt.subplots(n_rows, n_heads, figsize=(1.6 * n_heads, 1.7 * n_rows), squeeze=False)
    for i, (label, w) in enumerate(maps.items()):
        for h in range(n_heads):
            ax = axes[i][h]
            ax.set_xticks([])
            ax.set_yticks([])
            if h < w.shape[0]:
                ax.imshow(w[h], cmap="viridis", vmin=0.0)
            if h == 0:
                ax.set_ylabel(label, fontsize=8)
            if i == 0:
                ax.set_title(f"head {h + 1}", fontsize=8)
    return _save(fig, path)


def similarity_magnitude(path: Path, series: dict[str, list[tuple[float, float, float]]], place: str) -> str:
    """``series``: {model label: [(epoch, max_similarity, mean_log_magnitude), ...]} -> two panels."""
    fig, axes = plt.subplots(1, 2, figsize=(8, 3))
    for label, pts in series.items():
        if not pts:
            continue
        e, s, m = zip(*pts)
        axes[0].plot(e, s, marker=".", label=label)
        axes[1].plot(e, m, marker=".", label=label)
    axes[0].set_title(f"max similarity ({place})", fontsize=9)
    axes[1].set_title(f"mean log magnitude ({place})", fontsize=9)
    for ax in axes:
        ax.set_xlabel("epoch")
        ax.legend(fontsize=7)
    return _save(fig, path)


def p_histograms(path: Path, weights: dict[float, Any], errors: dict[float, list[float]], metric: str) -> str:
    """Left: histogram of attention weights for each p in ``weights``; right: ``metric`` against p."""
    fig, axes = plt.subplots(1, 2, figsize=(8.5, 3), layout="constrained")  # the right panel's label clears the left
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
    return _save(fig, path)
