"""Attention choices matter on `reverse` (the `run` command's claim), as a test.

Slow (4 runs of 300 steps: 2-7 minutes on 2 cores depending on load): marked ``slow``, run with
`python -m pytest -m slow tests/tasks/test_synthetic_grid.py` (or KA_SLOW=1).
"""

import pytest

from kernel_attention.cli.run import config
from kernel_attention.tasks.runner import prepare
from kernel_attention.training import Trainer

pytestmark = pytest.mark.slow


def exact_match(tmp_path, name, kernel, position, at_input, steps=300):
    cfg = config("reverse", kernel, position, at_input, steps, seed=0)
    cfg["train"]["progress"] = False
    task, train_cfg = prepare(cfg)
    summary = Trainer(task, train_cfg, tmp_path / name).fit()
    return summary["final"]["test"]


def test_positions_solve_reverse_and_none_cannot(tmp_path):
    none = exact_match(tmp_path, "none", "exp", "none", False)
    absolute = exact_match(tmp_path, "abs", "exp", "none", True)
    xl = exact_match(tmp_path, "xl", "exp", "xl", False)
    assert none["exact_match"] < 0.1             # without positions the encoder sees a set
    assert absolute["exact_match"] > 0.8
    assert xl["exact_match"] > 0.5               # relative positions too (distances to <eos> / <bos>); 0.78-0.84 measured
    linear = exact_match(tmp_path, "linear", "linear", "none", True)
    assert linear["exact_match"] < absolute["exact_match"] - 0.1   # the linear kernel's failure is visible
