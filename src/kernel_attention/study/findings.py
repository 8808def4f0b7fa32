"""The papers' findings and the comparisons of table cells that each rests on, as data.

A :class:`Comparison` is one cell of a study's table against a baseline cell of the same table: another row
in the same column (a kernel against the exponential one, an IKA row against the Transformer) or, for the
symmetric/asymmetric and value-function claims, the same row in another column.  The direction the paper
claims is not typed here: :func:`paper_direction` reads it from the paper's numbers in the study's
:class:`~.core.TableSpec` (``paper``), oriented as the paired differences (:mod:`.significance`): +1 when
the paper has the cell better than its baseline, -1 worse, 0 level.

A :class:`Finding` is a claim of a paper's text (../shared/papers/: TD Section 3, IKA "Experiments"),
with the comparisons that test it (the paired differences cannot test a claim about more than two cells,
such as "MIKAN is best", so such claims are read off the tables); ``level=True`` marks a claim that two
variants do about equally well (TD: symmetric against asymmetric kernels), which "within noise" marks support
rather than leave open.
"""

from __future__ import annotations

import dataclasses
import math

from kernel_attention.study.core import TableSpec

__all__ = ["Finding", "Comparison", "FINDINGS", "COMPARISONS", "paper_direction", "paper_value"]


@dataclasses.dataclass(frozen=True)
class Finding:
    id: str
    source: str          # the paper and table, e.g. "TD Table 2"
    claim: str           # what the paper's text says, in words
    level: bool = False  # the claim is "about equal" (module docstring)


@dataclasses.dataclass(frozen=True)
class Comparison:
    study: str
    table: str
    col: str
    row: str
    baseline: str            # the baseline row
    finding: str             # Finding.id
    baseline_col: str = ""   # the baseline's column; "" = ``col`` (a row against the baseline row)

    @property
    def base_col(self) -> str:
        return self.baseline_col or self.col


FINDINGS = [
    Finding("td-t1-sp", "TD Table 1", "Positions in a product kernel (Shaw, Dai/XL, Eq. 9) beat the direct sum "
            "(Vaswani) on SP"),
    Finding("td-t1-nmt", "TD Table 1", "On NMT the ways of adding positions are within a BLEU of the direct sum, "
            "Eq. 9 best"),
    Finding("td-t2-linear", "TD Table 2", "The linear kernel does not converge (it can be negative, so its "
            "weights are no distribution)"),
    Finding("td-t2-poly", "TD Table 2", "Kernels of infinite feature space (exponential, RBF) beat the polynomial "
            "kernel"),
    Finding("td-t2-rbf", "TD Table 2", "RBF is best for NMT, the exponential kernel for SP"),
    Finding("td-t2-sym", "TD Table 2", "The symmetric kernel (W_q = W_k) does about as well as the asymmetric one",
            level=True),
    Finding("td-t3-nmt", "TD Table 3", "Removing positions everywhere hurts NMT badly; removing them from the "
            "decoder self-attention (C) alone costs little"),
    Finding("td-t3-sp", "TD Table 3", "SP without positions: worse than Eq. 9, slightly better than Vaswani's "
            "positions"),
    Finding("td-t4", "TD Table 4", "Positions in the value function do not help: II (f W_V) at least as good as "
            "I ((f+t) W_V)"),
    Finding("ika-t2", "IKA Table 2", "The implicit kernels (IKAS, IKANS, IKAN, IKAN-direct, MIKAN) beat the "
            "Transformer on sentence classification"),
    Finding("ika-t2-fixed", "IKA Table 2", "Which fixed kernel (RBF-only, Expsin, Linear) does better than the "
            "Transformer depends on the dataset"),
    Finding("ika-t2-adaptive", "IKA Table 2", "IKAS and IKANS (a data-adaptive implicit kernel) do consistently "
            "better than the fixed kernels RBF-only, Expsin and Linear"),
    Finding("ika-t2-p", "IKA Table 2", "IKAN does better than IKANS (the magnitude's p as a hyper-parameter)"),
    Finding("ika-t3", "IKA Table 3", "IKAN-direct and MIKAN beat the Transformer on translation"),
    Finding("ika-t4", "IKA Table 4", "IKAN-direct and MIKAN beat the Transformer on regression"),
    Finding("ika-t4-gp", "IKA Table 4", "The attention models beat exact GPs (RBF, spectral mixture) on "
            "regression"),
    Finding("ika-t5", "IKA Table 5", "IKAN-direct and MIKAN beat GAT on node classification"),
]


def _against(study: str, table: str, baseline: str, rows: list[str], cols: list[str], finding: str) -> list[Comparison]:
    return [Comparison(study, table, c, r, baseline, finding) for c in cols for r in rows]


def _columns(study: str, table: str, rows: list[str], pairs: list[tuple[str, str]], finding: str) -> list[Comparison]:
    """Each row's column ``col`` against its column ``base`` for (col, base) in ``pairs``."""
    return [Comparison(study, table, c, r, r, finding, b) for c, b in pairs for r in rows]


_CLS = ["mr", "cr", "sst2", "subj", "trec"]
_REG = ["co2", "airline", "housing", "concrete", "parkinsons"]

COMPARISONS = [
    *_against("dissection-positions", "t1-sp", "vaswani", ["shaw", "xl", "eq9"], ["sp"], "td-t1-sp"),
    *_against("dissection-positions", "t1-nmt", "vaswani", ["shaw", "xl", "eq9"], ["nmt"], "td-t1-nmt"),
    *_against("dissection-kernels", "t2-nmt", "exp", ["linear"], ["nmt-asym", "nmt-sym"], "td-t2-linear"),
    *_against("dissection-kernels", "t2-sp", "exp", ["linear"], ["sp-asym", "sp-sym"], "td-t2-linear"),
    *_against("dissection-kernels", "t2-nmt", "exp", ["poly"], ["nmt-asym", "nmt-sym"], "td-t2-poly"),
    *_against("dissection-kernels", "t2-sp", "exp", ["poly"], ["sp-asym", "sp-sym"], "td-t2-poly"),
    *_against("dissection-kernels", "t2-nmt", "exp", ["rbf"], ["nmt-asym", "nmt-sym"], "td-t2-rbf"),
    *_against("dissection-kernels", "t2-sp", "exp", ["rbf"], ["sp-asym", "sp-sym"], "td-t2-rbf"),
    *_columns("dissection-kernels", "t2-nmt", ["poly", "exp", "rbf"], [("nmt-sym", "nmt-asym")], "td-t2-sym"),
    *_columns("dissection-kernels", "t2-sp", ["poly", "exp", "rbf"], [("sp-sym", "sp-asym")], "td-t2-sym"),
    *_against("dissection-order", "t3-nmt", "eq9_abc", ["no_pe", "eq9_ab"], ["nmt"], "td-t3-nmt"),
    *_against("dissection-order", "t3-sp", "eq9_c", ["no_pe"], ["sp"], "td-t3-sp"),
    *_against("dissection-order", "t3-sp", "vaswani_c", ["no_pe"], ["sp"], "td-t3-sp"),
    *_columns("dissection-values", "t4-nmt", ["vaswani", "shaw", "xl", "eq9"], [("nmt-II", "nmt-I")], "td-t4"),
    *_columns("dissection-values", "t4-sp", ["vaswani", "shaw", "xl", "eq9"], [("sp-II", "sp-I")], "td-t4"),
    *_against("ika-classification", "t2", "transformer", ["ikas", "ikans", "ikan", "ikan_direct", "mikan"], _CLS,
              "ika-t2"),
    *_against("ika-classification", "t2", "transformer", ["rbf_only", "expsin", "linear"], _CLS, "ika-t2-fixed"),
    *[c for base in ("rbf_only", "expsin", "linear")
      for c in _against("ika-classification", "t2", base, ["ikas", "ikans"], _CLS, "ika-t2-adaptive")],
    *_against("ika-classification", "t2", "ikans", ["ikan"], _CLS, "ika-t2-p"),
    *_against("ika-translation", "t3", "transformer", ["ikan_direct", "mikan"], ["bleu"], "ika-t3"),
    *_against("ika-regression", "t4", "transformer", ["ikan_direct", "mikan"], _REG, "ika-t4"),
    *_against("ika-regression", "t4", "transformer", ["gp_rbf", "gp_sm"], _REG, "ika-t4-gp"),
    *_against("ika-graphs", "t5", "gat", ["ikan_direct", "mikan"], ["cora", "citeseer", "pubmed"], "ika-t5"),
]


def paper_value(table: TableSpec, row: str, col: str) -> float | None:
    """The paper's number of a cell as a float (the mean of "mean±std"); "not converge" as the worst value
    there is (-inf where higher is better, +inf otherwise); None where the paper has no number."""
    text = table.paper.get((row, col))
    if text is None or text.strip() in ("", "-"):
        return None
    if text.strip() == "not converge":
        return -math.inf if table.higher_is_better else math.inf
    return float(text.split("±")[0])


def paper_direction(table: TableSpec, c: Comparison) -> int | None:
    """+1 / -1 / 0: the paper's cell better / worse / level against its baseline (both "not converge":
    level); None where the paper gives either number not."""
    a, b = paper_value(table, c.row, c.col), paper_value(table, c.baseline, c.base_col)
    if a is None or b is None:
        return None
    if a == b:
        return 0
    return 1 if (a > b) == table.higher_is_better else -1
