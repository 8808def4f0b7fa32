"""``synthetic-smoke``: a two-cell study on the synthetic copy task (no data files; seconds on a CPU).

Rows: the exponential and the RBF kernel in a 1+1-layer translation model; protocol best validation of
N seeds.  It exercises the whole study path (cells, resume, CSV, table, figures) for tests and for a
quick check of an installation: ``kernel-attention study synthetic-smoke --out /tmp/studies``.
"""

from __future__ import annotations

import copy

from kernel_attention.study.core import Cell, Study, StudyOptions, TableSpec, register_study
from kernel_attention.study.figures import training_curves

_ROWS = [("exp", "exponential"), ("rbf", "RBF")]
STEPS = {"small": 6, "paper": 300}


def _config(kernel: str, steps: int) -> dict:
    att = {"kernel": kernel, "position": "absolute"}
    return {"task": {"name": "synthetic", "kind": "copy", "vocab": 6, "min_len": 3, "max_len": 4, "batch_size": 8,
                     "train_size": 64, "valid_size": 16, "test_size": 16},
            "model": {"name": "translation", "d_model": 16, "n_heads": 2, "d_ff": 16, "enc_layers": 1,
                      "dec_layers": 1, "dropout": 0.0, "pe_at_input": False, "encoder_attention": att,
                      "cross_attention": att, "decoder_attention": att},
            "train": {"max_steps": steps, "lr": 3e-3, "eval_every": max(1, steps // 2), "checkpoint_every": 2},
            "eval": {"beam": 1}, "seed": 0}


def _build(opts: StudyOptions):
    steps = STEPS[opts.scale]
    cells = []
    for rid, _ in _ROWS:
        for s in range(opts.seeds or 1):
            cfg = copy.deepcopy(_config(rid, steps))
            cfg["seed"] = s
            cells.append(Cell("synthetic-smoke", "copy", rid, "exact", s, cfg))
    return cells, ([f"train.max_steps = {steps}"] if opts.scale == "small" else [])


def _figures(fig_dir, cells, dir_of, results):
    return [p for p in [training_curves(fig_dir, SMOKE.tables[0], cells, dir_of, results)] if p]


def _metric() -> str:
    from kernel_attention.tasks.synthetic import SyntheticSeq2SeqTask
    return SyntheticSeq2SeqTask.metric_for_selection


SMOKE = register_study(Study(
    "synthetic-smoke", "Synthetic smoke study: copy task, exp vs RBF kernel", "best_valid",
    [TableSpec("copy", "copy task", _metric(), True, _ROWS, [("exact", "valid metric")], {})],
    _build, {"small": 1, "paper": 1}, _figures))
