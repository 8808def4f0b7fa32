"""Resuming with another config: which keys changed, and a refusal unless the user allows it.

A run directory's ``last.pt`` stores the config it was trained with.  Running ``kernel-attention train``
again resumes from it; if the config now says something else (another ``train.lr``, another kernel), the
resumed run would be neither the old run nor the new one, and its numbers would be read as one of them.
So a resume compares the two configs key by key and refuses, naming every changed key with its old and
new value, unless ``--allow-config-change`` says the change is meant (say, more ``train.max_steps``).

Keys that change how a run is watched or where it reads from, not what it computes, may always change:
:data:`FREE_KEYS` (progress output, checkpoint frequency, logging frequency, the run folder, and where the data
is read from: the data root, or the ``path=`` of your own files, which move with a run to another machine).
"""

from __future__ import annotations

from typing import Any, Mapping

from kernel_attention.config import ConfigError

__all__ = ["FREE_KEYS", "ConfigChangeError", "changed_keys", "check_resume_config"]

#: dotted keys (and prefixes ending in ".") that a resumed run may change without being another run
FREE_KEYS = ("run.", "train.progress", "train.tensorboard", "train.checkpoint_minutes", "train.checkpoint_every",
             "train.log_every", "train.stop_after", "train.device", "train.compile", "train.keep_last",
             "data.root", "data.dataset.root", "data.dataset.path")


class ConfigChangeError(ConfigError):
    """A resume whose config differs from the one its checkpoint was trained with."""


def _flat(x: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(x, Mapping) and (x or not prefix):
        out: dict[str, Any] = {}
        for k, v in x.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: x}


def _same(a: Any, b: Any) -> bool:
    # a number is the same number whether YAML wrote it 3 or 3.0; True is not 1
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) and not isinstance(b, bool):
        return float(a) == float(b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _free(key: str) -> bool:
    return any(key.startswith(k) if k.endswith(".") else key == k for k in FREE_KEYS)


def _one_form(section: Any) -> Any:
    """An attention section (KernelAttention arguments) with its kernel and position specs in one form,
    ``{name, every parameter}``, and its filter as the filter's repr: ``poly``, ``poly:degree=2`` and ``{name:
    poly}`` are one kernel.  Keys left out stay out (the model that reads the section gives their defaults);
    a spec that does not validate stays as written."""
    from kernel_attention.filters import make_filter
    from kernel_attention.kernels import KERNELS
    from kernel_attention.positions import POSITIONS
    from kernel_attention.registry import SpecError

    if not isinstance(section, Mapping):
        return section
    out = dict(section)
    for key, registry in (("kernel", KERNELS), ("position", POSITIONS)):
        if isinstance(out.get(key), (str, Mapping)):
            try:
                name, params = registry.validate(out[key])
                out[key] = {"name": name, **params}
            except (SpecError, TypeError, ValueError):
                pass
    if isinstance(out.get("filter"), (str, Mapping)):
        try:
            out["filter"] = repr(make_filter(out["filter"]))
        except (SpecError, TypeError, ValueError):
            pass
    return out


def _filled(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """``cfg`` with the defaults of its ``train`` section (every TrainConfig field), its ``model`` section (the
    task's model and each of its parameters) and ``seed`` written out, and its attention sections' specs in one
    form (:func:`_one_form`), so that a key set to its default, or a spec written another way, is no change; a
    section that no longer validates stays as written."""
    from kernel_attention.models import MODELS
    from kernel_attention.tasks import build_task
    from kernel_attention.tasks.runner import train_config

    out = dict(cfg)
    out["seed"] = cfg.get("seed", 0) or 0
    try:
        out["train"] = train_config(cfg).to_dict()
    except (ValueError, TypeError):
        pass
    try:
        name, params = MODELS.validate(build_task(cfg).model_spec)
        out["model"] = {"name": name, **params}
    except (ValueError, TypeError, AttributeError, FileNotFoundError):
        pass
    data = out.get("data")
    if isinstance(data, Mapping) and isinstance(data.get("dataset"), (str, Mapping)):
        from kernel_attention.registry import SpecError, parse_spec
        try:  # "text:path=corpus" and {name: text, path: corpus} are one spec, its path a key of its own
            name, params = parse_spec(data["dataset"])
            out["data"] = {**data, "dataset": {"name": name, **params}}
        except SpecError:
            pass
    if isinstance(out.get("model"), Mapping):
        out["model"] = {k: _one_form(v) if str(k).endswith("attention") else v for k, v in out["model"].items()}
    return out


def changed_keys(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(dotted key, old value, new value)`` for each key that differs, defaults filled in where the config's
    sections give them (a key missing from both the config and its section's defaults has the value ``None``),
    leaving out :data:`FREE_KEYS`; sorted by key."""
    a, b = _flat(_filled(old)), _flat(_filled(new))
    return [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b))
            if not _free(k) and not _same(a.get(k), b.get(k))]


def check_resume_config(stored: Mapping[str, Any] | None, current: Mapping[str, Any], allow: bool,
                        where: str) -> None:
    """Raise :class:`ConfigChangeError` naming the changed keys, unless ``allow`` or nothing changed.
    ``stored`` None (a checkpoint written without its config) compares as nothing changed."""
    if stored is None or allow:
        return
    changes = changed_keys(stored, current)
    if changes:
        listed = "; ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in changes)
        raise ConfigChangeError(f"{where} was trained with another config ({listed}); pass "
                                "--allow-config-change to resume it with the new values, --no-resume to "
                                "start it over, or use another --run-dir")
