r"""Plain O(T²) references written from the papers' formulas, one (query, key) pair at a time.

They share nothing with the vectorised code but the parameters they read: kernels are scalar formulas,
positional factors are evaluated per pair from their definitions (sinusoids computed by their textbook
formula), and the smoother is Definition 1 as a Python loop.  Tests and ``kernel-attention check``
compare the library against them.  Slow by design: use tiny shapes.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["kernel_value", "log_similarity_value", "sinusoid_value", "smoother_loop", "filter_keep",
           "module_loop"]


def kernel_value(name: str, a: Tensor, b: Tensor, **p) -> Tensor:
    """k(a, b) for two (D,) vectors, straight from Table 2 of Transformer Dissection."""
    d = a.shape[-1]
    p = {key: val for key, val in p.items() if val is not None}  # None = the kernel's default
    if name == "exp":
        return torch.exp((a * b).sum() * p.get("scale", 1 / math.sqrt(d)))
    if name == "rbf":
        return torch.exp(-((a - b) ** 2).sum() * p.get("scale", 1 / math.sqrt(d)))
    if name == "poly":
        return (a * b).sum() ** p.get("degree", 2)
    if name == "linear":
        return (a * b).sum()
    if name == "periodic":
        period = p.get("period") or math.pi * math.sqrt(2) * d ** 0.25
        ls = p.get("lengthscale", 1.0)
        return torch.exp(-(2 / ls ** 2) * (torch.sin(math.pi * (a - b) / period) ** 2).sum())
    raise KeyError(name)


def log_similarity_value(name: str, a: Tensor, b: Tensor, *, ws: list[Tensor] | None = None, freq_scale: float = 1.0,
                         eps: float = 0.0, lengthscale: float | None = None, period: float | None = None) -> Tensor:
    """log similarity of two (D,) vectors of one head, straight from IKA's formulas (Song et al. 2021):

    rbf-only   -||a - b||^2 / (2 l^2), l^2 = sqrt(D) unless ``lengthscale`` (then its square)
    expsin     -(2 / lengthscale^2) sum_i sin^2(pi (a_i - b_i) / P), P = 2 pi D^(1/4) unless ``period``
    implicit   log(f^2 + eps) with ``ws`` the spectral points of each generator, (R, D) each, s = ``freq_scale``:
               one generator (Eq. 12)   f = 1/R sum_r cos(s w_r^T (a - b))
               two (Eqs. 14-16)         f = 1/(4R) sum_r sum_{i,j in 1,2} cos(s (w_i,r^T a - w_j,r^T b))
    """
    d = a.shape[-1]
    if name == "rbf-only":
        l2 = math.sqrt(d) if lengthscale is None else lengthscale ** 2
        return -((a - b) ** 2).sum() / (2 * l2)
    if name == "expsin":
        period = 2 * math.pi * d ** 0.25 if period is None else period
        l2 = (1.0 if lengthscale is None else lengthscale) ** 2
        return -(2 / l2) * torch.sin(math.pi * (a - b) / period).pow(2).sum()
    r = ws[0].shape[0]
    total = sum(torch.cos(freq_scale * (wi @ a - wj @ b)).sum() for wi in ws for wj in ws)
    f = total / (r * len(ws) ** 2)
    return torch.log(f * f + eps)


def sinusoid_value(pos: float, dim: int) -> Tensor:
    """Vaswani et al.'s t_pos: t_{2i} = sin(pos / 10000^{2i/dim}), t_{2i+1} = cos(...)."""
    out = torch.empty(dim, dtype=torch.float64)
    for i in range(dim // 2):
        angle = pos / 10000 ** (2 * i / dim)
        out[2 * i], out[2 * i + 1] = math.sin(angle), math.cos(angle)
    return out


def filter_keep(name: str, tq: int, tk: int, **p) -> Tensor:
    """M as a (Tq, Tk) bool matrix, one entry at a time; query i sits at key position i + Tk - Tq."""
    keep = torch.zeros(tq, tk, dtype=torch.bool)
    for i in range(tq):
        pos = i + tk - tq
        for j in range(tk):
            if name == "full":
                ok = True
            elif name == "causal":
                ok = j <= pos
            elif name == "memory":
                ok = j <= pos and (not p.get("same_length") or j > pos - (p.get("mem_len") or tk - tq))
            elif name == "local":
                ok = abs(pos - j) <= p["window"]
            elif name == "strided":
                s = p["stride"]
                ok = j <= pos and ((pos - j) < s or (pos - j) % s == 0)
            elif name == "fixed":
                s, c = p["stride"], p.get("c", 1)
                ok = j <= pos and (j // s == pos // s or j % s >= s - c)
            else:
                raise KeyError(name)
            keep[i, j] = ok
    return keep


def smoother_loop(q: Tensor, k: Tensor, v: Tensor, kfn, keep: Tensor | None = None, log_pos=None,
                  value_pos=None) -> Tensor:
    """Definition 1 as a loop.

    q (B, H, Tq, D), k (B, H, Tk, D), v (B, H, Tk, Dv); ``kfn(a, b)`` the kernel on two vectors;
    ``keep`` broadcastable (B, H, Tq, Tk) bool; ``log_pos(b, h, i, j)`` the log positional factor;
    ``value_pos(b, h, i, j)`` an extra (Dv,) value term.  Empty filtered sets give zeros.
    """
    B, H, Tq, _ = q.shape
    Tk, Dv = k.shape[2], v.shape[-1]
    if keep is not None:
        keep = keep.expand(B, H, Tq, Tk)
    out = torch.zeros(B, H, Tq, Dv, dtype=q.dtype)
    for b in range(B):
        for h in range(H):
            for i in range(Tq):
                num = torch.zeros(Dv, dtype=q.dtype)
                den = torch.zeros((), dtype=q.dtype)
                for j in range(Tk):
                    if keep is not None and not keep[b, h, i, j]:
                        continue
                    w = kfn(q[b, h, i], k[b, h, j])
                    if log_pos is not None:
                        w = w * torch.exp(log_pos(b, h, i, j))
                    val = v[b, h, j] if value_pos is None else v[b, h, j] + value_pos(b, h, i, j)
                    num = num + w * val
                    den = den + w
                if den != 0:
                    out[b, h, i] = num / den
    return out


def _linear(x: Tensor, lin) -> Tensor:
    y = x @ lin.weight.t().to(x.dtype)
    return y if lin.bias is None else y + lin.bias.to(x.dtype)


def module_loop(module, query: Tensor, key: Tensor | None = None, pos_q=None, pos_k=None,
                keep: Tensor | None = None, memory: Tensor | None = None) -> Tensor:
    """A :class:`~kernel_attention.KernelAttention` forward pass recomputed per (query, key) pair from
    the papers' formulas, reading only the module's parameters.  1-D integer positions only."""
    from kernel_attention import positions as P

    self_attention = key is None
    key = query if key is None else key
    if memory is not None:
        key = torch.cat([memory, key], dim=1)
    B, Tq, _ = query.shape
    Tk = key.shape[1]
    if pos_q is None:
        pos_q = list(range(Tk - Tq, Tk)) if self_attention else list(range(Tq))
    if pos_k is None:
        pos_k = list(range(Tk))
    pos_q, pos_k = [int(x) for x in pos_q], [int(x) for x in pos_k]
    H, d, dm = module.n_heads, module.d_head, module.d_model
    scheme = module.position
    dt = query.dtype

    def t_abs(pos: int, dim: int, enc=None) -> Tensor:
        if enc is not None and hasattr(enc, "tables"):  # learned
            return enc.tables[0].weight[pos].to(dt)
        return sinusoid_value(pos, dim).to(dt)

    fq, fk = query, key
    if isinstance(scheme, P.AbsolutePosition):
        fq = query + torch.stack([t_abs(p, dm, scheme.encoding) for p in pos_q])
        fk = key + torch.stack([t_abs(p, dm, scheme.encoding) for p in pos_k])
    fv = key
    if module.value_position == "absolute":
        fv = key + torch.stack([t_abs(p, key.shape[-1], module.value_encoding) for p in pos_k])

    def heads(x):
        return x.view(B, x.shape[1], H, d).transpose(1, 2)

    q, k, v = heads(_linear(fq, module.q_proj)), heads(_linear(fk, module.k_proj)), heads(_linear(fv, module.v_proj))
    name = module.kernel.name
    kfn = lambda a, b: kernel_value(name, a, b, **module.kernel.hparams())  # noqa: E731

    log_pos = value_pos = None
    if isinstance(scheme, P.ShawPosition):
        K, table = scheme.clip, scheme.key_tables[0].to(dt)

        def row(i, j):
            return max(-K, min(K, pos_q[i] - pos_k[j])) + K

        log_pos = lambda b, h, i, j: (q[b, h, i] * table[row(i, j)]).sum() / math.sqrt(d)  # noqa: E731
        if scheme.value_tables is not None:
            vt = scheme.value_tables[0].to(dt)
            value_pos = lambda b, h, i, j: vt[row(i, j)]  # noqa: E731
    elif isinstance(scheme, P.XLPosition):
        u, vb, w_r = scheme.u.to(dt), scheme.v.to(dt), scheme.r_net[0].weight.to(dt)

        def log_pos(b, h, i, j):
            dist = pos_q[i] - pos_k[j]
            if scheme.clamp_len is not None:
                dist = max(-scheme.clamp_len, min(scheme.clamp_len, dist))
            r = (w_r @ sinusoid_value(dist, dm).to(dt)).view(H, d)[h]
            return ((u[h] * k[b, h, j]).sum() + ((q[b, h, i] + vb[h]) * r).sum()) / math.sqrt(d)
    elif isinstance(scheme, P.ProductPosition):
        w_t = scheme.w_t[0].weight.to(dt)

        def log_pos(b, h, i, j):
            tq = (w_t @ sinusoid_value(pos_q[i], dm).to(dt)).view(H, d)[h]
            tk = (w_t @ sinusoid_value(pos_k[j], dm).to(dt)).view(H, d)[h]
            return (tq * tk).sum() / math.sqrt(d)

    out = smoother_loop(q, k, v, kfn, keep, log_pos, value_pos)
    return _linear(out.transpose(1, 2).reshape(B, Tq, H * d), module.out_proj)
