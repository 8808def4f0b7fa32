"""A trained run in Python, in one call, and its weights as ``model.safetensors``.

    import kernel_attention as ka
    model, tokenizer = ka.load("runs/my-lm")      # or: run = ka.load("runs/my-lm"); run.model, run.vocab
    run = ka.load("runs/en-fr", device="cuda")    # run.task.translate_lines(run.model, ["it is the cat"])

:func:`load` reads a run directory written by ``kernel-attention train`` (``best.pt`` when present, else
``last.pt``, else ``model.safetensors``), or one of those files by path, with the vocabulary / BPE files
kept beside them: no training data is needed for language-model and translation runs.  The model comes
back in eval mode on ``device`` (the CPU by default).

:func:`export` writes the weights of a run as ``RUN/model.safetensors`` (``train`` does it when a run
finishes; ``kernel-attention export RUN`` for a run written before): a file other tools load without
pickle.  Its metadata holds the run's config, its vocabulary file names and their contents as JSON
(``config``, ``artifacts``, ``files``), so :func:`load` rebuilds the model from the file alone (an export
written to another folder also gets a copy of the vocabulary files there, which other tools may read).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

import torch

__all__ = ["LoadedRun", "load", "export", "artifact_files", "copy_artifacts", "SAFETENSORS_NAME"]

SAFETENSORS_NAME = "model.safetensors"
_FORMAT = "kernel-attention"


@dataclass
class LoadedRun:
    """What :func:`load` returns; unpacks as ``model, tokenizer = ka.load(RUN)``.

    ``model``: the trained ``nn.Module`` (eval mode); ``config``: the run's config (a dict, the stored one
    with any overrides); ``task``: the task object (its ``evaluate``, ``generate``, ``translate_lines``...);
    ``vocab``: the vocabulary (translation: the target one, which is also the source one with a joint
    BPE); ``bpe``: the source BPE model of a translation run, else None; ``tokenizer``: the vocabulary, or
    for translation the :class:`~kernel_attention.data.parallel.TranslationData` holding BPE models and
    vocabularies; ``path``: the file the weights were read from."""

    model: torch.nn.Module
    config: dict[str, Any]
    task: Any
    path: Path
    vocab: Any = None
    bpe: Any = None
    tokenizer: Any = field(default=None, repr=False)

    def __iter__(self) -> Iterator[Any]:
        yield self.model
        yield self.tokenizer


def _find(run: str | Path) -> Path:
    path = Path(run)
    if path.is_dir():
        for name in ("best.pt", "last.pt", SAFETENSORS_NAME):
            if (path / name).is_file():
                return path / name
        raise FileNotFoundError(f"run directory {path} holds no best.pt, last.pt or {SAFETENSORS_NAME}")
    if not path.is_file():
        raise FileNotFoundError(f"no run directory or checkpoint at {path}: it does not exist")
    return path


def _tokenizers(task: Any) -> tuple[Any, Any, Any]:
    from kernel_attention.tasks.translation import TranslationTask
    if isinstance(task, TranslationTask):
        d = task.prepared
        return d.tgt_vocab, d.src_bpe, d
    vocab = getattr(task, "vocab", None)
    return vocab, None, vocab


def _read_safetensors(path: Path, overrides: Mapping[str, Any] | None, device: str | torch.device):
    from safetensors import safe_open
    from safetensors.torch import load_model

    from kernel_attention.config import ConfigError
    from kernel_attention.tasks.runner import build_run, merge_overrides

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    if meta.get("format") != _FORMAT or "config" not in meta:
        raise ConfigError(f"{path} was not written by kernel-attention export (its metadata has no run config)")
    cfg = merge_overrides(json.loads(meta["config"]), overrides)
    artifacts = json.loads(meta.get("artifacts") or "null")
    files = json.loads(meta.get("files") or "{}")
    if all((path.parent / name).is_file() for name in files):
        task, model = build_run(cfg, artifacts, path)
    else:  # the file travelled alone: its vocabulary / BPE files from its metadata
        with tempfile.TemporaryDirectory() as folder:
            for name, text in files.items():
                (Path(folder) / name).write_text(text, encoding="utf-8")
            task, model = build_run(cfg, artifacts, Path(folder) / path.name)
    missing, unexpected = load_model(model, str(path), strict=False)
    if missing or unexpected:
        raise ConfigError(f"{path} was written by a different model than its config builds: "
                          f"{len(missing)} weights missing, {len(unexpected)} unexpected")
    task.device = torch.device(device)
    model.to(task.device).eval()
    return task, model, cfg


def load(run: str | Path, device: str | torch.device = "cpu",
         overrides: Mapping[str, Any] | None = None) -> LoadedRun:
    """Load a trained run: a run directory (``best.pt``, else ``last.pt``, else ``model.safetensors``) or
    a ``.pt`` / ``.safetensors`` file written by ``train`` / ``export``.

    ``overrides`` changes sections of the stored config, e.g. ``{"eval": {"beam": 5}}``.  Raises
    ``FileNotFoundError`` when there is nothing to load, and ``ValueError`` (a ``CheckpointError`` or
    ``ConfigError``) with one line on a file that cannot be used."""
    from kernel_attention.tasks.runner import load_run

    path = _find(run)
    if path.suffix == ".safetensors":
        task, model, cfg = _read_safetensors(path, overrides, device)
    else:
        task, model, cfg = load_run(path, overrides, device)
    vocab, bpe, tokenizer = _tokenizers(task)
    return LoadedRun(model=model, config=cfg, task=task, path=path, vocab=vocab, bpe=bpe, tokenizer=tokenizer)


def artifact_files(artifacts: Any, source: Path) -> list[str]:
    """The names of the files in ``source`` that a run's ``artifacts`` (a mapping, possibly nested) name."""
    names = []
    stack = [artifacts]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, str) and (source / item).is_file():
            names.append(item)
    return names


def copy_artifacts(artifacts: Any, source: Path, folder: Path) -> list[str]:
    """Copy the files a run's ``artifacts`` name (its vocabulary and BPE files, kept beside its checkpoints in
    ``source``) into ``folder``, where a checkpoint or export written there is loaded from; returns their names.
    A file of the same name and content already there is kept; one of other content (another run's vocabulary)
    is an error, since the file written would then load with it."""
    import filecmp
    import shutil

    names = artifact_files(artifacts, source)
    if folder.resolve() != source.resolve():
        for name in names:
            if not (folder / name).exists():
                shutil.copyfile(source / name, folder / name)
            elif not filecmp.cmp(source / name, folder / name, shallow=False):
                raise FileExistsError(f"{folder / name} is another run's (its content differs from {source / name}): "
                                      f"write to a folder of this run's files or an empty one")
    return names


def export(run: str | Path, out: str | Path | None = None) -> Path:
    """Write the weights of a run (its ``best.pt``, else ``last.pt``, or the ``.pt`` given) as a
    safetensors file, by default ``model.safetensors`` in the run directory; returns its path.  The
    metadata holds ``format``, ``config`` and ``artifacts`` (JSON), ``files`` (the contents of the vocabulary /
    BPE files ``artifacts`` names, JSON ``{name: text}``), ``step`` and ``source`` (the checkpoint's file name)."""
    from safetensors.torch import save_model

    from kernel_attention.atomic_write import replacing
    from kernel_attention.tasks.runner import load_run
    from kernel_attention.training.checkpoint import load_checkpoint

    path = _find(run)
    if path.suffix == ".safetensors":
        raise ValueError(f"{path} is already a safetensors file; export reads a run's best.pt / last.pt")
    ck = load_checkpoint(path)
    extra = ck.get("extra") or {}
    task, model, cfg = load_run(path)
    out = Path(out) if out is not None else path.parent / SAFETENSORS_NAME
    files = {name: (path.parent / name).read_text(encoding="utf-8")
             for name in artifact_files(extra.get("artifacts"), path.parent)}
    meta = {"format": _FORMAT, "config": json.dumps(extra.get("config") or cfg, default=str),
            "artifacts": json.dumps(extra.get("artifacts"), default=str), "step": str(ck.get("step")),
            "source": path.name, "files": json.dumps(files)}
    out.parent.mkdir(parents=True, exist_ok=True)
    copy_artifacts(extra.get("artifacts"), path.parent, out.parent)  # read beside the file when it is loaded
    with replacing(out) as tmp:
        save_model(model, str(tmp), metadata=meta, force_contiguous=True)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # safetensors writes 0600; the run's other files follow the umask
    return out

