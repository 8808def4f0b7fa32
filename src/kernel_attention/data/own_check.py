"""What a folder or file of the user's own data is, as ``kernel-attention data check PATH`` reports it.

:func:`detect_spec` names the by-path dataset spec that reads ``PATH`` (``text:path=...``, ``parallel:...``,
``tsv:...`` / ``csv:...``, ``graph:...``) from the files it holds:

* a folder with ``edges.*`` and ``features.*`` (``.csv``, ``.tsv``, ``.txt``): a graph for node
  classification; its node-id column is the first column when that holds no numbers, its label column
  ``label``, else the last column (of ``labels.*`` when there is one), or the one before it when the last
  holds train / valid / test (then the split column);
* a folder with ``train.txt``: a language-model corpus; with ``train.tsv`` / ``train.csv``: labelled text;
  with ``train.XX`` and ``train.YY`` for two other suffixes: parallel text, ``src`` and ``tgt`` in
  alphabetical order;
* a ``.tsv`` / ``.csv`` file: labelled text when a column holds sentences (several words on average), else a
  numeric table for regression, its last column the target and the columns holding non-numbers ignored;
* any other file: a plain-text corpus, cut into splits by ratio.

A ``.tsv`` / ``.csv`` table's text column is the one with the most words per row, its label column the other
one with the fewest distinct values, and its first row a header when the label cell of that row appears in
no other row.  A spec given instead of a path (``graph:path=g,id=paper``) is taken as it is.

:func:`describe_own` loads the data with that spec and returns what it found (JSON-ready): the task it
serves, the files, where the splits come from (files, a column, or made by ratio), the sizes and the
vocabulary, classes or columns.  No checksum is computed: checksums exist only for the staged datasets.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from kernel_attention.registry import SpecError
from .files import MissingDataError
from .graph_files import _SPLIT_VALUES, ID_HEADERS, _rows, find_graph_file
from .tables import _number, read_table

__all__ = ["detect_spec", "describe_own", "TASK_OF_KIND"]

#: the task that trains on a dataset of each kind
TASK_OF_KIND = {"lm": "lm", "translation": "translation", "classification": "classification",
                "regression": "regression", "graph": "node_classification"}
_TABLE = {"tsv": "\t", "csv": ","}
_NOT_LANGUAGES = {"txt", "tsv", "csv", "gz", "json", "yaml", "md"}


def _suffix(p: Path) -> str:
    name = p.name[:-3] if p.name.endswith(".gz") else p.name
    return name.rsplit(".", 1)[-1].lower() if "." in name else ""


def _exists(p: Path) -> bool:
    return p.is_file() or Path(str(p) + ".gz").is_file()


def _words(cell: str) -> int:
    return len(cell.split())


def _table_spec(name: str, p: Path, rows: list[list[str]], labelled: bool = False) -> str:
    """The spec of a labelled-text or numeric table whose rows (all of them, the first maybe a header) are ``rows``;
    ``labelled``: labelled text whatever its columns hold (a folder's tables are, a numeric table is one file)."""
    width = len(rows[0])  # the loader's rule: every row has the first row's fields (it names a row that has not)
    body = [r for r in rows[1:] if len(r) == width] or rows
    per_col = [[r[i] for r in body] for i in range(width)]
    words = [sum(map(_words, c)) / len(c) for c in per_col]
    if width >= 2 and (labelled or max(words) > 1.5):
        text = max(range(width), key=lambda i: words[i])
        label = min((i for i in range(width) if i != text), key=lambda i: (len(set(per_col[i])), -i))
        header = len(rows) > 1 and rows[0][label] not in per_col[label]
        if header and {"text", "label"} <= {c.strip() for c in rows[0]}:
            return f"{name}:path={p}"
        t, y = (rows[0][text].strip(), rows[0][label].strip()) if header else (text, label)
        if header and (t.lstrip("-").isdigit() or y.lstrip("-").isdigit()):  # a name like 1 reads as an index
            return f"{name}:path={p},text={text},label={label},header=true"
        return f"{name}:path={p},text={t},label={y}"
    header = any(_number(c) is None for c in rows[0])
    names = [c.strip() for c in rows[0]] if header else [str(i) for i in range(len(rows[0]))]
    ignore = [names[i] for i in range(width - 1) if any(_number(c) is None for c in per_col[i])]
    return f"{name}:path={p},target={names[-1]}" + (f",ignore={'+'.join(ignore)}" if ignore else "")


def _graph_spec(folder: Path) -> str:
    rows = [cells for _, cells in _rows(find_graph_file(folder, "features"), "utf-8")[1]]
    first, body = rows[0], rows[1] if len(rows) > 1 else rows[0]
    header = any(_number(c) is None for c in first[1:-1])  # feature names between the id and the label
    spec = f"graph:path={folder}"
    if _number(body[0]) is None or (header and first[0].strip().lower() in ID_HEADERS):  # node ids
        spec += f",id={first[0] if header else 0}"
    labels = find_graph_file(folder, "labels")
    if labels is not None:  # the label column is the labels file's, under the same header rule
        rows = [cells for _, cells in _rows(labels, "utf-8")[1]]
        first = rows[0]
    if "label" not in first:
        last = {r[-1].strip().lower() for r in rows[1 if header else 0:]}
        named = header and first[-1].strip().lower() == "split"  # then a bad value is named as the split's
        split = len(first) > 2 and (named or last <= set(_SPLIT_VALUES) | {"", "-"} and bool(last - {"", "-"}))
        if split:  # the last column holds train / valid / test: a split column, the label before it
            spec += f",split={first[-1] if header else -1}"
        spec += f",label={first[-2 if split else -1] if header else (-2 if split else -1)}"
    return spec


def detect_spec(path: str) -> str:
    """The by-path dataset spec that reads ``path`` (see the module docstring).  Raises
    :class:`MissingDataError` when ``path`` does not exist or holds no layout of the user's own data."""
    from .datasets import SPECS

    head = path.split(":", 1)[0]
    if ":" in path and head in SPECS and SPECS[head].by_path:
        return path
    p = Path(path).expanduser()
    if "," in path and p.exists():  # a spec string splits its parameters on commas
        raise SpecError(f"{path}: a path with a comma cannot go in a spec string (name:path=...,key=value); "
                        f"rename it, or give the dataset as a mapping in the config: "
                        f"data: {{dataset: {{name: ..., path: {path!r}}}}}")
    if ":" in path and "=" in path and not p.exists():  # a spec of a kind that reads no path of the user's
        kinds = ", ".join(sorted(n for n, s in SPECS.items() if s.by_path))
        raise MissingDataError(f"{path}: {head!r} is no dataset that reads your own data; accepted: {kinds} "
                               f"(e.g. tsv:path=FILE), or a folder or file")
    if p.is_dir():
        if find_graph_file(p, "edges") and find_graph_file(p, "features"):
            return _graph_spec(Path(path))
        if _exists(p / "train.txt"):
            return f"text:path={path}"
        for ext in _TABLE:
            if _exists(p / f"train.{ext}"):
                return _table_spec(ext, Path(path), read_table(p / f"train.{ext}", _TABLE[ext])[1], labelled=True)
        langs = sorted({_suffix(f) for f in p.glob("train.*")} - _NOT_LANGUAGES - {""})
        if len(langs) == 2:
            return f"parallel:path={path},src={langs[0]},tgt={langs[1]}"
        raise MissingDataError(
            f"{path} holds none of the layouts of your own data: train.txt (a language model), train.tsv / "
            f"train.csv (labelled text), train.XX and train.YY (parallel text), edges.csv and features.csv (a "
            f"graph); or give a spec such as parallel:path={path},src=en,tgt=fr")
    if _exists(p):
        ext = _suffix(p)
        if ext in _TABLE:
            return _table_spec(ext, Path(path), read_table(p, _TABLE[ext])[1])
        return f"text:path={path}"
    raise MissingDataError(f"{path} does not exist: give a folder or file of your own data, or a data root")


def _splits_source(spec_name: str, params: dict, p: Path) -> str:
    ratio = f"made by ratio (valid={params.get('valid')}, test={params.get('test')}, seed={params.get('seed')})"
    if spec_name == "graph":
        if _exists(p / "train.txt"):
            return "files " + ", ".join(f"{s}.txt" for s in ("train", "valid", "val", "dev", "test")
                                        if _exists(p / f"{s}.txt"))
        return f"column split={params['split']}" if params.get("split") else ratio + " of the labelled nodes"
    if params.get("target") is not None:
        return "cut by the regression task (task.split of task.n_splits)"
    if p.is_dir():
        present = [f.name for f in sorted(p.iterdir()) if f.name.split(".")[0] in ("train", "valid", "val", "dev", "test")]
        note = ("; valid: 10% of train, drawn by the classification task" if spec_name in _TABLE
                and not any(n.split(".")[0] in ("valid", "val", "dev") for n in present) else "")
        return "files " + ", ".join(present) + note
    return ratio


def _details(data: Any) -> dict[str, Any]:
    """Vocabulary, classes or columns of a loaded dataset."""
    from . import classification, parallel, planetoid, uci, wikitext

    if isinstance(data, wikitext.LMCorpus):
        eos = data.vocab["<eos>"]
        return {"lines": {s: int((t == eos).sum()) for s, t in data.splits.items()}, "vocabulary": len(data.vocab)}
    if isinstance(data, parallel.ParallelText):
        train = data.splits["train"]
        return {"vocabulary": {data.src_lang: len({w for line in train[0] for w in line.split()}),
                               data.tgt_lang: len({w for line in train[1] for w in line.split()})}}
    if isinstance(data, classification.ClassificationData):
        names = data.label_names or [str(i) for i in range(data.num_classes)]
        return {"classes": dict(zip(names, data.class_counts()))}
    if isinstance(data, planetoid.GraphData):
        names = data.label_names or [str(i) for i in range(data.num_classes)]
        counts = Counter(data.y[data.train_mask | data.val_mask | data.test_mask].tolist())
        return {"classes": {n: counts.get(i, 0) for i, n in enumerate(names)}}
    if isinstance(data, uci.RegressionData):
        return {"columns": {"features": data.feature_names, "target": data.target_name}}
    return {}


def describe_own(path: str) -> dict[str, Any]:
    """Detect (:func:`detect_spec`) and load the user's data at ``path``: ``spec``, ``kind``, ``task``,
    ``files``, ``splits`` (where they come from), ``sizes`` (one line), and ``lines`` / ``vocabulary`` /
    ``classes`` / ``columns`` by kind.  Loading errors propagate (:class:`DataFormatError`, ...)."""
    from .datasets import DATASETS, SPECS, summarize

    spec = detect_spec(path)
    name, params = DATASETS.validate(spec)
    kind = SPECS[name].kind_of(params)
    data = DATASETS.create(spec)
    p = Path(params["path"]).expanduser()
    files = sorted(f.name for f in p.iterdir() if f.is_file()) if p.is_dir() else [p.name]
    return {"path": path, "spec": spec, "kind": kind, "task": TASK_OF_KIND[kind], "files": files,
            "splits": _splits_source(name, params, p), "sizes": summarize(data), **_details(data)}
