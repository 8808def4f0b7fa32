r"""The causal feature-map scan of the ``linear`` backend, with its backward pass written out.

For a kernel with k(a, b) = <phi(a), phi(b)> and a causal filter, rows go in blocks of ``chunk``;
block c sees the keys of earlier blocks through their state and its own keys through the kernel
itself (Yang et al., chunked linear attention):

    K_c   = tril(k(q_c, k_c)) * m_c                     (chunk, chunk); m_c the keys' padding mask
    num_c = K_c v_c + phi(q_c) S_{c-1},                 den_c = K_c 1 + phi(q_c) z_{c-1}
    out_c = num_c / g(den_c)                            g: the guard of ``normalise_direct``
    S_c   = S_{c-1} + (m_c phi(k_c))^T v_c  (F, Dv),    z_c = z_{c-1} + (m_c phi(k_c))^T 1  (F,)

The forward pass keeps one (F, Dv) state per block, never a (B, H, T, F) tensor.  The backward pass
walks the blocks in reverse, carrying the transposed state of the later blocks' queries,
G = sum_{c' > c} phi(q_c')^T dnum_c' and gz = sum_{c' > c} phi(q_c')^T dden_c':

    dnum_c = dout_c / g(den_c),        dden_c = -(dout_c · out_c) / g(den_c)   (0 where g replaced den)
    dK_c   = tril(dnum_c v_c^T + dden_c 1^T) * m_c,   dv_c = K_c^T dnum_c + (m_c phi(k_c)) G
    dphi(q_c) = dnum_c S_{c-1}^T + dden_c z_{c-1}^T,   dphi(k_c) = m_c (v_c G^T + 1 gz^T)

and autograd on the block alone carries dK_c, dphi(q_c) and dphi(k_c) to q, k and the kernel's
parameters.  Checkpointing each block instead would run its two (chunk, F) x (F, Dv) products
again in the backward pass: this is six such products per block instead of eight, and the features
phi are formed once per block and pass rather than again inside a re-run forward.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernel_attention.backends.first_order import first_order
from kernel_attention.smoother import DIRECT_EPS, guard
from kernel_attention.kernels.capabilities import feature_map

__all__ = ["accumulator", "add_grads", "causal_scan", "quotient_grads"]


def accumulator(dtype: torch.dtype) -> torch.dtype:
    """The dtype of the states and sums.

    S, z and the sums are over every key: float32 under bf16 / fp16 inputs (as fused attention keeps
    its soft-max sums), so their rounding does not grow with the sequence."""
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


def quotient_grads(dout: Tensor, out: Tensor, den: Tensor, acc: torch.dtype) -> tuple[Tensor, Tensor]:
    """(dnum, dden) of out = num / den, den (..., T, 1) the guarded denominator saved by the forward:
    dnum = dout / den, dden = -(dout · out) / den, and dden = 0 where the guard replaced den by a
    constant (there, and only there, the saved den is exactly +-DIRECT_EPS)."""
    dout = dout.to(acc)
    dden = -(dout * out.to(acc)).sum(-1, keepdim=True) / den
    return dout / den, dden.masked_fill(den.abs() <= DIRECT_EPS, 0.0)


def add_grads(total: list, grads) -> None:
    """total[i] += grads[i] for the kernel parameters' gradients of one block (None: not reached)."""
    for i, g in enumerate(grads):
        if g is not None:
            total[i] = g if total[i] is None else total[i] + g


def _block_kernel(kern, qc: Tensor, kc: Tensor, mc: Tensor | None) -> Tensor:
    """K_c = tril(k(q_c, k_c)) * m_c^T: (B, H, n, n)."""
    kk = kern.kernel(qc, kc)
    n = kc.shape[-2]
    kk = kk * torch.ones(n, n, dtype=torch.bool, device=kk.device).tril()
    return kk if mc is None else kk * mc.transpose(-1, -2)


class _CausalScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, km, kern, chunk, *params):
        acc = accumulator(q.dtype)
        tq = q.shape[-2]
        outs, dens, states = [], [], []
        s = z = None
        for j in range(0, tq, chunk):
            rows = slice(j, min(tq, j + chunk))
            qc, kc, vc = q[..., rows, :], k[..., rows, :], v[..., rows, :]
            mc = None if km is None else km[..., rows, :]
            kk = _block_kernel(kern, qc, kc, mc)
            num = torch.matmul(kk, vc).to(acc)
            den = kk.sum(-1, keepdim=True, dtype=acc)
            if s is not None:
                phi = feature_map(kern, qc).to(acc)
                num = num + torch.matmul(phi, s)
                den = den + torch.matmul(phi, z.unsqueeze(-1))
            den = guard(den)
            outs.append((num / den).to(q.dtype))
            dens.append(den)
            states.append((s, z))
            if j + chunk < tq:
                phi = feature_map(kern, kc)
                if mc is not None:
                    phi = phi * mc
                ds, dz = torch.matmul(phi.transpose(-1, -2), vc).to(acc), phi.sum(-2, dtype=acc)
                s, z = (ds, dz) if s is None else (s + ds, z + dz)
        out = torch.cat(outs, -2)
        den = torch.cat(dens, -2)
        ctx.kern, ctx.chunk, ctx.states, ctx.has_mask = kern, chunk, states, km is not None
        ctx.save_for_backward(q, k, v, out, den, *(() if km is None else (km,)), *params)
        return out

    @staticmethod
    @first_order
    def backward(ctx, dout):
        q, k, v, out, den, *rest = ctx.saved_tensors
        km = rest.pop(0) if ctx.has_mask else None
        params = rest
        kern, chunk, states = ctx.kern, ctx.chunk, ctx.states
        acc = accumulator(q.dtype)
        tq = q.shape[-2]
        dnum, dden = quotient_grads(dout, out, den, acc)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        dparams = [None] * len(params)
        g = gz = None
        for j in reversed(range(0, tq, chunk)):
            rows = slice(j, min(tq, j + chunk))
            vc = v[..., rows, :].to(acc)
            mc = None if km is None else km[..., rows, :]
            dn, dd = dnum[..., rows, :], dden[..., rows, :]
            s, z = states[j // chunk]
            with torch.enable_grad():
                qc = q[..., rows, :].detach().requires_grad_()
                kc = k[..., rows, :].detach().requires_grad_()
                kk = _block_kernel(kern, qc, kc, mc)
                outputs = [kk]
                grads = [(torch.matmul(dn, vc.transpose(-1, -2)) + dd).to(kk.dtype)]
                dvc = torch.matmul(kk.detach().transpose(-1, -2).to(acc), dn)
                if s is not None:
                    phi_q = feature_map(kern, qc)
                    outputs.append(phi_q)
                    grads.append((torch.matmul(dn, s.transpose(-1, -2)) + dd * z.unsqueeze(-2)).to(phi_q.dtype))
                if g is not None:
                    phi_k = feature_map(kern, kc)
                    if mc is not None:
                        phi_k = phi_k * mc
                    outputs.append(phi_k)
                    grads.append((torch.matmul(vc, g.transpose(-1, -2)) + gz.transpose(-1, -2)).to(phi_k.dtype))
                    dvc = dvc + torch.matmul(phi_k.detach().to(acc), g)
                got = torch.autograd.grad(outputs, [qc, kc, *params], grads, allow_unused=True)
            dq[..., rows, :] = got[0]
            dk[..., rows, :] = got[1]
            dv[..., rows, :] = dvc.to(v.dtype)
            add_grads(dparams, got[2:])
            if j > 0:  # the keys of earlier blocks see these queries through the state
                phi_q = phi_q.detach().to(acc)
                dg, dgz = torch.matmul(phi_q.transpose(-1, -2), dn), torch.matmul(phi_q.transpose(-1, -2), dd)
                g, gz = (dg, dgz) if g is None else (g + dg, gz + dgz)
        return (dq, dk, dv, None, None, None, *dparams)


def causal_scan(q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None, kern, chunk: int) -> Tensor:
    """The causal smoother out_i = sum_{j <= i} k(q_i, k_j) v_j / g(sum_{j <= i} k(q_i, k_j)) by blocks
    of ``chunk`` rows (module docstring); q, k (B, H, T, D), v (B, H, T, Dv), key_mask (B|1, H|1, T, 1)
    in q's dtype (1 = a real key) or None.  Gradients reach q, k, v and the kernel's parameters."""
    params = tuple(p for p in kern.parameters() if p.requires_grad)
    return _CausalScan.apply(q, k, v, key_mask, kern, chunk, *params)
