"""One update of Adam over a training config's model parameters (random gradients), in each of PyTorch's
implementations: per parameter (``foreach=False``, the CPU's default), ``foreach=True`` (CUDA's default) and
``fused=True`` (what the trainer builds on the CPU and CUDA, :mod:`kernel_attention.training.optimizer`).

    python benchmarks/optimizer_step.py CONFIG [--threads 1 0] [--repeats 10]

CONFIG is a training config, e.g. a study cell's ``config.yaml``.  Prints a markdown table of median
milliseconds per update and each implementation over fused, with the machine and date; ``--threads 0`` is
torch's default thread count.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time

import torch
import yaml

from kernel_attention.machine import numerics
from kernel_attention.tasks.runner import prepare

IMPLEMENTATIONS = {"per parameter": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}


def median_ms(opt: torch.optim.Optimizer, repeats: int) -> float:
    """Median wall milliseconds of ``opt.step()`` over ``repeats`` updates after three to warm up."""
    times = []
    for i in range(repeats + 3):
        t = time.perf_counter()
        opt.step()
        if i >= 3:
            times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 0], help="0: torch's default")
    p.add_argument("--repeats", type=int, default=10)
    a = p.parse_args(argv)
    default_threads = torch.get_num_threads()
    task, _ = prepare(yaml.safe_load(open(a.config)), check_model=False)
    params = list(task.build_model().parameters())
    g = torch.Generator().manual_seed(0)
    for q in params:
        q.grad = torch.randn(q.shape, generator=g)
    n = sum(q.numel() for q in params)
    print(f"{numerics()}; {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; "
          f"{n:,} parameters in {len(params)} tensors")
    print("\n| threads | implementation | ms / update | / fused |")
    print("|---:|---|---:|---:|")
    for threads in a.threads:
        torch.set_num_threads(threads or default_threads)
        ms = {name: median_ms(torch.optim.Adam(params, lr=1e-4, **kw), a.repeats)
              for name, kw in IMPLEMENTATIONS.items()}
        for name, t in ms.items():
            print(f"| {torch.get_num_threads()} | {name} | {t:.1f} | {t / ms['fused']:.2f} |")
    torch.set_num_threads(default_threads)


if __name__ == "__main__":
    main()
