"""Task families: each implements :class:`kernel_attention.training.task.Task` for one kind of data.

    synthetic.py            synthetic seq2seq (copy, reverse, sort, recall, translation), no download
    language_modeling.py    word-level LM with Transformer-XL memory (perplexity)
    translation.py          parallel text + BPE (BLEU with greedy / beam search)
    classification.py       sentence classification (accuracy)
    regression.py           IKA regression, the dataset as one sequence (RMSE)
    node_classification.py  Planetoid node classification with GAT layers (accuracy)

``TASKS.create(config["task"], model=config.get("model"), data=config.get("data"), eval=config.get("eval"),
seed=config.get("seed", 0))`` builds a task from a config; :func:`build_task` does exactly that.
"""

from __future__ import annotations

import inspect
from typing import Any, Mapping

from kernel_attention.extensions import import_extensions
from kernel_attention.registry import Param, Registry, SpecError
from kernel_attention.tasks.classification import ClassificationTask
from kernel_attention.tasks.data_source import check_data_section
from kernel_attention.tasks.language_modeling import LanguageModelingTask
from kernel_attention.tasks.node_classification import NodeClassificationTask
from kernel_attention.tasks.regression import RegressionTask
from kernel_attention.tasks.synthetic import KINDS, SyntheticSeq2SeqTask
from kernel_attention.tasks.translation import TranslationTask
from kernel_attention.training.task import Task

__all__ = ["TASKS", "build_task", "SyntheticSeq2SeqTask", "LanguageModelingTask", "TranslationTask",
           "ClassificationTask", "RegressionTask", "NodeClassificationTask"]

TASKS = Registry("task", base=Task)

_pos = dict(check=lambda x: x > 0, rule="> 0")
_nonneg = dict(check=lambda x: x >= 0, rule=">= 0")

TASKS.register("synthetic", [
    Param("kind", str, "reverse", choices=KINDS), Param("vocab", int, 10, **_pos),
    Param("min_len", int, 4, **_pos), Param("max_len", int, 8, **_pos), Param("batch_size", int, 64, **_pos),
    Param("train_size", int, 6400, **_pos), Param("valid_size", int, 256, **_pos),
    Param("test_size", int, 256, **_pos),
    Param("label_smoothing", float, 0.0, check=lambda x: 0 <= x < 1, rule="in [0, 1)"),
    Param("pairs", int, 4, doc="recall: key-value pairs", **_pos),
    Param("block", int, 3, doc="translation: reordering window", **_pos),
], doc="synthetic seq2seq (copy/reverse/sort/recall/translation); exact match")(SyntheticSeq2SeqTask)

TASKS.register("lm", [Param("batch_size", int, 60, **_pos), Param("tgt_len", int, 150, **_pos)],
               doc="language modelling with Transformer-XL memory; perplexity")(LanguageModelingTask)
TASKS.register("translation", [
    Param("max_tokens", int, 4096, **_pos),
    Param("label_smoothing", float, 0.1, check=lambda x: 0 <= x < 1, rule="in [0, 1)"),
    Param("bpe_vocab_size", int, 10000, **_pos), Param("joint_bpe", bool, True), Param("max_len", int, 250, **_pos),
], doc="translation on parallel text with BPE; BLEU (greedy / beam)")(TranslationTask)
TASKS.register("classification", [
    Param("batch_size", int, 50, **_pos), Param("fold", int, 0, **_nonneg), Param("folds", int, 10, **_pos),
    Param("max_len", int, 100, **_pos), Param("min_freq", int, 1, **_pos),
], doc="sentence classification; accuracy")(ClassificationTask)
TASKS.register("regression", [
    Param("split", int, 0, **_nonneg), Param("n_splits", int, 10, **_pos),
    Param("train_fraction", float, 0.9, check=lambda x: 0 < x < 1, rule="in (0, 1)"),
    Param("scale", str, "minmax", choices=("minmax", "standard", "none")),
    Param("valid_fraction", float, 0.1, check=lambda x: 0 <= x < 1, rule="in [0, 1)"),
], doc="IKA regression, the dataset as one sequence; RMSE")(RegressionTask)
TASKS.register("node_classification", [], doc="Planetoid node classification with GAT; accuracy")(
    NodeClassificationTask)


def _reads_data(task: str) -> bool:
    """Whether the task of this name takes a ``data:`` section (a dataset), or makes its own data."""
    return "data" in inspect.signature(TASKS.entry(task).factory).parameters


def build_task(config: Mapping[str, Any]) -> Task:
    """The task a config describes (sections ``task``, ``model``, ``data``, ``eval``, ``seed``)."""
    import_extensions((config.get("run") or {}).get("imports"))  # the parts of the user's that the config names
    if "task" not in config or config["task"] is None:
        raise SpecError(f"the config has no 'task' section; accepted task names: {', '.join(TASKS.names())}")
    check_data_section(config.get("data"))  # every task, also those that read no data: no key is ignored
    name = TASKS.validate(config["task"])[0]
    if (config.get("data") or {}).get("dataset") is not None and not _reads_data(name):
        readers = ", ".join(n for n in TASKS.names() if _reads_data(n))
        raise SpecError(f"task {name!r} makes its own data and reads no data.dataset; leave it out (the tasks "
                        f"that read one: {readers})")
    return TASKS.create(config["task"], model=config.get("model"), data=config.get("data"),
                        eval=config.get("eval"), seed=int(config.get("seed", 0) or 0))
