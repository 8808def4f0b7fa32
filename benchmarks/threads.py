"""fwd+bwd of one KernelAttention layer per positional scheme, as a multiple of ``position="none"`` (one SDPA
call), with one torch thread, with the default thread count, and with the default thread count while another
process keeps one core busy (oversubscribed: a parallel region waits for a descheduled thread).

    python benchmarks/threads.py --T 1024 --positions none shaw xl product --filters causal full

Prints a markdown table with the command, the machine and the date; every ratio pairs the scheme with
``none`` in the same process, interleaved.
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing as mp
import os
import platform
import sys
import time

import torch

import kernel_attention as ka
from kernel_attention.machine import cpu


def _burn(stop):
    x = 0
    while not stop.is_set():
        x += 1


def _time(layer, x, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats + 1):  # the first is a warm-up
        t0 = time.perf_counter()
        layer(x).sum().backward()
        best = min(best, time.perf_counter() - t0)
    return best


def _ratios(args, threads: int) -> dict:
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    out = {}
    for filt in args.filters:
        x = torch.randn(args.B, args.T, args.d_model, requires_grad=True)
        base = ka.KernelAttention(args.d_model, args.H, position="none", filter=filt)
        for pos in args.positions:
            layer = ka.KernelAttention(args.d_model, args.H, position=pos, filter=filt)
            this, ref = [], []
            for _ in range(args.pairs):  # interleaved, so that a change of load hits both alike
                this.append(_time(layer, x, args.repeats))
                ref.append(_time(base, x, args.repeats))
            out[(pos, filt)] = (min(this) * 1e3, min(this) / min(ref))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--T", type=int, default=1024)
    p.add_argument("--B", type=int, default=4)
    p.add_argument("--H", type=int, default=8)
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--positions", nargs="+", default=["none", "shaw", "xl", "product"])
    p.add_argument("--filters", nargs="+", default=["causal", "full"])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--pairs", type=int, default=2)
    args = p.parse_args(argv)
    default = torch.get_num_threads()
    runs = {"1 thread": _ratios(args, 1), f"{default} threads": _ratios(args, default)}
    stop = mp.Event()
    burner = mp.Process(target=_burn, args=(stop,), daemon=True)
    burner.start()
    try:
        runs[f"{default} threads, one core busy"] = _ratios(args, default)
    finally:
        stop.set()
        burner.join()
    print(f"Command: `python benchmarks/threads.py {' '.join(sys.argv[1:] if argv is None else argv)}`.  Machine: "
          f"{platform.machine()}, {cpu()}, {os.cpu_count()} cores, torch {torch.__version__}.  Date: "
          f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC.  B={args.B}, H={args.H}, "
          f"d_model={args.d_model}, T={args.T}; fwd+bwd of the layer, ms and / position none.\n")
    names = list(runs)
    print("| position | filter | " + " | ".join(names) + " |")
    print("|---|---|" + "---|" * len(names))
    for key in runs[names[0]]:
        cells = [f"{runs[n][key][0]:.0f} ms, {runs[n][key][1]:.2f}x" for n in names]
        print(f"| {key[0]} | {key[1]} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
