"""Run configuration: a YAML file, plus ``key.sub=value`` overrides from the command line.

    cfg = load_config("configs/iwslt14_td_rbf.yaml", ["train.lr=7e-4", "model.attention.kernel=poly:degree=3"])
    dump_config(cfg, run_dir)               # writes run_dir/config.yaml, the resolved config

A config is a nested dict whose top-level keys are *sections*; the accepted ones are :data:`SECTIONS`
(a caller may pass its own list).  An unknown section fails naming it and the accepted ones, so a typo
never silently falls back to a default::

    run:    {name, dir}                        where outputs go
    seed:   int                                the run's seed
    task:   {name, ...}                        which task family / synthetic task and its parameters
    data:   {...}                              dataset and batching
    model:  {...}                              architecture, attention spec
    train:  {...}                              TrainConfig fields (kernel_attention.training.loop)
    eval:   {...}                              evaluation / decoding options (beam, len_penalty, ...)

Overrides: ``a.b.c=value`` sets ``cfg["a"]["b"]["c"]``, creating missing mappings.  ``value`` is read with
``yaml.safe_load``, so ``3`` is an int, ``1e-3`` / ``3.0`` a float, ``true`` a bool, ``[1, 2]`` a list,
``{k: v}`` a mapping, ``null`` or an empty value ``None``, and anything else a string (``poly:degree=3``
stays a string).  Note YAML 1.1 reads ``1e-3`` as a string; :func:`parse_value` reads such numbers as
floats, so ``lr=1e-3`` works both in files and on the command line.
"""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml

from kernel_attention.atomic_write import write_text

__all__ = ["SECTIONS", "RUN_KEYS", "ConfigError", "load_config", "apply_overrides", "parse_override", "parse_value",
           "validate_sections", "dump_config"]

SECTIONS = ("run", "seed", "task", "data", "model", "train", "eval")
#: the keys of the ``run`` section
RUN_KEYS = ("name", "dir", "imports")


class ConfigError(ValueError):
    """A config file or override that cannot be used as given."""


_FLOAT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)$")  # 1e-3, 5E4: strings to YAML 1.1


def _numbers(x: Any, _open: tuple[int, ...] = ()) -> Any:
    """Turn the strings YAML 1.1 leaves as strings but everyone means as floats (``1e-3``) into floats.

    A mapping or list that contains itself (a YAML alias inside its own anchor, ``a: &x [*x]``) has no
    finite value: it fails as a :class:`ConfigError` (caught by the caller, which names the file) rather
    than as a RecursionError deep in whatever walks the config next."""
    if isinstance(x, str) and _FLOAT.match(x.strip()):
        return float(x)
    if isinstance(x, (dict, list)):
        if id(x) in _open:
            raise ConfigError("it refers to itself: a YAML alias (*name) sits inside its own anchor "
                              "(&name); a config must be a tree, so copy the values instead")
        inner = _open + (id(x),)
        if isinstance(x, dict):
            return {k: _numbers(v, inner) for k, v in x.items()}
        return [_numbers(v, inner) for v in x]
    return x


def parse_value(text: str) -> Any:
    """Read an override value the way a YAML file would (plus ``1e-3`` as a float)."""
    try:
        return _numbers(yaml.safe_load(text)) if text.strip() else None
    except yaml.YAMLError:
        return text  # e.g. "a: b: c" -- keep the literal string
    except ConfigError as e:
        raise ConfigError(f"override value {text!r}: {e}") from None


def parse_override(item: str) -> tuple[list[str], Any]:
    """``"train.lr=1e-3"`` -> ``(["train", "lr"], 0.001)``."""
    key, eq, value = item.partition("=")
    path = [p.strip() for p in key.split(".")]
    if not eq or not key.strip() or any(not p for p in path):
        raise ConfigError(f"cannot read override {item!r}; write section.key=value, e.g. train.lr=5e-4")
    return path, parse_value(value)


def apply_overrides(config: Mapping[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """A copy of ``config`` with each ``key.sub=value`` applied in order."""
    cfg = copy.deepcopy(dict(config))
    for item in overrides:
        path, value = parse_override(item)
        node = cfg
        for i, key in enumerate(path[:-1]):
            child = node.get(key)
            if child is None:
                child = node[key] = {}
            elif not isinstance(child, dict):
                where = ".".join(path[: i + 1])
                raise ConfigError(f"override {item!r}: {where} is {child!r}, not a mapping, so it has no "
                                  f"key {path[i + 1]!r}")
            node = child
        node[path[-1]] = value
    return cfg


def validate_sections(config: Mapping[str, Any], accepted: Iterable[str] = SECTIONS) -> None:
    """Fail on a top-level key that is not an accepted section, naming the key and the accepted ones, on a ``seed``
    that is not an integer and on a ``run`` section that is not a mapping of :data:`RUN_KEYS`."""
    accepted = list(accepted)
    for key in config:
        if key not in accepted:
            raise ConfigError(f"unknown config section {key!r}; accepted: {', '.join(accepted)}")
    seed = config.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ConfigError(f"seed must be an integer, got {seed!r}")
    run = config.get("run")
    if run is not None and not isinstance(run, Mapping):
        raise ConfigError(f"the run section must be a mapping of {', '.join(RUN_KEYS)}, got {run!r}")
    unknown = sorted(set(run or {}) - set(RUN_KEYS))
    if unknown:
        raise ConfigError(f"unknown run option(s) {', '.join(map(str, unknown))}; accepted: {', '.join(RUN_KEYS)}")


def load_config(source: str | os.PathLike | Mapping[str, Any] | None = None, overrides: Iterable[str] = (),
                accepted: Iterable[str] = SECTIONS) -> dict[str, Any]:
    """Read a YAML file (or take a mapping), apply ``overrides``, check the sections; returns a new dict."""
    if source is None:
        cfg: Any = {}
    elif isinstance(source, Mapping):
        cfg = copy.deepcopy(dict(source))
    else:
        path = Path(source)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        try:
            cfg = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {path} is not valid YAML: {e}") from None
        if not isinstance(cfg, dict):
            raise ConfigError(f"config file {path} must hold a mapping of sections, got {type(cfg).__name__}")
        try:
            cfg = _numbers(cfg)
        except ConfigError as e:
            raise ConfigError(f"config file {path}: {e}") from None
    cfg = apply_overrides(cfg, overrides)
    validate_sections(cfg, accepted)
    return cfg


def dump_config(config: Mapping[str, Any], path: str | os.PathLike) -> Path:
    """Write the resolved config as YAML; ``path`` may be a run directory (-> ``config.yaml`` in it)."""
    path = Path(path)
    if path.is_dir() or not path.suffix:
        path = path / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_text(path, yaml.safe_dump(_plain(config), sort_keys=False, default_flow_style=None))


def _plain(x: Any) -> Any:
    # tuples and Paths are not safe_dump-able; write them as lists and strings
    if isinstance(x, Mapping):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, Path):
        return str(x)
    return x
