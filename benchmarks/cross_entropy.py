"""Forward+backward of the translation tasks' label-smoothed cross-entropy
(:func:`kernel_attention.tasks.cross_entropy.label_smoothed_nll`) against PyTorch's
``cross_entropy(label_smoothing=...)``, the same loss through autograd, on (tokens, vocabulary) logits.

    python benchmarks/cross_entropy.py --tokens 4096 --vocab 8000 --dtype bfloat16 --threads 1 0

Both are timed in the same process, interleaved ABBA; the ratio is ours / torch's median time (below 1: ours
faster).  ``--threads 0`` is torch's default thread count.  Prints a markdown table with the machine and date.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time

import torch
import torch.nn.functional as F

from kernel_attention.machine import numerics
from kernel_attention.tasks.cross_entropy import label_smoothed_nll


def _ours(x, target, epsilon):
    return label_smoothed_nll(x, target, epsilon, ignore_index=0)[0]


def _torch(x, target, epsilon):
    v = x.shape[-1]
    return F.cross_entropy(x.float(), target, ignore_index=0, label_smoothing=epsilon * v / (v - 1))


def _time(fn, logits, target, epsilon, device) -> float:
    x = logits.clone().requires_grad_(True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn(x, target, epsilon).backward()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[4096])
    p.add_argument("--vocab", type=int, nargs="+", default=[8000])
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--epsilon", type=float, default=0.1)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 0], help="0: torch's default")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--device", default="cpu")
    a = p.parse_args(argv)
    dev, default_threads = torch.device(a.device), torch.get_num_threads()
    print(f"{numerics()}; {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; "
          f"device {dev}, {a.dtype} logits, epsilon {a.epsilon}")
    print("\n| threads | tokens | vocab | ours (ms) | torch (ms) | ours / torch |")
    print("|---:|---:|---:|---:|---:|---:|")
    for threads in a.threads:
        torch.set_num_threads(threads or default_threads)
        for n in a.tokens:
            for v in a.vocab:
                logits = torch.randn(n, v, device=dev).to(getattr(torch, a.dtype))
                target = torch.randint(0, v, (n,), device=dev)
                times = {"ours": [], "torch": []}
                for r in range(a.repeats + 1):
                    order = [("ours", _ours), ("torch", _torch)]
                    for name, fn in (order if r % 2 else order[::-1]):
                        t = _time(fn, logits, target, a.epsilon, dev)
                        if r:  # the first round warms up
                            times[name].append(t)
                ours, ref = (statistics.median(times[k]) * 1e3 for k in ("ours", "torch"))
                print(f"| {torch.get_num_threads()} | {n} | {v} | {ours:.1f} | {ref:.1f} | {ours / ref:.2f} |")
    torch.set_num_threads(default_threads)


if __name__ == "__main__":
    main()
