r"""fairseq's label-smoothed cross-entropy, computed row block by row block with its gradient in closed form.

With logits x (N, V), targets y, lse_n = log sum_v exp x_nv, epsilon the smoothing and eps_i = epsilon / (V - 1):

    nll_n  = lse_n - x_{n y_n}
    loss_n = (1 - epsilon - eps_i) nll_n + eps_i sum_v (lse_n - x_nv)
           = a nll_n + eps_i (V lse_n - sum_v x_nv),                            a = 1 - epsilon - eps_i

averaged over the kept (non-ignored) rows: L = sum_n w_n loss_n / max(n_kept, 1), w_n = [y_n != ignore].  Its
gradient needs only lse, not the (N, V) log-probabilities:

    dL/dx_nv = w_n / n_kept · ((a + V eps_i) softmax(x_n)_v - eps_i - a [v = y_n])

Autograd through ``log_softmax``, ``gather`` and ``sum`` keeps the float32 log-probabilities and forms several
more (N, V) tensors in the backward pass (the gather's zeros, their sum with the smoothing term's, the soft-max's
gradient); here each block of rows is converted to float32, read and written once in each pass, and the count of kept rows stays a tensor (no read by the host, which on a GPU would wait for the
device).  On the CPU with one thread a block is sized to stay in the cache, where the loss is memory-bound;
otherwise it is the whole tensor, one kernel per operation: with several threads each operation on a block is
a parallel region that waits for all of them, and on a loaded machine one descheduled thread stalls every block.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["label_smoothed_nll"]

# float32 elements per block on the CPU: a few MiB, within a core's share of the cache
_CPU_BLOCK = 1 << 19
# exp(x) as exp2(x log2 e): torch's exp2 is the faster of the two on the CPU, where the loss is bound by it
# (docs/benchmarks.md)
_LOG2E = 1.0 / math.log(2.0)


def _blocks(x: Tensor) -> tuple[range, int]:
    """The first row of each block of ``x`` (N, V), and the rows per block."""
    n, v = x.shape
    rows = n if x.device.type != "cpu" or torch.get_num_threads() > 1 else _CPU_BLOCK // max(v, 1)
    rows = max(min(rows, n), 1)
    return range(0, n, rows), rows


class _SmoothedNLL(torch.autograd.Function):
    """(x (N, V), target (N,) long, keep (N,) bool, epsilon) -> (mean smoothed loss, mean nll), both 0-d in x's
    dtype widened to float32 at least; the nll is not differentiable (a log for the caller)."""

    @staticmethod
    def forward(ctx, x: Tensor, target: Tensor, keep: Tensor, epsilon: float):
        n, v = x.shape
        wide = torch.promote_types(x.dtype, torch.float32)
        lse = torch.empty(n, dtype=wide, device=x.device)
        total = torch.empty(n, dtype=wide, device=x.device)
        starts, rows = _blocks(x)
        for i in starts:
            xb = x[i:i + rows].to(wide, copy=True)  # worked on in place
            torch.sum(xb, -1, out=total[i:i + rows])
            m = xb.amax(-1, keepdim=True)
            m = m.masked_fill(m.isinf(), 0.0)  # a row of -inf has lse -inf, as torch.logsumexp's
            lse[i:i + rows] = xb.sub_(m).mul_(_LOG2E).exp2_().sum(-1).log_().add_(m.squeeze(-1))
        nll = lse - x.gather(1, target[:, None]).squeeze(1).to(wide)
        eps_i = epsilon / (v - 1) if v > 1 else 0.0
        a = 1.0 - epsilon - eps_i
        w = keep.to(wide) / keep.sum().clamp_min(1)
        loss = (a * nll + eps_i * (v * lse - total)).mul(w).sum()
        ctx.save_for_backward(x, target, lse, w)
        ctx.coef = (a, eps_i)
        nll = nll.mul(w).sum()
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor):
        x, target, lse, w = ctx.saved_tensors
        a, eps_i = ctx.coef
        v = x.shape[1]
        gw = (grad_loss * w)[:, None]
        grad = torch.empty_like(x)
        starts, rows = _blocks(x)
        for i in starts:
            g = gw[i:i + rows]
            p = (x[i:i + rows] - lse[i:i + rows, None]).mul_(_LOG2E).exp2_()  # softmax, in lse's dtype
            p.mul_(g * (a + v * eps_i)).sub_(g * eps_i)
            p.scatter_add_(1, target[i:i + rows, None], g * -a)
            grad[i:i + rows] = p
        return grad, None, None, None


def label_smoothed_nll(logits: Tensor, target: Tensor, epsilon: float = 0.0,
                       ignore_index: int | None = 0) -> tuple[Tensor, Tensor, Tensor]:
    r"""fairseq's ``label_smoothed_cross_entropy``, averaged over non-ignored tokens (formula in the module
    docstring; PyTorch's ``cross_entropy(label_smoothing=epsilon V / (V - 1))`` is the same loss).

    logits (..., V), target (...) long.  Returns ``(mean smoothed loss, mean nll, n_tokens)``, 0-d tensors (the
    logits' dtype widened to float32 at least, twice, then long); the nll carries no gradient.  Nothing to score
    (every target ignored) gives zeros, not NaN.
    """
    if logits.shape[:-1] != target.shape:
        raise ValueError(f"logits {tuple(logits.shape)} need a target of shape {tuple(logits.shape[:-1])}, "
                         f"got {tuple(target.shape)}")
    x = logits.reshape(-1, logits.shape[-1])
    target = target.reshape(-1)
    keep = torch.ones_like(target, dtype=torch.bool) if ignore_index is None else target.ne(ignore_index)
    # ignored rows are weighted by 0 rather than indexed out: selecting rows would copy the (N, V) logits
    loss, nll = _SmoothedNLL.apply(x, target.masked_fill(~keep, 0), keep, float(epsilon))
    return loss, nll, keep.sum()
