"""``kernel-attention run``: the main job in miniature -- a small grid of attention choices trained on a
built-in synthetic task (no download), printed as a markdown table.

Default grid: the ``reverse`` task (y = x reversed, lengths 4-7 over 8 symbols) with a 1+1-layer encoder-decoder
(d = 32, 4 heads), one row per attention choice, the same choice in all three places (encoder self,
encoder-decoder, decoder self):

    position  none / absolute at the input (Vaswani) / shaw / xl / product (Eq. 9)
    kernel    exp / rbf / linear (with the Vaswani positions)

``none`` cannot reverse (without positions the encoder sees a set); the linear kernel is not a valid
smoother (k < 0), which Transformer Dissection reports as "did not converge".  Runs use two worker processes
with one thread each (``--threads``); ``--steps`` and ``--jobs`` trade accuracy for time.

The runs keep no checkpoints (each trains in a temporary folder): Ctrl-C or SIGTERM stops the grid at once, the
runs in training and those not started alike, and the command exits 128 + the signal's number.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from contextlib import contextmanager

from kernel_attention.cli.counts import at_least
from kernel_attention.cli.threads import threads_per_op
from kernel_attention.machine import numerics

GRID = [  # (kernel, position, pe_at_input); per-layer "absolute" is configs/synthetic/reverse.yaml
    ("exp", "none", False),
    ("exp", "none", True),
    ("exp", "shaw", False),
    ("exp", "xl", False),
    ("exp", "product", False),
    ("rbf", "none", True),
    ("linear", "none", True),
]


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("run", help="train a small grid of attention choices on a synthetic task and print a table",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="reverse", choices=("copy", "reverse", "sort", "recall", "translation"))
    p.add_argument("--steps", type=at_least(1, "optimiser updates"), default=250, help="optimiser updates per run")
    p.add_argument("--jobs", type=at_least(1, "worker processes"), default=2, help="worker processes")
    p.add_argument("--threads", type=threads_per_op, default=1, metavar="N",
                   help="torch intra-op threads per worker (default 1: the --jobs workers share the cores)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--test-size", type=at_least(1, "test examples"), default=200, help="test examples per run")
    p.add_argument("--out", default=None, help="also write the table (markdown) to this file")
    return p


def config(kind: str, kernel: str, position: str, pe_at_input: bool, steps: int, seed: int,
           test_size: int = 200) -> dict:
    att = {"kernel": kernel, "position": position}
    return {
        "seed": seed,
        "task": {"name": "synthetic", "kind": kind, "vocab": 16 if kind == "recall" else 8, "min_len": 4,
                 "max_len": 7, "batch_size": 64,
                 "train_size": 64 * steps, "valid_size": 64, "test_size": test_size},
        "model": {"d_model": 32, "n_heads": 4, "d_ff": 64, "enc_layers": 1, "dec_layers": 1, "dropout": 0.0,
                  "pe_at_input": pe_at_input, "encoder_attention": att, "cross_attention": att,
                  "decoder_attention": att},
        "train": {"max_steps": steps, "lr": 3e-3, "clip_norm": 1.0, "progress": False, "test_best": False,
                  "schedule": "constant", "seed": seed},
    }


def _stop(signum, frame):
    from kernel_attention.training.interrupt import Stopped

    raise Stopped("the grid stopped (its runs keep no checkpoints: the command starts them over)", signum)


@contextmanager
def _stops_at_once():
    """Within: the first SIGINT or SIGTERM raises :class:`~kernel_attention.training.interrupt.Stopped` here,
    where the trainer would otherwise stop at its next logged step to write a checkpoint that a demo does not
    keep (it leaves a handler it did not install alone).  As there, a signal whose handler is not Python's default
    (a caller's, or ignored, as under nohup) is left as it is."""
    from kernel_attention.training.interrupt import has_default_handler

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in before:
        if has_default_handler(s):
            signal.signal(s, _stop)
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def _worker_signals():
    """A worker leaves Ctrl-C, which the terminal sends to every process of the command, to the main process,
    which terminates the pool (SIGTERM): the worker's run unwinds (its temporary folder removed) and it exits."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def _one(job):
    import tempfile

    import torch

    label, cfg, threads = job
    torch.set_num_threads(threads)
    from kernel_attention.tasks.runner import prepare
    from kernel_attention.training import Trainer

    t0 = time.time()
    task, train_cfg = prepare(cfg)
    with tempfile.TemporaryDirectory() as d:
        summary = Trainer(task, train_cfg, d).fit()
    m = summary["final"]["test"]
    return label, m, time.time() - t0


def run(args) -> int:
    import math
    from multiprocessing import Pool

    if args.out and not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        print(f"kernel-attention run: --out {args.out}: its folder does not exist", file=sys.stderr)
        return 2
    t0 = time.time()
    jobs = []
    for kernel, position, at_input in GRID:
        label = (kernel, "absolute at input (Vaswani)" if at_input else position)
        jobs.append((label, config(args.task, kernel, position, at_input, args.steps, args.seed, args.test_size),
                     args.threads))
    with _stops_at_once():
        if args.jobs > 1:
            os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
            with Pool(args.jobs, initializer=_worker_signals) as pool:  # leaving it terminates the workers
                results = pool.map(_one, jobs, chunksize=1)
        else:
            results = [_one(j) for j in jobs]
    lines = [f"task `{args.task}` (lengths 4-7, 8 symbols), 1+1-layer encoder-decoder d=32, {args.steps} steps, "
             f"seed {args.seed}; test set of {args.test_size}",
             "",
             "| kernel | position | exact match | token accuracy | test loss | train s |",
             "|---|---|---:|---:|---:|---:|"]
    for (kernel, position), m, secs in results:
        loss = m["loss"]
        loss_s = f"{loss:.3f}" if math.isfinite(loss) else "diverged"
        lines.append(f"| {kernel} | {position} | {m['exact_match']:.3f} | {m['token_accuracy']:.3f} | {loss_s} | "
                     f"{secs:.0f} |")
    lines.append("")
    # the numbers depend on the CPU's matrix kernels (their rounding), so the table names what ran it
    lines.append(f"wall time {time.time() - t0:.0f} s on {numerics()}, {args.jobs} workers of {args.threads} "
                 f"thread(s)")
    table = "\n".join(lines)
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")
    return 0
