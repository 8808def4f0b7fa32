"""Training throughput of one config eager and with ``train.compile=true`` (``torch.compile(model,
dynamic=True)``): the same updates (no evaluation, no checkpoints) in two runs one after the other, each
printing its progress lines (tokens/s per logged step) and its total wall time, which for the compiled run
includes the compilation.

    python benchmarks/train_compile.py CONFIG --steps 150 [--threads 1]

CONFIG is a training config, e.g. a study cell's ``config.yaml``
(``studies/dissection-positions-converged/cells/t1-nmt__vaswani__nmt__s1/config.yaml``).
"""

import argparse
import tempfile
import time

import torch
import yaml

from kernel_attention.tasks.runner import train


def run(cfg: dict, compiled: bool, out: str) -> float:
    """Wall seconds of training ``cfg`` with ``train.compile`` set to ``compiled``."""
    cfg = {**cfg, "train": {**cfg["train"], "compile": compiled}}
    t = time.perf_counter()
    train(cfg, out, resume=False)
    return time.perf_counter() - t


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    cfg = yaml.safe_load(open(a.config))
    cfg["train"].update(max_steps=a.steps, eval_every=0, checkpoint_every=0, patience=None)
    cfg.setdefault("eval", {})["max_sentences"] = 5  # the final evaluation: a few sentences, not the split
    for compiled in (False, True):
        with tempfile.TemporaryDirectory() as out:
            wall = run(cfg, compiled, out)
        print(f"{'compiled' if compiled else 'eager'}: {a.steps} updates in {wall:.1f} s "
              f"(torch {torch.__version__}, {a.threads} thread(s))", flush=True)


if __name__ == "__main__":
    main()
