"""Paired differences between two table cells of a study, and whether they hold the paper's direction.

Two cells of one table -- a row and its baseline row (or one row's column against another column) -- are
run on the same seeds (TD: seeds; IKA: folds, splits or seeds), so their runs pair up by ``seed``.  Per
pair i (both runs finished, finite)::

    d_i = s * (m_i(cell) - m_i(baseline)),   s = +1 where higher is better (BLEU, accuracy),
                                             s = -1 where lower is better (ppl, RMSE)

so that d > 0 always means "the cell is better than its baseline".  ``m`` is the number the table shows
(accuracy in %, regression RMSE in the scaled target's units).  Reported: mean d̄ ± std s_d (ddof 1) over
the n pairs.  The test is a paired t-test, two-sided at 5%::

    t = d̄ / (s_d / sqrt(n)),   p = 2 * P(T_{n-1} > |t|)         (scipy.stats.t)

and the mark, against the direction ``paper`` of the paper's own numbers (+1: the paper has the cell better,
-1: worse, 0: level):

    "holds"         p < 0.05 and sign(d̄) == paper
    "reversed"      p < 0.05 and sign(d̄) == -paper
    "differs"       p < 0.05 where the paper has the two level (paper == 0)
    "within noise"  p >= 0.05
    "one seed, no test"   n == 1;   "not run"  n == 0

With s_d == 0 (every pair differs by the same amount) t is infinite unless d̄ == 0 too (two identical
models, say): p = 0 and p = 1 respectively.

A pair whose two runs name different machines (the ``machine`` column: processor, torch build, GPU) is counted
and said beside the test: the same configuration and seed come out differently on two machines (rounding
differs), so such pairs add that difference to s_d.
"""

from __future__ import annotations

import dataclasses
import math

from kernel_attention.study.report import finished_ok

__all__ = ["Paired", "paired_difference", "paired_values", "paired_machines", "mark", "ALPHA", "MARKS"]

ALPHA = 0.05
MARKS = ("holds", "reversed", "differs", "within noise", "one seed, no test", "not run")


@dataclasses.dataclass(frozen=True)
class Paired:
    """The paired difference of a cell against its baseline (module docstring): d̄, s_d, n, p."""

    mean: float | None
    std: float | None
    n: int
    p: float | None
    across: int = 0  # pairs whose two runs ran on different machines

    def text(self, digits: int) -> str:
        """``+0.27 ± 1.52 (n = 10, p = 0.59)``, with ``, 3 pairs across machines`` where some are; with one
        pair the difference alone; "" with none."""
        if self.n == 0:
            return ""
        across = f", {self.across} {'pair' if self.across == 1 else 'pairs'} across machines" if self.across else ""
        if self.n == 1:
            return f"{self.mean:+.{digits}f} (n = 1{across})"
        return f"{self.mean:+.{digits}f} ± {self.std:.{digits}f} (n = {self.n}, {_p_text(self.p)}{across})"


def _p_text(p: float) -> str:
    return "p < 0.001" if p < 0.001 else f"p = {p:.3f}" if p < 0.01 else f"p = {p:.2f}"


def paired_values(runs: list[dict], factor: float = 1.0, scaled_units: bool = False) -> dict[int, float]:
    """seed -> the number the table shows for each finished run of one cell (``test`` x ``factor``, and x
    ``unit_factor`` for a table in scaled units); failed and diverged runs are left out, as in the table."""
    out = {}
    for r in runs:
        if finished_ok(r):
            unit = float(r.get("unit_factor", 1.0)) if scaled_units else 1.0
            out[int(r["seed"])] = float(r["test"]) * factor * unit
    return out


def paired_machines(runs: list[dict]) -> dict[int, str]:
    """seed -> the machine each finished run of one cell names (rows from before the column name none)."""
    return {int(r["seed"]): r["machine"] for r in runs if finished_ok(r) and r.get("machine")}


def paired_difference(cell: dict[int, float], baseline: dict[int, float], higher_is_better: bool,
                      machines: tuple[dict[int, str], dict[int, str]] | None = None) -> Paired:
    """The paired difference of ``cell`` against ``baseline`` (seed -> value each) over the seeds both have;
    ``machines`` (seed -> machine, of each; :func:`paired_machines`) counts the pairs that cross machines."""
    from scipy import stats

    sign = 1.0 if higher_is_better else -1.0
    seeds = sorted(set(cell) & set(baseline))
    d = [sign * (cell[s] - baseline[s]) for s in seeds]
    mc, mb = machines or ({}, {})
    across = sum(1 for s in seeds if s in mc and s in mb and mc[s] != mb[s])
    n = len(d)
    if n == 0:
        return Paired(None, None, 0, None)
    mean = sum(d) / n
    if n == 1:
        return Paired(mean, None, 1, None, across)
    std = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    if std == 0.0:
        p = 1.0 if mean == 0.0 else 0.0
    else:
        t = mean / (std / math.sqrt(n))
        p = float(2.0 * stats.t.sf(abs(t), n - 1))
    return Paired(mean, std, n, p, across)


def mark(paired: Paired, paper: int) -> str:
    """The mark of ``paired`` against the paper's direction ``paper`` (+1, -1, 0; module docstring)."""
    if paired.n == 0:
        return "not run"
    if paired.n == 1:
        return "one seed, no test"
    if paired.p >= ALPHA or paired.mean == 0.0:
        return "within noise"
    if paper == 0:
        return "differs"
    return "holds" if (paired.mean > 0) == (paper > 0) else "reversed"
