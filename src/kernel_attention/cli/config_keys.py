"""The config keys a command line can override, as ``--help`` lists them.

``train`` and ``evaluate`` take ``section.key=value`` overrides; the model and task keys are in their
registries' descriptions, and this module lists the rest: every ``train.*`` field with its default and what
it accepts, the ``eval.*`` options of each task family, and the ``data.*`` keys.  It reads them from the
code that checks them (:class:`~kernel_attention.training.config.TrainConfig`, each task's
``EVAL_DEFAULTS``, :data:`~kernel_attention.tasks.data_source.DATA_KEYS`), so ``--help`` cannot drift from
what is accepted.
"""

from __future__ import annotations

import dataclasses
import textwrap

__all__ = ["describe_config_keys"]

# What the train fields do that their accepted values do not say.
_TRAIN_NOTES = {
    "progress": "tqdm bar; null = a bar on a terminal, else a plain line per logged step to stderr; "
                "false = neither",
    "schedule": "constant, cosine[:warmup=N], inverse_sqrt:warmup=N, ...",
    "optimizer": "adam | adamw", "precision": "fp32 | bf16 | fp16 (fp16 needs CUDA; bf16 runs on a CPU or CUDA)",
    "test_best": "at the end also evaluate best.pt on test", "tensorboard": "also write TensorBoard events",
    "device": "null = cuda:LOCAL_RANK if available, else cpu",
    "compile": "train through torch.compile(model, dynamic=True); evaluation runs eager",
    "stop_after": "stop after this step without saving (simulates a kill)",
    "max_steps": "optimiser updates", "log_every": "steps between train records (and progress lines)",
    "eval_every": "steps between valid evaluations",
    "patience": "stop after this many evaluations without a better valid metric (null = never)",
    "checkpoint_every": "steps between last.pt writes",
    "keep_last": "also keep the weights of the last N checkpoint_every checkpoints as step_<k>.pt "
                 "(kernel-attention average)",
    "checkpoint_minutes": "also write last.pt this often", "accum_steps": "micro-batches per update",
}

_EVAL_NOTES = {
    "synthetic": "beam search width, length penalty, decode up to the target length + max_extra",
    "lm": "Transformer-XL evaluation: segment length, memory, clamp length (null = the training values); "
          "sequences per batch",
    "translation": "beam width, length penalty, max length a*src+b, tokenized or sacrebleu BLEU, evaluate only "
                   "the first max_sentences (null = all), sentences per batch",
}


def _yaml(v) -> str:
    """A default as a YAML file or an override writes it (null, true, [0.9, 0.999], 'adam')."""
    if v is None or isinstance(v, bool):
        return {None: "null", True: "true", False: "false"}[v]
    return repr(v)


def _wrap(text: str) -> str:
    return textwrap.fill(text, width=100, initial_indent="  ", subsequent_indent="      ")


def describe_config_keys() -> str:
    """The ``train.*``, ``eval.*`` and ``data.*`` keys, one per line (wrapped, never cut)."""
    from kernel_attention.tasks import language_modeling, synthetic, translation
    from kernel_attention.tasks.data_source import DATA_KEYS
    from kernel_attention.training.config import _NUMBERS, TrainConfig

    lines = ["config keys (section.key=value; the task and model keys: `kernel-attention train --help`):"]
    for f in dataclasses.fields(TrainConfig):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        default = list(default) if isinstance(default, tuple) else default
        what = "; ".join(x for x in (_NUMBERS.get(f.name, (None, None, ""))[2], _TRAIN_NOTES.get(f.name, "")) if x)
        lines.append(_wrap(f"train.{f.name} = {_yaml(default)}" + (f"  ({what})" if what else "")))
    for name, module in (("synthetic", synthetic), ("lm", language_modeling), ("translation", translation)):
        keys = ", ".join(f"eval.{k} = {_yaml(v)}" for k, v in module.EVAL_DEFAULTS.items())
        lines.append(_wrap(f"task {name}: {keys}  ({_EVAL_NOTES[name]})"))
    lines.append(_wrap("tasks classification, regression, node_classification: no eval keys"))
    for k, v in DATA_KEYS.items():
        lines.append(_wrap(f"data.{k}: {v}"))
    lines.append(_wrap("seed: the run's seed (train.seed defaults to it); run.name, run.dir: where outputs go; "
                       "run.imports: modules (names or .py files) that register kernels, positions or filters of "
                       "your own"))
    return "\n".join(lines)
