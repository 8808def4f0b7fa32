r"""The kernel smoother itself (Transformer Dissection, Definition 1):

    Attention(x_q; M(x_q, S)) = sum_{x_k in M} k(x_q, x_k) / sum_{x_k' in M} k(x_q, x_k') · v(x_k)

with k = k_F(f_q, f_k) · k_T(t_q, t_k), the kernel on features times the positional factor.  This
module holds the *dense* reference computation that materialises the (Tq, Tk) kernel matrix; faster
backends must agree with it.

* Positive kernels: logits = log k_F + log k_T, excluded keys get -inf, soft-max over keys.
* Direct kernels (poly, linear): w = k_F · k_T with excluded keys set to 0, normalised directly by
  :func:`normalise_direct`.
* A query whose filtered set is empty gets all-zero weights, hence a zero output and zero gradient,
  never NaN.

The positional factor arrives as :class:`PositionalTerms`, which keeps relative positions in compact
form (a (Tq, R) table of logits and a (Tq, Tk) index into it) so that no (T, T, D) tensor is built.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from kernel_attention.kernels import Kernel
from kernel_attention.kernels.base import kernel_matrix

__all__ = ["PositionalTerms", "dense_smoother", "normalise_direct", "guard", "DIRECT_EPS"]

#: Guard of the direct normaliser: |sum k| below this is replaced by +-DIRECT_EPS.
DIRECT_EPS = 1e-6


@dataclasses.dataclass
class PositionalTerms:
    r"""log k_T(t_q, t_k) (and the positional part of the value), in compact pieces.

    All pieces are optional and add up:

    ``q_feat``, ``k_feat``
        (B|1, H, Tq, P), (B|1, H, Tk, P): an inner-product term <q_feat_i, k_feat_j> (already scaled),
        e.g. the symmetric product kernel of Eq. 9.
    ``key_bias``
        (B|1, H, 1, Tk): a per-key term, e.g. Transformer-XL's u·k_j.
    ``relative``
        list of (logits (B|1, H, Tq, R), index (B|1, Tq, Tk) long): the term logits[..., i, index[i, j]] --
        Shaw's look-up table and Transformer-XL's relative sinusoid.
    ``relative_factors``
        list of (q_side (B|1, H, Tq, d), table (B|1, H|1, R, d), index (B|1, Tq, Tk)): the same term with
        logits = q_side · table^T left unmultiplied, so that a backend can form them for a block of rows and
        the few distances it needs (Transformer-XL, whose R = Tq + Tk - 1 would make (Tq, R) logits as large
        as two (Tq, Tk) matrices).  The index is a long tensor or a
        :class:`~kernel_attention.positions.difference_index.DifferenceIndex` (a[i] - c[j] kept as its two vectors,
        what ``xl`` gives), read a block at a time as ``index[..., rows, cols]``.
    ``bias``
        (..., Tq, Tk) broadcastable: any dense additive term (e.g. a user's float mask).
    ``value``
        list of (table (R, Dv), index (B|1, Tq, Tk)): adds sum_j w_ij table[index[i, j]] to the output --
        Shaw et al.'s relative value embeddings a^V.
    """

    q_feat: Tensor | None = None
    k_feat: Tensor | None = None
    key_bias: Tensor | None = None
    relative: list = dataclasses.field(default_factory=list)
    bias: Tensor | None = None
    value: list = dataclasses.field(default_factory=list)
    relative_factors: list = dataclasses.field(default_factory=list)

    def __bool__(self) -> bool:
        return self.has_logits or bool(self.value)

    def to(self, dtype: torch.dtype) -> "PositionalTerms":
        """These terms with every floating-point tensor in ``dtype`` (the index tensors kept)."""
        def cast(x):
            if isinstance(x, Tensor) and x.is_floating_point():
                return x.to(dtype)
            return type(x)(cast(y) for y in x) if isinstance(x, (list, tuple)) else x
        return dataclasses.replace(self, **{f.name: cast(getattr(self, f.name)) for f in dataclasses.fields(self)})

    @property
    def has_logits(self) -> bool:
        return any(x is not None for x in (self.q_feat, self.key_bias, self.bias)) or bool(
            self.relative) or bool(self.relative_factors)

    def log_factor(self, rows: slice = slice(None)) -> Tensor | None:
        """The dense (B|1, H|1, Tq', Tk) sum of the logit pieces for query rows ``rows``."""
        out = None

        def add(x):
            nonlocal out
            out = x if out is None else out + x

        if self.q_feat is not None:
            add(torch.matmul(self.q_feat[..., rows, :], self.k_feat.transpose(-1, -2)))
        if self.key_bias is not None:
            add(self.key_bias)
        for logits, index in self.relative:
            logits = logits[..., rows, :]
            idx = index[..., rows, :].unsqueeze(1)  # (B|1, 1, Tq', Tk)
            b = max(logits.shape[0], idx.shape[0])
            idx = idx.expand(b, logits.shape[1], idx.shape[2], idx.shape[3])
            add(torch.gather(logits.expand(b, *logits.shape[1:]), -1, idx))
        for q_side, table, index in self.relative_factors:
            logits = torch.matmul(q_side[..., rows, :], table.transpose(-1, -2))  # (B|1, H, Tq', R)
            idx = index[..., rows, :].unsqueeze(1)
            b = max(logits.shape[0], idx.shape[0])
            idx = idx.expand(b, logits.shape[1], idx.shape[2], idx.shape[3])
            add(torch.gather(logits.expand(b, *logits.shape[1:]), -1, idx))
        if self.bias is not None:
            bias = self.bias
            if bias.shape[-2] != 1:
                bias = bias[..., rows, :]
            add(bias)
        return out

    def value_term(self, weights: Tensor, rows: slice = slice(None)) -> Tensor | None:
        """sum_j w_ij · table[index[i, j]]: (B, H, Tq', Tk) weights -> (B, H, Tq', Dv).

        Weights are scattered onto the R table rows first, so only a (B, H, Tq', R) tensor is made."""
        out = None
        for table, index in self.value:
            idx = index[..., rows, :].unsqueeze(1).expand_as(weights)
            per_row = weights.new_zeros(*weights.shape[:-1], table.shape[0])
            per_row.scatter_add_(-1, idx, weights)
            term = torch.matmul(per_row, table.to(weights.dtype))
            out = term if out is None else out + term
        return out


def guard(den: Tensor, eps: float = DIRECT_EPS) -> Tensor:
    """The direct normaliser's guard: |den| < eps replaced by +-eps (sign kept), den elsewhere."""
    small = den.abs() < eps
    return torch.where(small, torch.where(den < 0, -eps, eps).to(den.dtype), den)


def normalise_direct(k: Tensor, keep: Tensor | None, eps: float = DIRECT_EPS) -> Tensor:
    r"""p_ij = k_ij / sum_j' k_ij' for kernels that can be zero or negative (poly, linear).

    Excluded keys contribute 0.  The normaliser is *not* made positive: a negative sum flips the sign
    of every weight, which is the failure Transformer Dissection reports for the linear kernel.  Only
    a normaliser with |sum| < eps is replaced by eps (keeping its sign), so that an all-zero row -- an
    empty filtered set, or a polynomial kernel orthogonal to every key -- gives zero weights instead of
    NaN.  Rows still sum to 1 whenever |sum| >= eps.
    """
    if keep is not None:
        k = k.masked_fill(~keep, 0.0)
    return k / guard(k.sum(-1, keepdim=True), eps)


def dense_smoother(q: Tensor, k: Tensor, v: Tensor, kernel: Kernel, keep: Tensor | None = None,
                   terms: PositionalTerms | None = None, dropout_p: float = 0.0,
                   need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
    """The reference backend.

    Args:
        q: (B, H, Tq, D); k: (B, H, Tk, D); v: (B, H, Tk, Dv) -- per-head features.
        kernel: a :class:`~kernel_attention.kernels.Kernel`.
        keep: bool mask broadcastable to (B, H, Tq, Tk), True = the key is in M(x_q, S); None = all.
        terms: positional factor log k_T (and positional value), or None.
        dropout_p: dropout on the normalised weights (training only; pass 0 at evaluation).
        need_weights: also return the (B, H, Tq, Tk) weights p(x_k | x_q).

    Returns:
        output (B, H, Tq, Dv) and the weights (or None).
    """
    log_t = terms.log_factor() if terms is not None and terms.has_logits else None
    if kernel.positive:
        logits = kernel_matrix(kernel, q, k)
        if log_t is not None:
            logits = logits + log_t
        if keep is not None:
            logits = logits.masked_fill(~keep, float("-inf"))
        if keep is not None or log_t is not None:
            # Rows with no key left (the filter, or a float mask of -inf everywhere): soft-max of a row of
            # zeros, then zeroed, so no NaN in value or grad.
            empty = (logits == float("-inf")).all(-1, keepdim=True)
            logits = logits.masked_fill(empty, 0.0)
            weights = torch.softmax(logits, dim=-1).masked_fill(empty, 0.0)
        else:
            weights = torch.softmax(logits, dim=-1)
    else:
        kk = kernel_matrix(kernel, q, k, log=False)
        if log_t is not None:
            # The product kernel k_F · k_T; the row maximum of log k_T cancels in the normalisation.
            if keep is not None:
                log_t = log_t.masked_fill(~keep, float("-inf"))
            # a row whose every key is dropped (-inf) keeps k_T = 0 there: its maximum taken as 0
            row_max = torch.nan_to_num(log_t.amax(-1, keepdim=True).detach(), neginf=0.0)
            kk = kk * (log_t - row_max).exp()
        weights = normalise_direct(kk, keep)
    if dropout_p > 0.0:
        weights_used = torch.nn.functional.dropout(weights, p=dropout_p)
    else:
        weights_used = weights
    out = torch.matmul(weights_used, v)
    if terms is not None and terms.value:
        out = out + terms.value_term(weights_used)
    return out, (weights if need_weights else None)
