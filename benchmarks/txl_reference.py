"""Transformer-XL's relative attention as its authors compute it, beside this package's ``xl`` position, in one run.

The reference is ``RelPartialLearnableMultiHeadAttn`` of Dai et al. (2019) on (B, H, T, D) tensors under the
causal filter: AC = (q + u) k^T and BD = (q + v) (W_R R)^T materialised as (B, H, T, T), BD moved into place by
``_rel_shift`` (a zero column, a reshape, a slice), soft-max of (AC + BD) / sqrt(d) with the future masked, times
V.  The rows beside it: SDPA (exp kernel, no positional term, the floor), and ``attention(..., position xl)`` on
each backend of ``--backends`` (the same quantity: Transformer Dissection Eq. 5).  Forward and forward+backward
times (minimum over ``--repeats`` after a warm-up) and the peak of the allocator above the inputs, on CUDA.

    python benchmarks/txl_reference.py --device cuda --T 1024 4096 16384 --out txl.md
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import torch
import torch.nn.functional as F

from kernel_attention.functional import attention
from kernel_attention.positions import default_positions, make_position


def rel_shift(x: torch.Tensor) -> torch.Tensor:
    """Transformer-XL's ``_rel_shift`` on the last two axes: x (..., Tq, R) with column m the distance R - 1 - m
    -> (..., Tq, R) with column j the distance i - j (R = Tk, no memory: the upper triangle is masked anyway)."""
    *lead, tq, r = x.shape
    padded = torch.cat([x.new_zeros(*lead, tq, 1), x], -1).view(*lead, r + 1, tq)
    return padded[..., 1:, :].reshape(*lead, tq, r)


def txl_attention(q, k, v, r_net, u, vb, inv_freq):
    """AC + rel-shifted BD, materialised (the reference formulation), causal."""
    b, h, t, d = q.shape
    pos_seq = torch.arange(t - 1, -1, -1, device=q.device, dtype=torch.float32)
    angle = pos_seq[:, None] * inv_freq[None, :]
    # sin and cos interleaved as this package's sinusoid (TXL concatenates them: the same up to a permutation of
    # W_R's input columns), so that the reference and the xl rows compute the same attention
    pos_emb = torch.stack([angle.sin(), angle.cos()], -1).flatten(-2).to(q.dtype)  # (T, d_model)
    r = r_net(pos_emb).view(t, h, d).transpose(0, 1)  # (H, T, D)
    ac = torch.matmul(q + u[:, None, :], k.transpose(-1, -2))
    bd = rel_shift(torch.matmul(q + vb[:, None, :], r.transpose(-1, -2)))
    score = (ac + bd) * (1.0 / math.sqrt(d))
    future = torch.ones(t, t, dtype=torch.bool, device=q.device).triu_(1)
    return torch.matmul(torch.softmax(score.masked_fill(future, float("-inf")), -1), v)


def measure(fn, params, gout, repeats, sync):
    """(fwd ms, fwd+bwd ms, peak MB above what was allocated before), or a status string."""
    def fwd_bwd():
        fn().backward(gout)
        for p in params:
            p.grad = None
        sync()

    def fwd():
        with torch.no_grad():
            fn()
        sync()

    cuda = torch.cuda.is_available() and gout.is_cuda
    try:
        if cuda:
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        fwd_bwd()
        peak = (torch.cuda.max_memory_allocated() - base) / 2 ** 20 if cuda else float("nan")
        fwd()
        best = [float("inf"), float("inf")]
        for _ in range(repeats):
            for i, f in enumerate((fwd, fwd_bwd)):
                t0 = time.perf_counter()
                f()
                best[i] = min(best[i], (time.perf_counter() - t0) * 1000)
        return best[0], best[1], peak
    except torch.cuda.OutOfMemoryError:
        return "out of GPU memory"
    except Exception as e:  # a row that cannot run is reported; the others still run
        return f"error: {type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}"
    finally:
        if cuda:
            torch.cuda.empty_cache()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--T", type=int, nargs="+", default=[1024, 4096])
    p.add_argument("--B", type=int, default=4)
    p.add_argument("--H", type=int, default=8)
    p.add_argument("--D", type=int, default=64)
    p.add_argument("--backends", nargs="+", default=["triton", "dense"],
                   help="backends for attention(..., position xl)")
    p.add_argument("--materialised-above", type=int, default=8192,
                   help="skip the (T, T) formulations (reference, dense) for T above this")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default=None, help="bfloat16 (CUDA default) or float32")
    p.add_argument("--out", help="also write the table (markdown) here")
    args = p.parse_args(argv)
    dev = torch.device(args.device)
    dtype = getattr(torch, args.dtype or ("bfloat16" if dev.type == "cuda" else "float32"))
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    b, h, d = args.B, args.H, args.D
    machine = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    lines = [f"B={b}, H={h}, D={d}, {dtype}, causal, {machine}",
             "", "| T | formulation | fwd ms | fwd+bwd ms | peak MB |", "|---|---|---|---|---|"]
    for t in args.T:
        torch.manual_seed(0)
        q, k, v = (torch.randn(b, h, t, d, device=dev, dtype=dtype).requires_grad_() for _ in range(3))
        gout = torch.randn(b, h, t, d, device=dev, dtype=dtype)
        pos = make_position("xl", d_model=h * d, n_heads=h, d_head=d).to(dev, dtype)
        inv_freq = 1.0 / (10000 ** (torch.arange(0, h * d, 2, device=dev, dtype=torch.float32) / (h * d)))
        pq, pk = default_positions(t, t, dev, True)
        rows = [("SDPA (exp, no position)", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), [q, k, v],
                 False)]
        rows.append(("Transformer-XL: AC + rel-shifted BD", lambda: txl_attention(q, k, v, pos.r_net[0], pos.u, pos.v,
                                                                                  inv_freq),
                     [q, k, v] + list(pos.parameters()), True))
        for name in args.backends:
            rows.append((f"attention(xl) on {name}",
                         lambda name=name: attention(q, k, v, "exp", "causal", terms=pos.terms(q, k, pq, pk, 0),
                                                     backend=name),
                         [q, k, v] + list(pos.parameters()), name == "dense"))
        for label, fn, params, materialised in rows:
            if materialised and t > args.materialised_above:
                lines.append(f"| {t} | {label} | skipped (T > {args.materialised_above}) | | |")
                continue
            r = measure(fn, params, gout, args.repeats if t < 4096 else max(1, args.repeats - 1), sync)
            lines.append(f"| {t} | {label} | {r} | | |" if isinstance(r, str) else
                         f"| {t} | {label} | {r[0]:.3g} | {r[1]:.3g} | {r[2]:.0f} |")
            print(lines[-1], file=sys.stderr, flush=True)
            if args.out:
                with open(args.out, "w") as f:
                    f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
