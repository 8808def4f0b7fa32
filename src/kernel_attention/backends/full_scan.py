r"""The non-causal feature-map scan of the ``linear`` backend, with its backward pass written out.

For a kernel with k(a, b) = <phi(a), phi(b)> and a full or padding filter every query sees the same
state (Katharopoulos et al. 2020):

    S = sum_j m_j phi(k_j) v_j^T  (F, Dv),   z = sum_j m_j phi(k_j)  (F,)      m the keys' padding mask
    out_i = phi(q_i) S / g(phi(q_i) z)                                         g: the guard of normalise_direct

summed over blocks of ``chunk`` keys and read by blocks of ``chunk`` queries, so no (B, H, T, F)
tensor is formed.  The backward pass sums the queries' side once,
G = sum_i phi(q_i)^T dnum_i and gz = sum_i phi(q_i)^T dden_i, with

    dnum_i = dout_i / g(den_i),   dden_i = -(dout_i · out_i) / g(den_i)   (0 where g replaced den)
    dphi(q_i) = dnum_i S^T + dden_i z^T,   dphi(k_j) = m_j (v_j G^T + gz^T),   dv_j = m_j phi(k_j) G

and autograd on each block's feature map alone carries dphi to q, k and the kernel's parameters.
Checkpointing the blocks instead would run the forward's two (chunk, F) x (F, Dv) products again:
this is six such products per block pair instead of eight.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernel_attention.backends.causal_scan import accumulator, add_grads, quotient_grads
from kernel_attention.backends.first_order import first_order
from kernel_attention.smoother import guard
from kernel_attention.kernels.capabilities import feature_map

__all__ = ["full_scan"]


def _masked_features(kern, x: Tensor, m: Tensor | None) -> Tensor:
    phi = feature_map(kern, x)
    return phi if m is None else phi * m


class _FullScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, km, kern, chunk, *params):
        acc = accumulator(q.dtype)
        s = z = None
        for j in range(0, k.shape[-2], chunk):
            cols = slice(j, j + chunk)
            phi = _masked_features(kern, k[..., cols, :], None if km is None else km[..., cols, :])
            ds, dz = torch.matmul(phi.transpose(-1, -2), v[..., cols, :]).to(acc), phi.sum(-2, dtype=acc)
            s, z = (ds, dz) if s is None else (s + ds, z + dz)
        outs, dens = [], []
        for r in range(0, q.shape[-2], chunk):
            phi = feature_map(kern, q[..., r:r + chunk, :]).to(acc)
            den = guard(torch.matmul(phi, z.unsqueeze(-1)))
            outs.append((torch.matmul(phi, s) / den).to(q.dtype))
            dens.append(den)
        out = torch.cat(outs, -2)
        ctx.kern, ctx.chunk, ctx.has_mask = kern, chunk, km is not None
        ctx.save_for_backward(q, k, v, out, torch.cat(dens, -2), s, z, *(() if km is None else (km,)), *params)
        return out

    @staticmethod
    @first_order
    def backward(ctx, dout):
        q, k, v, out, den, s, z, *rest = ctx.saved_tensors
        km = rest.pop(0) if ctx.has_mask else None
        params, kern, chunk = rest, ctx.kern, ctx.chunk
        acc = accumulator(q.dtype)
        dnum, dden = quotient_grads(dout, out, den, acc)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        dparams = [None] * len(params)

        def features(x, m):  # (leaf, m * phi(leaf)) with the graph of this block alone
            with torch.enable_grad():
                leaf = x.detach().requires_grad_()
                return leaf, _masked_features(kern, leaf, m)

        def pull(leaf, phi, grad):  # d<phi, grad> / d leaf, the parameters' part added to dparams
            got = torch.autograd.grad(phi, [leaf, *params], grad.to(phi.dtype), allow_unused=True)
            add_grads(dparams, got[1:])
            return got[0]

        g = gz = None  # G = sum_i phi(q_i)^T dnum_i, gz = sum_i phi(q_i)^T dden_i
        for r in range(0, q.shape[-2], chunk):
            rows = slice(r, r + chunk)
            dn, dd = dnum[..., rows, :], dden[..., rows, :]
            leaf, phi = features(q[..., rows, :], None)
            pt = phi.detach().to(acc).transpose(-1, -2)
            dg, dgz = torch.matmul(pt, dn), torch.matmul(pt, dd)
            g, gz = (dg, dgz) if g is None else (g + dg, gz + dgz)
            dq[..., rows, :] = pull(leaf, phi, torch.matmul(dn, s.transpose(-1, -2)) + dd * z.unsqueeze(-2))
        for j in range(0, k.shape[-2], chunk):
            cols = slice(j, j + chunk)
            leaf, phi = features(k[..., cols, :], None if km is None else km[..., cols, :])
            dv[..., cols, :] = torch.matmul(phi.detach().to(acc), g).to(v.dtype)
            vc = v[..., cols, :].to(acc)
            dk[..., cols, :] = pull(leaf, phi, torch.matmul(vc, g.transpose(-1, -2)) + gz.transpose(-1, -2))
        return (dq, dk, dv, None, None, None, *dparams)


def full_scan(q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None, kern, chunk: int) -> Tensor:
    """The smoother out_i = sum_j k(q_i, k_j) v_j / g(sum_j k(q_i, k_j)) over every (unpadded) key, by
    blocks of ``chunk`` rows (module docstring); q (B, H, Tq, D), k (B, H, Tk, D), v (B, H, Tk, Dv),
    key_mask (B|1, H|1, Tk, 1) in q's dtype (1 = a real key) or None.  Gradients reach q, k, v and the
    kernel's parameters."""
    params = tuple(p for p in kern.parameters() if p.requires_grad)
    return _FullScan.apply(q, k, v, key_mask, kern, chunk, *params)
