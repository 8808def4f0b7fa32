"""Where a task's data comes from: ``data: {dataset: <DATASETS spec>}`` or an already-loaded object.

    data: {dataset: wikitext-2}                       # from the dataset registry (files under the data root)
    data: {dataset: {name: wikitext-2, root: /data}}
    data: {dataset: wikitext-2, root: /data}          # the same: ``root`` is the data root of the dataset
    data: {dataset: "text:path=my-corpus"}            # your own plain text (train.txt, valid.txt, test.txt)
    data: {dataset: "parallel:path=my-pairs,src=en,tgt=fr"}   # your own parallel text ({train,valid,test}.{en,fr})
    data: {dataset: "tsv:path=my-reviews,text=0,label=1"}     # your own labelled text ({train,valid,test}.tsv)
    data: {dataset: "graph:path=my-graph,id=node"}   # your own graph (edges.csv, features.csv with a label column)
    data: {dataset: <LMCorpus | TranslationData | ...>}   # Python API / tests: an object is used as is

``dataset`` and ``root`` are the section's only keys (:data:`DATA_KEYS`); any other fails naming them,
as an unknown key of every other section does.  ``data.root=DIR`` on the command line is the natural way
to point a shipped config at a copy of the data; a ``root`` inside the dataset spec that says otherwise
is a contradiction and fails.

Unknown dataset names fail listing the registered ones; missing files fail with the path to place them
at (:class:`~kernel_attention.data.files.MissingDataError`).
"""

from __future__ import annotations

from typing import Any, Mapping

from kernel_attention.registry import SpecError

__all__ = ["DATA_KEYS", "load_dataset", "check_dataset_spec", "check_data_section", "dataset_param", "dataset_spec"]

#: the keys of a ``data:`` section, with what each holds
DATA_KEYS = {"dataset": "a dataset name such as 'wikitext-2', or a mapping {name: ..., root: ...}; your own "
                        "files: text:path=DIR (train.txt, valid.txt, test.txt) or text:path=FILE for a language "
                        "model, parallel:path=DIR,src=en,tgt=fr ({train,valid,test}.{en,fr}) for translation, "
                        "tsv:path=DIR,text=NAME|INDEX,label=NAME|INDEX ({train,valid,test}.tsv; csv:path=... for "
                        ".csv; or one file split by valid=/test=) for classification, csv:path=FILE,target=NAME|INDEX "
                        "(the other columns are the features; ignore=a+b leaves some out) for regression, "
                        "graph:path=DIR,id=NAME|INDEX,label=NAME|INDEX (edges.csv: two node ids per row; "
                        "features.csv: one row per node; splits from train/valid/test.txt or valid=/test=) for "
                        "node classification",
             "root": "the data root the dataset's files are read from (default: $KERNEL_ATTENTION_DATA, "
                     "../shared/data, ~/.cache/kernel-attention)"}


def check_data_section(data: Any) -> None:
    """Fail on a ``data:`` section that is not a mapping or has a key other than :data:`DATA_KEYS`."""
    if data is None:
        return
    if not isinstance(data, Mapping):
        raise SpecError(f"the data section must be a mapping with keys {', '.join(DATA_KEYS)}, got {data!r}")
    unknown = sorted(str(k) for k in data if k not in DATA_KEYS)
    if unknown:
        raise SpecError(f"unknown data option(s) {', '.join(unknown)}; accepted: {', '.join(DATA_KEYS)}")
    root = data.get("root")
    if root is not None and (not isinstance(root, str) or not root.strip()):
        raise SpecError(f"data.root must be a folder path, got {root!r}")


def dataset_spec(data: Mapping[str, Any] | None, where: str) -> Any:
    """The dataset spec of a ``data:`` section, with ``data.root`` folded in as the spec's ``root``."""
    check_data_section(data)
    if not data or data.get("dataset") is None:
        raise SpecError(f"{where} needs data.dataset (a dataset name such as 'wikitext-2', or a mapping "
                        f"{{name: ..., root: ...}})")
    spec, root = data["dataset"], data.get("root")
    if root is None or not isinstance(spec, (str, Mapping)):
        return spec
    from kernel_attention.registry import parse_spec
    name, params = parse_spec(spec)
    if params.get("root") not in (None, root):
        raise SpecError(f"data.root={root!r} and data.dataset's root={params['root']!r} disagree; give one of them")
    return {"name": name, **params, "root": root}


def check_dataset_spec(data: Mapping[str, Any] | None, where: str, kinds: tuple[str, ...]) -> None:
    """Fail early on an unknown dataset name or one of the wrong kind (no file is read)."""
    spec = dataset_spec(data, where)
    if isinstance(spec, (str, Mapping)):
        from kernel_attention.data import DATASETS, SPECS
        name, params = DATASETS.validate(spec)
        kind = SPECS[name].kind_of(params)
        if kind not in kinds:
            ok = sorted(n for n, s in SPECS.items() if s.kind in kinds and not s.by_path)
            own = sorted({f"{n}:path=..." for n, s in SPECS.items() if s.kind in kinds and s.by_path}
                         | {f"{n}:path=...,{s.kind_param[0]}=..." for n, s in SPECS.items()
                            if s.by_path and s.kind_param and s.kind_param[1] in kinds})
            mine = f", or your own files: {', '.join(own)}" if own else ""
            raise SpecError(f"{where}: dataset {name!r} is a {kind} dataset; accepted: {', '.join(ok)}{mine}")


def load_dataset(data: Mapping[str, Any] | None, where: str) -> Any:
    """The dataset object of a ``data:`` section."""
    spec = dataset_spec(data, where)
    if isinstance(spec, (str, Mapping)):
        from kernel_attention.data import DATASETS
        return DATASETS.create(spec)
    return spec


def dataset_param(data: Mapping[str, Any] | None, key: str, default: Any = None) -> Any:
    """The dataset spec's parameter ``key`` (the registry's default where the spec leaves it out), without
    reading a file: say ``tokenize``, which inputs given at inference must go through too; ``default`` for a
    dataset given as an object or one without that parameter."""
    spec = dataset_spec(data, "the data section")
    if not isinstance(spec, (str, Mapping)):
        return default
    from kernel_attention.data import DATASETS
    return DATASETS.validate(spec)[1].get(key, default)
