"""Where a task's data comes from: ``data: {dataset: <DATASETS spec>}`` or an already-loaded object.

    data: {dataset: wikitext-2}                       # from the dataset registry (files under the data root)
    data: {dataset: {name: wikitext-2, root: /data}}
    data: {dataset: <LMCorpus | TranslationData | ...>}   # Python API / tests: an object is used as is

Unknown dataset names fail listing the registered ones; missing files fail with the path to place them
at (:class:`~kernel_attention.data.files.MissingDataError`).
"""

from __future__ import annotations

from typing import Any, Mapping

from kernel_attention.registry import SpecError

__all__ = ["load_dataset", "check_dataset_spec"]


def _spec(data: Mapping[str, Any] | None, where: str) -> Any:
    if not data or data.get("dataset") is None:
        raise SpecError(f"{where} needs data.dataset (a dataset name such as 'wikitext-2', or a mapping "
                        f"{{name: ..., root: ...}})")
    return data["dataset"]


def check_dataset_spec(data: Mapping[str, Any] | None, where: str, kinds: tuple[str, ...]) -> None:
    """Fail early on an unknown dataset name or one of the wrong kind (no file is read)."""
    spec = _spec(data, where)
    if isinstance(spec, (str, Mapping)):
        from kernel_attention.data import DATASETS, SPECS
        name, _ = DATASETS.validate(spec)
        if SPECS[name].kind not in kinds:
            ok = sorted(n for n, s in SPECS.items() if s.kind in kinds)
            raise SpecError(f"{where}: dataset {name!r} is a {SPECS[name].kind} dataset; accepted: {', '.join(ok)}")


def load_dataset(data: Mapping[str, Any] | None, where: str) -> Any:
    """The dataset object of a ``data:`` section."""
    spec = _spec(data, where)
    if isinstance(spec, (str, Mapping)):
        from kernel_attention.data import DATASETS
        return DATASETS.create(spec)
    return spec
