"""Your own graph for node classification by path: ``graph:path=DIR``.

    data: {dataset: "graph:path=my-graph"}        # my-graph/edges.csv, features.csv with a `label` column
    data: {dataset: "graph:path=cora,edges=cora.cites,features=cora.content,id=0,label=-1"}   # LINQS layout

Files of the folder ``DIR`` (plain or ``.gz``; a ``.csv`` file is read as CSV, ``.tsv`` split on tabs, any other
suffix split on whitespace):

* **edges**: ``edges.{csv,tsv,txt}`` (or ``edges=NAME``), two node ids per row, source and target (further
  columns, e.g. a weight, are ignored; lines starting with ``#`` are comments; a first row whose cells are
  not node ids is a header).  The graph is undirected: both directions of every edge are kept, duplicates
  and self-loops removed (``self_loops=true`` adds one per node), as the Planetoid preprocessing.
* **features**: ``features.{csv,tsv,txt}`` (or ``features=NAME``), one row per node, numeric columns.
  ``id=NAME|INDEX`` names its node-id column (ids are any strings); without one, a first column headed
  ``id``, ``node`` or ``node_id`` is it, else node ``i`` is row ``i`` (0-based, the header not counted) and the
  edge list holds those numbers.  ``ignore=a+b`` leaves columns out; ``normalize_features=true`` divides each
  row by its sum (bag-of-words counts).
* **labels**: the column ``label=NAME|INDEX`` (default ``label``) of ``labels.{csv,tsv,txt}`` (or
  ``labels=NAME``) when there is one, else of the features table.  A labels file is keyed by the ``id``
  column when ``id=`` is given (nodes without a row are unlabelled), else it has one row per node, in the
  order of the feature rows.  An empty label leaves a node unlabelled; the classes are the labels, sorted
  (as numbers when all are integers) and numbered from 0.
* **splits**, the first that applies: ``train.txt``, ``valid.txt`` (or ``val`` / ``dev``; without one the
  ``valid`` fraction of the train nodes, drawn with ``seed``) and ``test.txt`` holding node ids separated
  by whitespace, or masks: one ``0`` / ``1`` (``false`` / ``true``) per node in the feature rows' order;
  or ``split=NAME|INDEX``, a column of the labels (else features) table holding ``train``, ``valid``
  (``val``, ``dev``) or ``test`` per node (any other value: in no split); else the labelled
  nodes shuffled with ``seed`` and cut into ``valid`` / ``test`` fractions, the rest for training.

Column indices are 0-based, negative ones count from the end (``label=-1``: the last column).
``header``: ``auto`` (the default) reads a table's first row as a header when a column of it is chosen by
name, or (features) when a feature cell of it is not a number; ``true`` / ``false`` say so.

Returns :class:`~kernel_attention.data.planetoid.GraphData` (what the ``node_classification`` task reads):
``x`` (N, F) float32, ``y`` (N,) long (0 for unlabelled nodes, which no mask selects), ``edge_index``
(2, E) long, the three (N,) bool masks, ``num_classes`` and ``label_names``.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import torch

from .files import SPLIT_NAMES, DataFormatError, MissingDataError, find_split, read_lines
from .planetoid import GraphData, row_normalize, undirected_edges
from .protocols import cut_by_fractions
from .tables import _column, _number, class_names

__all__ = ["load_graph_folder", "find_graph_file", "GRAPH_FILES"]

#: the file each role is found under when not named, without its suffix
GRAPH_FILES = {"edges": "edges", "features": "features", "labels": "labels"}
_SUFFIXES = ("csv", "tsv", "txt")
_SPLIT_VALUES = {"train": "train", "valid": "valid", "val": "valid", "dev": "valid", "test": "test"}
_MASK_VALUES = {"0", "1", "true", "false"}
#: headers of a first column read as the node ids without ``id=`` (any case)
ID_HEADERS = ("id", "node", "node_id")
_LAYOUT = ("give a folder with edges.csv (two node ids per row) and features.csv (one row per node), "
           "or name them with edges=, features=")


def find_graph_file(folder: Path, role: str, name: str | None = None) -> Path | None:
    """The file of ``role`` (edges / features / labels) in ``folder``: ``name`` when given (relative to the
    folder; it must exist), else ``<role>.csv``, ``.tsv`` or ``.txt`` (each plain or ``.gz``), else None."""
    if name:
        p = folder / name
        if not (p.is_file() or Path(str(p) + ".gz").is_file()):
            raise MissingDataError(f"graph data {folder}: {role}={name} names no file ({p} does not exist)")
        return p
    for suffix in _SUFFIXES:
        for cand in (folder / f"{GRAPH_FILES[role]}.{suffix}", folder / f"{GRAPH_FILES[role]}.{suffix}.gz"):
            if cand.is_file():
                return cand
    return None


def _rows(path: Path, encoding: str, comments: bool = False) -> tuple[Path, list[tuple[int, list[str]]]]:
    """``(line number, cells)`` of each non-empty row: CSV for ``.csv``, tabs for ``.tsv``, else whitespace."""
    p, lines = read_lines(path, encoding)
    suffix = p.name[:-3].rsplit(".", 1)[-1] if p.name.endswith(".gz") else p.suffix[1:]
    out = []
    for i, line in enumerate(lines):
        if not line.strip() or (comments and line.lstrip().startswith("#")):
            continue
        if suffix == "csv":
            cells = next(csv.reader([line]))
        elif suffix == "tsv":
            cells = line.split("\t")
        else:
            cells = line.split()
        out.append((i + 1, [c.strip() for c in cells]))
    if not out:
        raise DataFormatError(p, None, "the file is empty (no rows)")
    return p, out


def _index(which: str | None, first: list[str], p: Path, role: str, header: bool) -> int | None:
    """The 0-based column of ``which`` (name or index, negative from the end) in a table whose first row
    is ``first``; None when ``which`` is None."""
    if which is None:
        return None
    return _column(which, len(first), first if header else None, p, role)


def _named(*which: str | None) -> bool:
    return any(w is not None and not w.lstrip("-").isdigit() for w in which)


def _header(header: str, named: bool) -> bool:
    return named if header == "auto" else header == "true"


def _features(p: Path, rows, id_col, label_col, split_col, ignore, header, in_table):
    """(node ids, features (N, F), label cells or None, split cells or None, feature names) of the features
    table; ``in_table``: whether the label (and split) column are read from it."""
    first = rows[0][1]
    chosen = [id_col] + ([label_col, split_col] if in_table else [])
    by_name = _named(*chosen, *ignore)
    idx = {}
    if header == "auto" and not by_name:  # a header of feature names: a first-row cell that is not a number
        skip = {_index(w, first, p, "column", False) for w in chosen if w is not None}
        by_name = any(_number(c) is None for i, c in enumerate(first) if i not in skip)
    has_header = _header(header, by_name)
    for role, which in (("id", id_col), ("label", label_col if in_table else None),
                        ("split", split_col if in_table else None)):
        idx[role] = _index(which, first, p, role, has_header)
    skip = {_index(w, first, p, "ignore", has_header) for w in ignore} | {i for i in idx.values() if i is not None}
    width = len(first)
    names = first if has_header else [str(i) for i in range(width)]
    feats = [i for i in range(width) if i not in skip]
    if not feats:
        raise DataFormatError(p, None, f"no feature column is left besides the id/label/split columns {sorted(skip)}")
    body = rows[1:] if has_header else rows
    ids, values, labels, splits, seen = [], [], [], [], {}
    for line, cells in body:
        if len(cells) != width:
            raise DataFormatError(p, line, f"{len(cells)} columns, the first row has {width}")
        node = cells[idx["id"]] if idx["id"] is not None else str(len(ids))
        if node in seen:
            raise DataFormatError(p, line, f"node id {node!r} repeats line {seen[node]}; each node has one row")
        seen[node] = line
        nums = [_number(cells[i]) for i in feats]
        bad = next((j for j, v in enumerate(nums) if v is None), None)
        if bad is not None:
            c, cell = names[feats[bad]], cells[feats[bad]]
            fix = (f"a column of splits: name it with split={c}" if cell.lower() in _SPLIT_VALUES
                   else f"leave it out with ignore={c}, or name the node-id column with id=")
            raise DataFormatError(p, line, f"column {c!r} holds {cell[:30]!r}, not a number ({fix})")
        ids.append(node)
        values.append(nums)
        if idx["label"] is not None:
            labels.append(cells[idx["label"]])
        if idx["split"] is not None:
            splits.append(cells[idx["split"]])
    if not ids:
        raise DataFormatError(p, None, "no node rows")
    with np.errstate(over="ignore"):
        x = np.asarray(values, dtype=np.float32)
    if not np.isfinite(x).all():  # a cell such as 1e39 overflows float32
        row, col = np.argwhere(~np.isfinite(x))[0]
        raise DataFormatError(p, body[row][0], f"column {names[feats[col]]!r} holds {values[row][col]:g}, beyond "
                                               f"float32's range")
    return (ids, x, labels if idx["label"] is not None else None, splits if idx["split"] is not None else None,
            [names[i] for i in feats])


def _labels_file(p: Path, rows, ids: list[str], id_col, label_col, split_col, header):
    """(label cells, split cells or None) per node, in the order of ``ids``, from a separate labels file."""
    first = rows[0][1]
    has_header = _header(header, _named(id_col, label_col, split_col))
    li = _index(label_col, first, p, "label", has_header)
    ii = _index(id_col, first, p, "id", has_header)
    si = _index(split_col, first, p, "split", has_header)
    body = rows[1:] if has_header else rows
    if ii is None and len(body) != len(ids):
        raise DataFormatError(p, None, f"{len(body)} label rows for {len(ids)} nodes: without id= the labels file "
                                       f"has one row per feature row, in their order (or give id=NAME|INDEX)")
    where = {n: i for i, n in enumerate(ids)}
    labels, splits = [""] * len(ids), [""] * len(ids)
    need = max(i for i in (li, ii, si) if i is not None) + 1
    for r, (line, cells) in enumerate(body):
        if len(cells) < need:
            raise DataFormatError(p, line, f"{len(cells)} column(s), the label/id/split columns need {need}")
        node = r if ii is None else where.get(cells[ii])
        if node is None:
            raise DataFormatError(p, line, f"node id {cells[ii]!r} has no row in the features table")
        labels[node] = cells[li]
        if si is not None:
            splits[node] = cells[si]
    return labels, splits if si is not None else None


def _edge_list(p: Path, rows, where: dict[str, int], features: Path, id_col) -> np.ndarray:
    ids = f"its {id_col} column" if id_col is not None else f"its row numbers 0..{len(where) - 1}"
    out = []
    for r, (line, cells) in enumerate(rows):
        if len(cells) < 2:
            raise DataFormatError(p, line, f"{len(cells)} column(s); an edge is two node ids (source, target)")
        a, b = where.get(cells[0]), where.get(cells[1])
        if a is None and b is None and r == 0 and not any(ch.isdigit() for ch in cells[0] + cells[1]):
            continue  # a header row (source, target); a first edge between unknown ids like p98 is an error
        for cell, node in ((cells[0], a), (cells[1], b)):
            if node is None:
                header = " (a header row names its columns without digits: source, target)" if r == 0 else ""
                raise DataFormatError(p, line, f"node id {cell[:30]!r} has no row in {features.name} (node ids: "
                                               f"{ids}){header}")
        out.append((a, b))
    if not out:
        raise DataFormatError(p, None, "no edges")
    return np.asarray(out, dtype=np.int64).T


def _split_files(folder: Path, where: dict[str, int], encoding: str) -> dict[str, list[int]] | None:
    """The node indices of ``train.txt`` / ``valid.txt`` / ``test.txt``, or None when there is no train file."""
    found = {}
    for split in SPLIT_NAMES:
        f = find_split(folder, split, ".txt")
        if f is not None:
            found[split] = f
    if "train" not in found:
        return None
    if "test" not in found:
        raise MissingDataError(f"graph data {folder} has train.txt but no test.txt: give train.txt, test.txt (and "
                               f"valid.txt) of node ids, or neither (the splits are then cut by valid= and test=)")
    out = {}
    for split, f in found.items():
        p, lines = read_lines(f, encoding)
        cells = [(i + 1, c) for i, line in enumerate(lines) for c in line.split()]
        if len(cells) == len(where) > 2 and {c.lower() for _, c in cells} <= _MASK_VALUES:
            # one 0/1 per node: a mask (as node ids, so many repeats of two ids would mean nothing)
            out[split] = [n for n, (_, c) in enumerate(cells) if c.lower() in ("1", "true")]
            continue
        if len(cells) > len({c for _, c in cells}) and {c.lower() for _, c in cells} <= _MASK_VALUES:
            raise DataFormatError(p, None, f"{len(cells)} values of 0/1, but the features table has {len(where)} "
                                           f"nodes: a mask holds one 0/1 per node, a list of node ids names each once")
        for line, c in cells:
            if c not in where:
                raise DataFormatError(p, line, f"node id {c[:30]!r} has no row in the features table (a split "
                                               f"file holds node ids, or one 0/1 per node)")
        out[split] = [where[c] for _, c in cells]
    return out


def _split_column(cells: list[str], p: Path) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {"train": [], "valid": [], "test": []}
    for node, c in enumerate(cells):
        if c.lower() in _SPLIT_VALUES:
            out[_SPLIT_VALUES[c.lower()]].append(node)
        elif c not in ("", "-"):
            raise DataFormatError(p, None, f"the split column holds {c[:30]!r}; its values are train, valid (val, "
                                           f"dev), test, or empty or - for a node in no split")
    if not out["train"] or not out["test"]:
        raise DataFormatError(p, None, f"the split column names {len(out['train'])} train and {len(out['test'])} "
                                       f"test node(s); its values are train, valid (val, dev) or test")
    return out


def load_graph_folder(path: str | Path, edges: str | None = None, features: str | None = None,
                      labels: str | None = None, id: str | None = None, label: str = "label",
                      split: str | None = None, ignore: str | None = None, header: str = "auto",
                      valid: float = 0.1, test: float = 0.1, seed: int = 0, normalize_features: bool = False,
                      self_loops: bool = False, encoding: str = "utf-8") -> GraphData:
    """:class:`GraphData` from the user's edge list, feature table and labels; see the module docstring."""
    if header not in ("auto", "true", "false"):
        raise ValueError(f"header={header!r} must be auto, true or false")
    folder = Path(path).expanduser()
    if not folder.is_dir():
        what = "is a file" if folder.exists() else "does not exist"
        raise MissingDataError(f"graph data {folder} {what}: {_LAYOUT} (and labels, splits: see docs/own-data.md)")
    files = {role: find_graph_file(folder, role, name)
             for role, name in (("edges", edges), ("features", features), ("labels", labels))}
    for role in ("edges", "features"):
        if files[role] is None:
            raise MissingDataError(f"graph data {folder} has no {role} file ({GRAPH_FILES[role]}.csv, .tsv or .txt): "
                                   f"{_LAYOUT}")
    fp, frows = _rows(files["features"], encoding)
    if id is None and header != "false" and frows[0][1][0].strip().lower() in ID_HEADERS:
        id = frows[0][1][0]
    ignored = [w.strip() for w in (ignore or "").split("+") if w.strip()]
    in_table = files["labels"] is None
    ids, x, label_cells, split_cells, _ = _features(fp, frows, id, label, split, ignored, header, in_table)
    if not in_table:
        lp, lrows = _rows(files["labels"], encoding)
        label_cells, split_cells = _labels_file(lp, lrows, ids, id, label, split, header)
    where = {n: i for i, n in enumerate(ids)}
    ep, erows = _rows(files["edges"], encoding, comments=True)
    e = _edge_list(ep, erows, where, fp, id)

    labelled = [i for i, c in enumerate(label_cells) if c]
    names = class_names(label_cells[i] for i in labelled)
    lp = files["labels"] or fp
    if len(names) < 2:
        raise DataFormatError(lp, None, f"{len(names)} class(es) in column label={label}: a classifier needs two")
    cls = {n: i for i, n in enumerate(names)}
    y = np.zeros(len(ids), dtype=np.int64)
    y[labelled] = [cls[label_cells[i]] for i in labelled]

    parts = _split_files(folder, where, encoding)
    if parts is None and split_cells is not None:
        parts = _split_column(split_cells, lp)
    if parts is None:
        cut = cut_by_fractions(len(labelled), valid, test, seed, "labelled nodes", str(lp))
        parts = {s: [labelled[i] for i in idx] for s, idx in cut.items()}
    elif not parts.get("valid") and valid > 0:  # given train and test files: valid drawn from train
        order = torch.randperm(len(parts["train"]), generator=torch.Generator().manual_seed(seed)).tolist()
        n_valid = min(len(order) - 1, max(1, round(valid * len(order))))
        parts["valid"] = sorted(parts["train"][i] for i in order[:n_valid])
        parts["train"] = sorted(parts["train"][i] for i in order[n_valid:])
    masks = []
    for s in ("train", "valid", "test"):
        m = np.zeros(len(ids), dtype=bool)
        m[parts.get(s, [])] = True
        unlabelled = [ids[i] for i in parts.get(s, []) if not label_cells[i]]
        if unlabelled:
            raise DataFormatError(lp, None, f"{s} split holds node(s) without a label: {unlabelled[:5]}")
        masks.append(m)
    both = np.flatnonzero((masks[0].astype(int) + masks[1] + masks[2]) > 1)
    if both.size:
        raise DataFormatError(folder, None, f"node(s) {[ids[i] for i in both[:5]]} are in two splits")
    if not masks[0].any() or not masks[2].any():
        raise DataFormatError(folder, None, "the train and test splits must each hold a node")
    if normalize_features:
        x = row_normalize(x)
    e = undirected_edges(e, len(ids), self_loops)
    return GraphData(folder.name or str(folder), torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(e),
                     *(torch.from_numpy(m) for m in masks), len(names), names)
