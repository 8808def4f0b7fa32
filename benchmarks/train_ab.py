"""Training wall time of one config under two settings, A and B, run alternately: the same updates (no
evaluation, no checkpoints) each time, each run printing its progress lines, its total wall time and that of its
updates (without the final evaluation), which the last line compares: B's mean over A's.  The
process takes the allocator settings of the command line (:func:`kernel_attention.malloc.configure`).

    python benchmarks/train_ab.py CONFIG --compile [--steps 150] [--repeats 1] [--threads 1]
    python benchmarks/train_ab.py CONFIG --policy sdpa_float32_max_keys=None [--steps 80] [--repeats 2]
    python benchmarks/train_ab.py CONFIG --per-parameter-adam [--steps 40] [--repeats 2]
    python benchmarks/train_ab.py CONFIG --whole-shaw-table [--steps 60] [--repeats 2]

``--compile``: A eager, B with ``train.compile=true`` (``torch.compile(model, dynamic=True)``; B's wall time
includes the compilation).  ``--policy FIELD=VALUE``: A the device policy as shipped, B with one field of the
CPU's :class:`~kernel_attention.backends.policy.DevicePolicy` replaced (an integer, or None).
``--per-parameter-adam``: A the trainer's fused Adam, B PyTorch's per-parameter loop (the CPU's default
implementation; :data:`kernel_attention.training.optimizer.FUSED_DEVICES` emptied).  ``--whole-shaw-table``: A
Shaw's tables read at the rows the distances reach (:meth:`~kernel_attention.positions.ShawPosition.reach`), B
the whole (2c + 1)-row tables, for a config with ``position: shaw``.  Runs alternate
(A, B, A, B, ...) so that a change in the machine's load falls on both.

CONFIG is a training config, e.g. a study cell's ``config.yaml``
(``studies/dissection-kernels-converged/cells/t2-nmt__exp__nmt-asym__s1/config.yaml``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import statistics
import tempfile
import time
from collections.abc import Iterator

import torch
import yaml

from kernel_attention.malloc import configure
from kernel_attention.positions import ShawPosition
from kernel_attention.tasks.runner import train
from kernel_attention.training import optimizer as optimizer_module
from kernel_attention.training.run_log import read_metrics

# the module, not the function of the same name that kernel_attention.backends exports
policy_module = importlib.import_module("kernel_attention.backends.policy")


def policy_field(text: str) -> tuple[str, int | None]:
    """``FIELD=VALUE`` of ``--policy``: a DevicePolicy field and an integer or None."""
    name, sep, value = text.partition("=")
    fields = {f.name for f in dataclasses.fields(policy_module.DevicePolicy)}
    if not sep or name not in fields:
        raise argparse.ArgumentTypeError(f"expected FIELD=VALUE with FIELD one of {sorted(fields)}, got {text!r}")
    if value == "None":
        return name, None
    try:
        return name, int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{name}: expected an integer or None, got {value!r}") from None


@contextlib.contextmanager
def cpu_policy(field: str, value: int | None) -> Iterator[None]:
    """The CPU's device policy with ``field`` set to ``value`` for the duration."""
    shipped = policy_module.POLICIES["cpu"]
    policy_module.POLICIES["cpu"] = dataclasses.replace(shipped, **{field: value})
    try:
        yield
    finally:
        policy_module.POLICIES["cpu"] = shipped


@contextlib.contextmanager
def per_parameter_adam() -> Iterator[None]:
    """The trainer's optimiser on no device's fused implementation for the duration."""
    fused = optimizer_module.FUSED_DEVICES
    optimizer_module.FUSED_DEVICES = ()
    try:
        yield
    finally:
        optimizer_module.FUSED_DEVICES = fused


@contextlib.contextmanager
def whole_shaw_table() -> Iterator[None]:
    """Shaw's position scheme reading the whole table at every call for the duration."""
    reach = ShawPosition.reach
    ShawPosition.reach = lambda self, tq, tk, offset: self.clip
    try:
        yield
    finally:
        ShawPosition.reach = reach


def wall(cfg: dict, context: contextlib.AbstractContextManager) -> tuple[float, float]:
    """Wall seconds of training ``cfg`` from scratch inside ``context``: the whole run, and its updates alone
    (the last train record's ``wall_s``: without the final evaluation; the whole run where there is none)."""
    with tempfile.TemporaryDirectory() as out, context:
        t = time.perf_counter()
        train(cfg, out, resume=False)
        total = time.perf_counter() - t
        updates = max((r["wall_s"] for r in read_metrics(out) if r["split"] == "train"), default=total)
        return total, updates


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--compile", action="store_true", help="A eager, B with train.compile=true")
    which.add_argument("--policy", type=policy_field, metavar="FIELD=VALUE",
                       help="A the CPU policy as shipped, B with FIELD set to VALUE (an integer or None)")
    which.add_argument("--per-parameter-adam", action="store_true",
                       help="A the trainer's fused Adam, B the per-parameter implementation")
    which.add_argument("--whole-shaw-table", action="store_true",
                       help="A Shaw's tables cut to the rows the distances reach, B the whole tables")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--repeats", type=int, default=1, help="runs of each setting")
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    malloc = configure()  # the allocator settings `kernel-attention train` runs with
    torch.set_num_threads(a.threads)
    cfg = yaml.safe_load(open(a.config))
    cfg["train"].update(max_steps=a.steps, eval_every=0, checkpoint_every=0, patience=None)
    if cfg["task"]["name"] == "translation":  # its final evaluation: a few sentences, not the split
        cfg.setdefault("eval", {})["max_sentences"] = 5
    if a.compile:
        names = ("eager", "compiled")
        settings = [(cfg, contextlib.nullcontext), ({**cfg, "train": {**cfg["train"], "compile": True}},
                                                    contextlib.nullcontext)]
    elif a.per_parameter_adam:
        names = ("fused Adam", "per-parameter Adam")
        settings = [(cfg, contextlib.nullcontext), (cfg, per_parameter_adam)]
    elif a.whole_shaw_table:
        names = ("tables cut to the distances", "whole tables")
        settings = [(cfg, contextlib.nullcontext), (cfg, whole_shaw_table)]
    else:
        field, value = a.policy
        names = (f"{field}={getattr(policy_module.POLICIES['cpu'], field)} (shipped)", f"{field}={value}")
        settings = [(cfg, contextlib.nullcontext), (cfg, lambda: cpu_policy(field, value))]
    walls: tuple[list[float], list[float]] = ([], [])  # the updates' seconds of each run
    for _ in range(a.repeats):
        for i, (c, context) in enumerate(settings):
            total, updates = wall(c, context())
            walls[i].append(updates)
            print(f"{names[i]}: {a.steps} updates in {total:.1f} s, {updates:.1f} s without the final evaluation "
                  f"(torch {torch.__version__}, {a.threads} thread(s), malloc {malloc})", flush=True)
    print(f"{names[1]} / {names[0]}: {statistics.mean(walls[1]) / statistics.mean(walls[0]):.2f} "
          f"(mean wall time of the updates, {a.repeats} run(s) each)")


if __name__ == "__main__":
    main()
