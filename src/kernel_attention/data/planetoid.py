"""Planetoid citation graphs (Cora, Citeseer, Pubmed) in the ``ind.<name>.*`` format, standard split.

Files (``root/planetoid/``): ``ind.D.x`` / ``.tx`` / ``.allx`` (scipy CSR features of the labelled
training nodes / test nodes / all non-test nodes), ``ind.D.y`` / ``.ty`` / ``.ally`` (one-hot labels),
``ind.D.graph`` (``defaultdict`` node -> neighbour list), ``ind.D.test.index`` (one test node id per line).

They are Python-2 pickles.  Unpickling can run arbitrary code, so :class:`RestrictedUnpickler` resolves
only the handful of classes these files contain (numpy arrays and dtypes, a scipy CSR matrix, a
``defaultdict`` of lists) from a fixed table, imports nothing, and refuses anything else.

Split (Kipf & Welling's GCN loader, used by GAT and the IKA paper): train = ``range(len(y))``,
val = ``range(len(y), len(y) + 500)``, test = the ids in ``test.index``.  Test ids are not contiguous in
Citeseer (isolated nodes have no features); as GCN does, the test block is padded with zero feature rows
and zero labels for the missing ids, so that node i of the graph is row i of the feature matrix.
"""

from __future__ import annotations

import collections
import dataclasses
import io
import pickle
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch

from .files import DataFormatError, read_bytes, read_lines

__all__ = ["GraphData", "load_planetoid", "undirected_edges", "row_normalize", "RestrictedUnpickler", "restricted_loads",
           "UnsafePickleError"]


class UnsafePickleError(pickle.UnpicklingError):
    """A pickle that asks for a class outside the allowed table."""


def _reconstruct(cls, base, state):
    # copy_reg._reconstructor, limited to plain ``object`` as the base (what a pickled new-style class
    # instance uses); ``cls`` itself came through find_class, so it is one of the allowed classes.
    if base is not object:
        raise UnsafePickleError(f"refusing to reconstruct {cls!r} with base {base!r}")
    return object.__new__(cls)


def _latin1_bytes(text: str, encoding: str = "latin1") -> bytes:
    # Python 3 pickles of protocol < 3 write bytes as _codecs.encode(str, "latin1"); allow only that.
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise UnsafePickleError(f"refusing _codecs.encode({type(text).__name__}, {encoding!r})")
    return text.encode("latin1")


def _allowed() -> dict[tuple[str, str], object]:
    nd_reconstruct = np.ndarray.__reduce__(np.zeros(1))[0]  # numpy's _reconstruct, wherever it lives now
    table = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("numpy.core.multiarray", "_reconstruct"): nd_reconstruct,
        ("numpy._core.multiarray", "_reconstruct"): nd_reconstruct,
        ("collections", "defaultdict"): collections.defaultdict,
        ("__builtin__", "list"): list,
        ("builtins", "list"): list,
        ("__builtin__", "object"): object,
        ("builtins", "object"): object,
        ("copy_reg", "_reconstructor"): _reconstruct,
        ("copyreg", "_reconstructor"): _reconstruct,
        ("_codecs", "encode"): _latin1_bytes,
    }
    for module in ("scipy.sparse.csr", "scipy.sparse._csr", "scipy.sparse"):
        table[(module, "csr_matrix")] = sp.csr_matrix
    return table


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler whose ``find_class`` admits only numpy arrays/dtypes, ``scipy.sparse.csr_matrix``,
    ``collections.defaultdict`` and ``list``; anything else raises :class:`UnsafePickleError`."""

    _table: dict | None = None

    def find_class(self, module: str, name: str):
        if RestrictedUnpickler._table is None:
            RestrictedUnpickler._table = _allowed()
        try:
            return RestrictedUnpickler._table[(module, name)]
        except KeyError:
            raise UnsafePickleError(
                f"refusing to load {module}.{name} from a pickle: only numpy arrays, scipy CSR matrices and "
                f"defaultdict(list) are allowed in Planetoid files"
            ) from None


def restricted_loads(data: bytes, source: str = "<bytes>"):
    """Unpickle ``data`` (Python-2 pickles: ``encoding="latin1"``) with :class:`RestrictedUnpickler`."""
    try:
        return RestrictedUnpickler(io.BytesIO(data), encoding="latin1").load()
    except UnsafePickleError as e:
        raise UnsafePickleError(f"{source}: {e}") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as e:
        raise DataFormatError(source, None, f"not a valid Planetoid pickle ({type(e).__name__}: {e})") from None



@dataclasses.dataclass
class GraphData:
    """``x``: (N, F) float32 features; ``y``: (N,) long labels (argmax of the one-hot rows; 0 for the
    unlabelled padding rows, which no mask selects); ``edge_index``: (2, E) long, symmetric, no duplicates;
    ``train_mask``/``val_mask``/``test_mask``: (N,) bool; ``label_names``: the classes' names or None."""

    name: str
    x: torch.Tensor
    y: torch.Tensor
    edge_index: torch.Tensor
    train_mask: torch.Tensor
    val_mask: torch.Tensor
    test_mask: torch.Tensor
    num_classes: int
    #: the class names of a graph read from the user's files (class i is ``label_names[i]``); None for Planetoid
    label_names: list[str] | None = None

    @property
    def num_nodes(self) -> int:
        return self.x.shape[0]

    def sizes(self) -> dict[str, int]:
        return {"nodes": self.num_nodes, "edges": int(self.edge_index.shape[1]), "features": self.x.shape[1],
                "classes": self.num_classes, "train": int(self.train_mask.sum()), "val": int(self.val_mask.sum()),
                "test": int(self.test_mask.sum())}


def _load_part(folder: Path, name: str, part: str):
    path = folder / f"ind.{name}.{part}"
    return restricted_loads(read_bytes(path, name), str(path))


def _dense(m, path: str | Path) -> np.ndarray:
    """A part as a 2-D numeric array, or a DataFormatError naming its file (a list, a 1-D array or an array
    of strings would otherwise fail later as a bare TypeError or IndexError)."""
    if sp.issparse(m):
        m = np.asarray(m.todense())
    if not isinstance(m, np.ndarray):
        raise DataFormatError(path, None, f"expected a matrix (numpy array or scipy CSR), got {type(m).__name__}")
    if m.ndim != 2 or not (np.issubdtype(m.dtype, np.number) or m.dtype == bool):
        raise DataFormatError(path, None, f"expected a 2-D numeric matrix, got shape {m.shape} of {m.dtype}")
    return m


def _edges(graph, path: Path) -> tuple[list[int], list[int]]:
    """(source, target) ids of the ``graph`` part, a dict of neighbour-id lists."""
    if not isinstance(graph, dict):
        raise DataFormatError(path, None, f"expected a dict of neighbour lists, got {type(graph).__name__}")
    src, dst = [], []
    for u, nbrs in graph.items():
        try:
            for v in nbrs:
                src.append(int(u))
                dst.append(int(v))
        except (TypeError, ValueError):
            raise DataFormatError(path, None, f"node {u!r}: expected integer node ids and a list of integer "
                                              f"neighbour ids, got {nbrs!r:.60}") from None
    return src, dst


def undirected_edges(e: np.ndarray, n: int, self_loops: bool = False) -> np.ndarray:
    """A (2, E) int64 edge list as the GCN/GAT preprocessing leaves it: both directions of every edge, the
    graph's own self-loops removed, (i, i) for each of the ``n`` nodes added when ``self_loops``, duplicates
    removed, sorted by (source, target)."""
    e = np.concatenate([e, e[::-1]], axis=1)
    e = e[:, e[0] != e[1]]
    if self_loops:
        e = np.concatenate([e, np.tile(np.arange(n), (2, 1))], axis=1)
    return np.unique(e, axis=1)


def row_normalize(features: np.ndarray) -> np.ndarray:
    """Each row divided by its sum (GCN/GAT preprocessing of bag-of-words rows); all-zero rows stay zero."""
    rowsum = features.sum(1, keepdims=True)
    return np.divide(features, rowsum, out=np.zeros_like(features), where=rowsum != 0)


def load_planetoid(root: str | Path, name: str, normalize_features: bool = True, self_loops: bool = False,
                   folder: str = "planetoid") -> GraphData:
    """Load ``root/<folder>/ind.<name>.*``.  ``normalize_features``: divide each row by its sum (GCN/GAT
    preprocessing; all-zero rows stay zero).  ``self_loops``: add (i, i) for every node (the graph's own
    self-loops are always removed first, so the edge set is the same either way apart from the loops)."""
    if name not in ("cora", "citeseer", "pubmed"):
        raise ValueError(f"unknown Planetoid graph {name!r}; accepted: cora, citeseer, pubmed")
    d = Path(root) / folder
    x, y, tx, ty, allx, ally, graph = (_load_part(d, name, p) for p in ("x", "y", "tx", "ty", "allx", "ally", "graph"))
    p, lines = read_lines(d / f"ind.{name}.test.index", "utf-8", name)
    test_idx = []
    for i, line in enumerate(lines):
        try:
            test_idx.append(int(line))
        except ValueError:
            raise DataFormatError(p, i + 1, f"not a node id: {line[:30]!r}") from None
    test_idx = np.asarray(test_idx, dtype=np.int64)
    if not test_idx.size:
        raise DataFormatError(p, None, "no test node ids")
    part = {q: d / f"ind.{name}.{q}" for q in ("x", "y", "tx", "ty", "allx", "ally", "graph")}
    allx, tx = _dense(allx, part["allx"]), _dense(tx, part["tx"])
    ally, ty, y = _dense(ally, part["ally"]), _dense(ty, part["ty"]), _dense(y, part["y"])
    if tx.shape[1] != allx.shape[1]:
        raise DataFormatError(part["tx"], None, f"{tx.shape[1]} feature columns, allx has {allx.shape[1]}")
    if ty.shape[1] != ally.shape[1] or y.shape[1] != ally.shape[1]:
        raise DataFormatError(part["ty"] if ty.shape[1] != ally.shape[1] else part["y"], None,
                              f"label columns differ: y {y.shape[1]}, ty {ty.shape[1]}, ally {ally.shape[1]}")
    if tx.shape[0] != test_idx.size or ty.shape[0] != test_idx.size:
        raise DataFormatError(p, None, f"{test_idx.size} test ids but tx has {tx.shape[0]} rows, ty {ty.shape[0]}")
    if allx.shape[0] != ally.shape[0]:
        raise DataFormatError(d / f"ind.{name}.ally", None, f"{ally.shape[0]} rows, allx has {allx.shape[0]}")

    # Test rows go to the positions named by test.index; gaps (Citeseer) become zero rows.
    lo, hi = int(test_idx.min()), int(test_idx.max())
    n_test_block = hi - lo + 1
    if lo != allx.shape[0]:
        raise DataFormatError(p, None, f"smallest test id {lo} should equal the number of non-test nodes {allx.shape[0]}")
    tx_full = np.zeros((n_test_block, allx.shape[1]), dtype=np.float32)
    ty_full = np.zeros((n_test_block, ally.shape[1]), dtype=np.float32)
    tx_full[test_idx - lo] = tx
    ty_full[test_idx - lo] = ty
    features = np.vstack([allx, tx_full]).astype(np.float32)
    onehot = np.vstack([ally, ty_full])
    n = features.shape[0]

    src, dst = _edges(graph, part["graph"])
    e = np.asarray([src, dst], dtype=np.int64)
    if e.size and (e.min() < 0 or e.max() >= n):
        raise DataFormatError(d / f"ind.{name}.graph", None, f"node id outside 0..{n - 1}")
    e = undirected_edges(e, n, self_loops)
    if normalize_features:
        features = row_normalize(features)

    n_train = y.shape[0]
    masks = [np.zeros(n, dtype=bool) for _ in range(3)]
    masks[0][:n_train] = True
    masks[1][n_train : n_train + 500] = True
    masks[2][test_idx] = True
    return GraphData(name, torch.from_numpy(features), torch.from_numpy(onehot.argmax(1).astype(np.int64)),
                     torch.from_numpy(e), *(torch.from_numpy(m) for m in masks), int(onehot.shape[1]))
