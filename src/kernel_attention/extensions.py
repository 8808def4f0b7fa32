"""Your own parts by name in configs: the modules a config names in ``run.imports``.

A kernel, positional scheme or filter of your own is a class registered under a name
(``@ka.KERNELS.register("cosine", [...])``, see docs/guides/extending.md).  Python code that imports the module
can use the name at once; a config names the module so that every command that reads the config (``train``,
``evaluate``, ``translate``, ``generate``, ``ka.load`` of a checkpoint, whose stored config keeps the key)
imports it before it builds anything:

    run: {imports: [my_kernels]}                 # my_kernels.py in the current directory, or on the Python path
    run: {imports: [parts/cosine.py]}            # a file by path, relative to the current directory
    model: {attention: {kernel: "cosine:temperature=0.2"}}

A module is imported once per process; importing it again (a second run in the same process) registers
nothing twice.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any, Mapping

from kernel_attention.config import ConfigError

__all__ = ["import_extensions", "with_resolved_imports"]


def import_extensions(names: Any) -> list[str]:
    """Import each module of ``names`` (``run.imports``: a module name or a ``.py`` path, or a list of them);
    returns the names of the modules imported.  A name that is neither an importable module nor a file is a
    :class:`ConfigError`; an error inside a module propagates with its traceback (it is the module's)."""
    return [_import(n) for n in _items(names)]


def _items(names: Any) -> list[str]:
    """``run.imports`` as a list of names (none for None), or a :class:`ConfigError` saying what it holds."""
    if names is None:
        return []
    items = [names] if isinstance(names, str) else names
    if not isinstance(items, (list, tuple)) or not all(isinstance(n, str) and n.strip() for n in items):
        raise ConfigError(f"run.imports must be a module name or a .py file, or a list of them, got {names!r}")
    return [n.strip() for n in items]


def with_resolved_imports(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """``cfg`` with each ``.py`` file of ``run.imports`` as an absolute path (what a run stores, so that its
    checkpoints load from any working directory on this machine; elsewhere ``run.imports=...`` says where)."""
    run = cfg.get("run") or {}
    if run.get("imports") is None:
        return dict(cfg)
    resolved = [str(Path(n).expanduser().resolve()) if n.endswith(".py") else n for n in _items(run["imports"])]
    return {**cfg, "run": {**run, "imports": resolved}}


def _import(name: str) -> str:
    if name.endswith(".py"):
        path = Path(name).expanduser().resolve()
        if not path.is_file():
            raise ConfigError(f"run.imports: {name} is no file (a path is read from the current directory, "
                              f"{Path.cwd()})")
        module = f"kernel_attention_extension_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
        if module not in sys.modules:
            spec = importlib.util.spec_from_file_location(module, path)
            loaded = importlib.util.module_from_spec(spec)
            sys.modules[module] = loaded
            try:
                spec.loader.exec_module(loaded)
            except BaseException:
                del sys.modules[module]
                raise
        return module
    cwd = str(Path.cwd())
    added = cwd not in sys.path
    if added:  # a console script's path starts at its own folder, not the one it runs in
        sys.path.insert(0, cwd)
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name is None or not (name == e.name or name.startswith(e.name + ".")):
            raise  # a module it imports is missing: the module's own error
        raise ConfigError(f"run.imports: no module {name!r} in the current directory ({cwd}) or on the Python "
                          f"path; give a module name or a .py file") from None
    finally:
        if added:
            sys.path.remove(cwd)
    return name
