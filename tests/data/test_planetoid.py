import collections
import os
import pickle

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from kernel_attention.data.files import DataFormatError
from kernel_attention.data.planetoid import UnsafePickleError, load_planetoid, restricted_loads

# A toy graph in the ind.* format: 4 non-test nodes (the first 2 labelled for training), test ids 5, 4, 7
# listed out of order, and node 6 missing from the test index (a Citeseer-style isolated node).
F, C = 3, 2
ALLX = np.array([[1, 0, 1], [0, 2, 0], [1, 1, 0], [0, 0, 3]], dtype=np.float32)
ALLY = np.eye(C)[[0, 1, 1, 0]]
TX = np.array([[5, 0, 0], [0, 4, 0], [0, 0, 7]], dtype=np.float32)  # rows for ids 5, 4, 7 (file order)
TY = np.eye(C)[[1, 0, 1]]
TEST_IDS = [5, 4, 7]
GRAPH = {0: [1, 1, 2], 1: [0], 2: [2, 3], 3: [], 4: [5], 5: [], 6: [], 7: [0]}  # duplicates, a self-loop, one-way edges


def _write(root, name="cora"):
    d = root / "planetoid"
    d.mkdir(parents=True, exist_ok=True)
    graph = collections.defaultdict(list, GRAPH)
    parts = {"x": sp.csr_matrix(ALLX[:2]), "y": ALLY[:2], "tx": sp.csr_matrix(TX), "ty": TY,
             "allx": sp.csr_matrix(ALLX), "ally": ALLY, "graph": graph}
    for part, obj in parts.items():
        (d / f"ind.{name}.{part}").write_bytes(pickle.dumps(obj, protocol=2))
    (d / f"ind.{name}.test.index").write_text("\n".join(map(str, TEST_IDS)) + "\n")
    return d


def _reference():
    # built independently: one row per node id, zero rows where a node has no features
    n = 8
    feats = {i: ALLX[i] for i in range(4)} | {t: TX[k] for k, t in enumerate(TEST_IDS)}
    x = np.stack([feats.get(i, np.zeros(F, np.float32)) for i in range(n)])
    labels = {i: int(ALLY[i].argmax()) for i in range(4)} | {t: int(TY[k].argmax()) for k, t in enumerate(TEST_IDS)}
    y = [labels.get(i, 0) for i in range(n)]
    edges = {(u, v) for u, vs in GRAPH.items() for v in vs if u != v}
    edges |= {(v, u) for u, v in edges}
    return x, y, edges


def test_standard_split_padding_and_edges(tmp_path):
    _write(tmp_path)
    g = load_planetoid(tmp_path, "cora", normalize_features=False)
    x, y, edges = _reference()
    assert torch.equal(g.x, torch.from_numpy(x))
    assert g.y.tolist() == y
    assert set(map(tuple, g.edge_index.t().tolist())) == edges
    assert g.edge_index.shape[1] == len(edges)  # no duplicates
    assert g.train_mask.nonzero().flatten().tolist() == [0, 1]
    assert g.val_mask.nonzero().flatten().tolist() == list(range(2, 8))  # range(len(y), len(y)+500), cut at N
    assert g.test_mask.nonzero().flatten().tolist() == sorted(TEST_IDS)
    assert g.num_classes == C and g.x.dtype == torch.float32 and g.edge_index.dtype == torch.long


def test_row_normalisation_and_self_loops(tmp_path):
    _write(tmp_path)
    g = load_planetoid(tmp_path, "cora", normalize_features=True, self_loops=True)
    sums = g.x.sum(1)
    assert torch.allclose(sums[[0, 1, 2, 3, 4, 5, 7]], torch.ones(7))
    assert sums[6] == 0  # the padded isolated node stays zero
    loops = g.edge_index[0] == g.edge_index[1]
    assert loops.sum() == 8
    _, _, edges = _reference()
    assert g.edge_index.shape[1] == len(edges) + 8


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch PWNED_BY_PICKLE",))


def test_restricted_unpickler_refuses_code(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UnsafePickleError, match=r"refusing to load (posix|os|nt)\.system"):
        restricted_loads(pickle.dumps(_Evil(), protocol=2), "evil.pkl")
    assert not (tmp_path / "PWNED_BY_PICKLE").exists()
    for payload in (pickle.dumps(eval, protocol=2), pickle.dumps(collections.OrderedDict(), protocol=2)):
        with pytest.raises(UnsafePickleError):
            restricted_loads(payload)


def test_malicious_file_in_dataset_is_refused(tmp_path, monkeypatch):
    d = _write(tmp_path)
    (d / "ind.cora.graph").write_bytes(pickle.dumps(_Evil(), protocol=2))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UnsafePickleError, match=r"ind\.cora\.graph"):
        load_planetoid(tmp_path, "cora")
    assert not (tmp_path / "PWNED_BY_PICKLE").exists()


def test_malformed_test_index_names_line(tmp_path):
    d = _write(tmp_path)
    (d / "ind.cora.test.index").write_text("5\n4\nseven\n")
    with pytest.raises(DataFormatError, match=r"ind\.cora\.test\.index:3"):
        load_planetoid(tmp_path, "cora")
    (d / "ind.cora.tx").write_bytes(b"not a pickle")
    with pytest.raises(DataFormatError, match=r"ind\.cora\.tx"):
        load_planetoid(tmp_path, "cora")


@pytest.mark.parametrize("part, obj, message", [
    ("graph", {0: 5}, r"ind.cora.graph: node 0: expected integer node ids and a list of integer neighbour ids"),
    ("graph", {0: ["a"]}, r"ind.cora.graph: node 0: expected integer node ids"),
    ("ally", np.zeros(4), r"ind.cora.ally: expected a 2-D numeric matrix, got shape \(4,\)"),
    ("y", [[1, 0]], r"ind.cora.y: expected a matrix \(numpy array or scipy CSR\), got list"),
    ("tx", np.zeros((3, 5), np.float32), r"ind.cora.tx: 5 feature columns, allx has 3"),
    ("allx", np.array([["a", "b", "c"]] * 4), r"ind.cora.allx: expected a 2-D numeric matrix"),
])
def test_a_malformed_part_is_an_error_naming_its_file(tmp_path, part, obj, message):
    d = _write(tmp_path)
    (d / f"ind.cora.{part}").write_bytes(pickle.dumps(obj, protocol=2))
    with pytest.raises(DataFormatError, match=message):
        load_planetoid(tmp_path, "cora")
