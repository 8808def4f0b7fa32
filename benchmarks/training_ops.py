"""Forward+backward of the training operations the library computes its own way, against PyTorch's, timed in the
same process, interleaved ABBA:

* ``cross_entropy``: the translation tasks' label-smoothed loss
  (:func:`kernel_attention.tasks.cross_entropy.label_smoothed_nll`) against ``F.cross_entropy(label_smoothing=)``,
  on (tokens, vocabulary) logits;
* ``dropout``: the models' :class:`kernel_attention.dropout.Dropout` against ``nn.Dropout``, on (tokens, width)
  activations.

    python benchmarks/training_ops.py --ops cross_entropy --tokens 4096 --sizes 8000 32000 --threads 1 0
    python benchmarks/training_ops.py --ops dropout --tokens 4096 --sizes 128 512

The ratio is ours / torch's median time (below 1: ours faster).  ``--threads 0`` is torch's default thread
count.  Prints a markdown table with the machine and date.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time

import torch
import torch.nn.functional as F

from kernel_attention.dropout import Dropout
from kernel_attention.machine import numerics
from kernel_attention.tasks.cross_entropy import label_smoothed_nll

EPSILON, P = 0.1, 0.2  # the converged translation cells' label smoothing and dropout


def _cross_entropy(tokens, size, dtype, device):
    logits = torch.randn(tokens, size, device=device).to(dtype)
    target = torch.randint(0, size, (tokens,), device=device)
    smoothing = EPSILON * size / (size - 1)  # PyTorch's smoothing that equals fairseq's epsilon
    return logits, (lambda x: label_smoothed_nll(x, target, EPSILON, ignore_index=0)[0],
                    lambda x: F.cross_entropy(x.float(), target, ignore_index=0, label_smoothing=smoothing))


def _dropout(tokens, size, dtype, device):
    ours, ref = Dropout(P).train(), torch.nn.Dropout(P).train()
    return torch.randn(tokens, size, device=device).to(dtype), (lambda x: ours(x).sum(), lambda x: ref(x).sum())


OPS = {"cross_entropy": _cross_entropy, "dropout": _dropout}


def _time(fn, data, device) -> float:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    x = data.clone().requires_grad_(True)
    sync()
    t0 = time.perf_counter()
    fn(x).backward()
    sync()
    return time.perf_counter() - t0


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", nargs="+", default=list(OPS), choices=list(OPS))
    p.add_argument("--tokens", type=int, nargs="+", default=[4096])
    p.add_argument("--sizes", type=int, nargs="+", default=[8000], help="vocabulary (cross_entropy), width (dropout)")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 0], help="0: torch's default")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--device", default="cpu")
    a = p.parse_args(argv)
    dev, dtype, default_threads = torch.device(a.device), getattr(torch, a.dtype), torch.get_num_threads()
    print(f"{numerics()}; {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; device {dev}, "
          f"{a.dtype}, label smoothing {EPSILON}, dropout {P}")
    print("\n| op | threads | tokens | size | ours (ms) | torch (ms) | ours / torch |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for op in a.ops:
        for threads in a.threads:
            torch.set_num_threads(threads or default_threads)
            for n in a.tokens:
                for size in a.sizes:
                    data, (ours, ref) = OPS[op](n, size, dtype, dev)
                    times = {"ours": [], "torch": []}
                    for r in range(a.repeats + 1):
                        order = [("ours", ours), ("torch", ref)]
                        for name, fn in (order if r % 2 else order[::-1]):
                            t = _time(fn, data, dev)
                            if r:  # the first round warms up
                                times[name].append(t)
                    mine, theirs = (statistics.median(times[k]) * 1e3 for k in ("ours", "torch"))
                    print(f"| {op} | {torch.get_num_threads()} | {n} | {size} | {mine:.1f} | {theirs:.1f} | "
                          f"{mine / theirs:.2f} |")
    torch.set_num_threads(default_threads)


if __name__ == "__main__":
    main()
