"""Host time per call of the ``triton`` backend: what one attention call costs the CPU besides its kernels.

On a GPU a short call (T=1024 at B=4, H=8) waits on the host: the kernels take tens of microseconds, the Python
around them (dispatch, the positional terms, the operators' plumbing, autograd) about as much or more.  Here the
call runs on tiny CPU tensors (B=1, H=2, T=16, D=16, float32, one thread) with its kernel launches recorded, not
run (:func:`~kernel_attention.backends.triton_aot.record_launches`, input checks off), so what is timed is the
host path alone, on any machine; Triton's own launcher (per launch, on a GPU) is not in it.  SDPA's forward and
forward+backward on the same tensors (their compute included, tiny at this size) are timed alongside, and so is
forward+backward through the kernels' operators (``torch.compile``'s path, which eager calls skip:
:func:`~kernel_attention.backends.triton_support.direct`).  Times are CPU time of this thread
(``time.thread_time``), the least over the repeats of the mean over ``--calls`` calls.

    python benchmarks/triton_host.py [--repeats 7] [--calls 200] [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time

from unittest import mock

import torch
import torch.nn.functional as F

import kernel_attention as ka
from kernel_attention.backends import triton_flash, triton_squared
from kernel_attention.backends.triton_aot import record_launches
from kernel_attention.functional import attention
from kernel_attention.machine import cpu
from kernel_attention.positions import default_positions, make_position

#: (label, kernel, position, value position, training mode), each with the causal filter
VARIANTS = [
    ("exp", "exp", "none", "none", False),
    ("rbf, key bias", "rbf", "none", "none", False),
    ("exp, shaw (keys and values)", "exp", "shaw", "relative", False),
    ("exp, xl", "exp", "xl", "none", False),
    ("ikas (training)", "ikas", "none", "none", True),
]
B, H, T, D = 1, 2, 16, 16


def _per_call(fn, calls: int, repeats: int) -> float:
    """Microseconds of this thread's CPU time per call of ``fn``: the least mean over ``repeats`` runs."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.thread_time()
        for _ in range(calls):
            fn()
        best = min(best, (time.thread_time() - t0) / calls)
    return best * 1e6


def _variant_calls(kernel: str, position: str, value: str, train: bool):
    """(forward, forward+backward) of one triton call, positions as a layer passes them (default, offset 0)."""
    torch.manual_seed(0)
    pos = make_position(position, d_model=H * D, n_heads=H, d_head=D, value_position=value)
    kern = ka.make_kernel(kernel, n_heads=H, d_head=D).train(train)
    q, k, v = (torch.randn(B, H, T, D).requires_grad_() for _ in range(3))
    pq, pk = default_positions(T, T, q.device, True)

    def call():
        return attention(q, k, v, kern, "causal", terms=pos.terms(q, k, pq, pk, 0), backend="triton")

    def fwd():
        with torch.no_grad():
            call()

    return (lambda: record_launches(fwd)), (lambda: record_launches(lambda: call().sum().backward()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--out", help="also write the table to this file")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    q, k, v = (torch.randn(B, H, T, D).requires_grad_() for _ in range(3))

    def sdpa_fwd():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=True)

    sdpa = (_per_call(sdpa_fwd, args.calls, args.repeats),
            _per_call(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward(), args.calls,
                      args.repeats))
    lines = [f"Machine: {cpu()}, torch {torch.__version__}, 1 thread; "
             f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; B={B}, H={H}, T={T}, D={D}, "
             f"causal, kernels recorded, not run", "",
             "| variant | fwd µs | fwd+bwd µs | fwd / SDPA's | fwd+bwd / SDPA's | fwd+bwd through operators µs |",
             "|---|---|---|---|---|---|",
             f"| SDPA (its compute included) | {sdpa[0]:.0f} | {sdpa[1]:.0f} | 1.0 | 1.0 | - |"]
    print("\n".join(lines), flush=True)
    for label, kernel, position, value, train in VARIANTS:
        fwd, fwd_bwd = _variant_calls(kernel, position, value, train)
        t = (_per_call(fwd, args.calls, args.repeats), _per_call(fwd_bwd, args.calls, args.repeats))
        with mock.patch.object(triton_flash, "direct", lambda *a: False), \
                mock.patch.object(triton_squared, "direct", lambda *a: False):
            ops = _per_call(fwd_bwd, args.calls, args.repeats)
        lines.append(f"| {label} | {t[0]:.0f} | {t[1]:.0f} | {t[0] / sdpa[0]:.1f} | {t[1] / sdpa[1]:.1f} | "
                     f"{ops:.0f} |")
        print(lines[-1], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("Command: `python benchmarks/triton_host.py " + " ".join(sys.argv[1:]) + "`\n\n")
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
