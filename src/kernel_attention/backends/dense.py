"""``dense``: the reference smoother that materialises the (Tq, Tk) kernel matrix
(:func:`kernel_attention.smoother.dense_smoother`).  Runs every combination; memory and time grow as
Tq x Tk.  Kept for tests, for ``need_weights`` and for combinations no fast path covers."""

from __future__ import annotations

from kernel_attention.backends.base import BACKENDS, Backend, Problem
from kernel_attention.smoother import dense_smoother

__all__ = ["DenseBackend"]


@BACKENDS.register("dense")
class DenseBackend(Backend):
    """The reference: every kernel, position and filter, by materialising the (B, H, Tq, Tk) kernel matrix."""

    name = "dense"

    def describe(self, p: Problem) -> str:
        return "materialises the (Tq, Tk) kernel matrix"

    def run(self, p: Problem):
        return dense_smoother(p.q, p.k, p.v, p.kernel, p.keep, p.terms, p.dropout_p, p.need_weights)
