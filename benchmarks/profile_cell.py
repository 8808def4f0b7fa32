"""Where the time of one benchmark cell goes: torch.profiler over forward+backward passes of one
kernel / position / filter on one backend, beside SDPA on the same shapes, printed as the top operators
by self device time (CUDA) or self CPU time.

    python benchmarks/profile_cell.py --device cuda --T 4096 --kernel exp --backend auto
"""

import argparse

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from kernel_attention.functional import attention
from kernel_attention.kernels import make_kernel
from kernel_attention.positions import default_positions, make_position


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--T", type=int, default=1024)
    p.add_argument("--B", type=int, default=4)
    p.add_argument("--H", type=int, default=8)
    p.add_argument("--D", type=int, default=64)
    p.add_argument("--kernel", default="exp")
    p.add_argument("--position", default="none")
    p.add_argument("--filter", default=None)
    p.add_argument("--backend", default="auto")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--rows", type=int, default=15, help="operators to print")
    a = p.parse_args(argv)
    dev, dtype = torch.device(a.device), getattr(torch, a.dtype)
    q, k, v = (torch.randn(a.B, a.H, a.T, a.D, device=dev, dtype=dtype, requires_grad=True) for _ in range(3))
    # training mode, as the bench: in eval mode the implicit kernels' spectral points collapse to their mean
    kern = make_kernel(a.kernel, n_heads=a.H, d_head=a.D).to(dev, dtype).train()
    pos = make_position(a.position, d_model=a.H * a.D, n_heads=a.H, d_head=a.D).to(dev, dtype)
    pq, pk = default_positions(a.T, a.T, dev, True)

    def ours():
        return attention(q, k, v, kern, a.filter, terms=pos.terms(q, k, pq, pk, 0), backend=a.backend)

    def sdpa():
        return F.scaled_dot_product_attention(q, k, v, is_causal=a.filter == "causal")

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    key = "self_cuda_time_total" if dev.type == "cuda" else "self_cpu_time_total"
    for name, fn in (("kernel-attention", ours), ("SDPA", sdpa)):
        for _ in range(2):  # warm-up (and FlexAttention's compilation)
            fn().sum().backward()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        with profile(activities=acts) as prof:
            for _ in range(a.steps):
                fn().sum().backward()
            if dev.type == "cuda":
                torch.cuda.synchronize()
        print(f"== {name}: {a.kernel} / {a.position} / {a.filter or 'full'} on {a.backend}, T={a.T}, "
              f"{a.steps} fwd+bwd steps, {dtype}, {dev}")
        print(prof.key_averages().table(sort_by=key, row_limit=a.rows))


if __name__ == "__main__":
    main()
