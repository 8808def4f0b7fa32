"""From a config to a trained run and back: what the ``train`` / ``evaluate`` / ``translate`` / ``generate``
commands share.

    cfg = load_config("configs/synthetic/reverse.yaml", ["model.encoder_attention.kernel=rbf"])
    task, train_cfg = prepare(cfg)          # every name and combination checked; nothing trained yet
    summary = train(cfg, "runs/reverse")    # Trainer.fit(); the resolved config is stored in checkpoints
    task, model, cfg = load_run("runs/reverse/best.pt")

:func:`prepare` fails *before any training* on: unknown sections / options / names (task, model, kernel,
position, filter, dataset, schedule), impossible combinations (``value_position=relative`` without
``position=shaw``, shared embeddings without a joint vocabulary, ...) and missing data files.  The model is
built once on the ``meta`` device for this (on the CPU when a part cannot be built there), so even
paper-size models are checked quickly and without memory.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Mapping

import torch

from kernel_attention.config import ConfigError, dump_config, validate_sections
from kernel_attention.extensions import with_resolved_imports
from kernel_attention.data.files import MissingDataError
from kernel_attention.tasks import TASKS, build_task
from kernel_attention.tasks.resume_check import check_resume_config
from kernel_attention.training import TrainConfig, Trainer, load_checkpoint
from kernel_attention.training.checkpoint import load_model_state
from kernel_attention.training.task import Task

__all__ = ["prepare", "train", "train_config", "load_run", "run_dir_of", "build_checked", "build_run",
           "merge_overrides"]


def train_config(cfg: Mapping[str, Any]) -> TrainConfig:
    """The config's TrainConfig: its ``train`` section, with the top-level ``seed`` where the section has none."""
    section = dict(cfg.get("train") or {})
    if "seed" in cfg and "seed" not in section:
        section["seed"] = int(cfg["seed"])
    if "max_steps" not in section and "max_epochs" not in section:
        raise ConfigError("the train section needs max_steps or max_epochs")
    return TrainConfig.from_dict(section)


def prepare(cfg: Mapping[str, Any], check_model: bool = True) -> tuple[Task, TrainConfig]:
    """The task and TrainConfig of a config, after checking everything that can be checked up front."""
    train_cfg = train_config(cfg)
    task = build_task(cfg)
    if check_model:
        if hasattr(task, "prepare_data"):
            task.prepare_data()  # real tensors: load before entering the meta-device context
        build_checked(task.build_model)  # attention configs, sizes and data files are checked here
    return task, train_cfg


def build_checked(build):
    """Run a model constructor for its checks, on the ``meta`` device when every part supports it (no
    memory, milliseconds even at paper sizes), else on the CPU; returns nothing."""
    try:
        with torch.device("meta"):
            build()
    except (RuntimeError, NotImplementedError) as e:
        if "meta" not in str(e):
            raise
        build()  # some constructor computes with tensors (e.g. a mask check); build it for real


def run_dir_of(cfg: Mapping[str, Any], default: str | Path | None = None) -> Path:
    run = cfg.get("run") or {}
    if run.get("dir"):
        return Path(run["dir"])
    if default is not None:
        return Path(default)
    return Path("runs") / str(run.get("name") or "run")


def train(cfg: Mapping[str, Any], run_dir: str | Path, resume: bool = True,
          allow_config_change: bool = False) -> dict[str, Any]:
    """Check, then train; returns the Trainer summary with the final valid/test metrics.

    A resume from ``run_dir/last.pt`` whose stored config differs from ``cfg`` (other than in
    :data:`~kernel_attention.tasks.resume_check.FREE_KEYS`) fails naming the changed keys, unless
    ``allow_config_change``; so does one whose checkpoint is damaged or from another model
    (:class:`~kernel_attention.training.checkpoint.CheckpointError`).  ``config.yaml`` is written only once
    the resume is accepted, so a refused command leaves the run directory as it was."""
    task, train_cfg = prepare(cfg)
    cfg = with_resolved_imports(cfg)  # the stored config finds its modules from any working directory
    run_dir = Path(run_dir)

    def check(ck: dict[str, Any]) -> None:
        stored = (ck.get("extra") or {}).get("config")
        check_resume_config(stored, cfg, allow_config_change, f"run directory {run_dir} (last.pt, step {ck.get('step')})")

    trainer = Trainer(task, train_cfg, run_dir, resume=resume, extra={"config": copy.deepcopy(dict(cfg))},
                      resume_check=check)
    dump_config(cfg, run_dir)
    if hasattr(task, "save_artifacts"):  # vocabulary / BPE next to the checkpoints, which name the files
        trainer.extra["artifacts"] = task.save_artifacts(run_dir)
    summary = trainer.fit()
    if trainer.is_main:  # the weights also as RUN/model.safetensors, which other tools load without pickle
        import sys

        from kernel_attention.load import export
        try:
            export(run_dir)
        except (ValueError, OSError, RuntimeError) as e:  # the run is trained and its checkpoints kept all the same
            print(f"kernel-attention: warning: model.safetensors not written ({e}); "
                  f"`kernel-attention export {run_dir}` retries", file=sys.stderr)
    return summary


def load_run(checkpoint: str | Path, overrides: Mapping[str, Any] | None = None,
             device: str | torch.device = "cpu") -> tuple[Task, torch.nn.Module, dict[str, Any]]:
    """Rebuild the task and model of a checkpoint (``last.pt`` / ``best.pt``) written by :func:`train`.

    ``overrides`` replaces sections of the stored config (e.g. ``{"eval": {"beam": 5}}``).  The vocabulary /
    BPE files that :func:`train` wrote into the run directory (named by the checkpoint's ``artifacts``) are
    used when present, so the training data is not needed; a checkpoint without them (written before runs
    kept them) rebuilds them from the training split as it was trained."""
    path = Path(checkpoint)
    if path.is_dir():
        path = path / "best.pt" if (path / "best.pt").is_file() else path / "last.pt"
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    ck = load_checkpoint(path, map_location=device)
    cfg = dict((ck.get("extra") or {}).get("config") or {})
    if not cfg:
        raise ConfigError(f"checkpoint {path} has no stored config (was it written by `kernel-attention train`?)")
    cfg = merge_overrides(cfg, overrides)
    task, model = build_run(cfg, (ck.get("extra") or {}).get("artifacts"), path)
    load_model_state(model, ck["model"], path)
    task.device = torch.device(device)
    model.to(task.device).eval()
    return task, model, cfg


def merge_overrides(cfg: Mapping[str, Any], overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """``cfg`` with ``overrides`` merged in at every depth (``{"model": {"encoder_attention": {"position":
    "shaw"}}}`` changes that key alone, as ``model.encoder_attention.position=shaw`` does for ``train``); a value
    that is no mapping replaces what was there.  The sections are then checked as a config file's are."""
    def merged(old: Any, new: Any) -> Any:
        if not (isinstance(old, Mapping) and isinstance(new, Mapping)):
            return new
        return {**old, **{k: merged(old.get(k), v) for k, v in new.items()}}

    out = merged(dict(cfg), dict(overrides or {}))
    validate_sections(out)
    return out


def build_run(cfg: Mapping[str, Any], artifacts: Mapping[str, Any] | None,
              path: Path) -> tuple[Task, torch.nn.Module]:
    """The task and (untrained) model of a stored run's config, with the vocabulary / BPE files named by
    ``artifacts`` in ``path``'s folder (else rebuilt from the training split)."""
    task = build_task(cfg)
    if artifacts and hasattr(task, "load_artifacts"):
        try:
            task.load_artifacts(path.parent, artifacts)  # the run's own vocabulary / BPE: no training data needed
        except (OSError, ValueError, KeyError) as e:
            raise MissingDataError(f"the vocabulary / BPE files of {path.parent} cannot be read ({e}); "
                                   f"they were written there when the run started") from None
    try:
        model = task.build_model()
    except MissingDataError as e:
        if artifacts:
            raise
        if not hasattr(task, "save_artifacts"):
            kind = TASKS.validate(cfg["task"])[0]
            raise MissingDataError(f"the model of {path} is sized from its data (a {kind} run keeps no vocabulary "
                                   f"files: its features and classes come from the data), which is missing: "
                                   f"{e}") from None
        raise MissingDataError(f"{path} was written before runs kept their vocabulary / BPE in the run directory, "
                               f"so they are rebuilt from the training data, which is missing: {e}") from None
    return task, model
