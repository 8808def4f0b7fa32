"""Your own graph by path for node classification: ``graph:path=DIR`` (edge list, features, labels, splits)."""

import gzip
import json

import pytest
import yaml

from kernel_attention.cli import main
from kernel_attention.data import DATASETS, DataFormatError, MissingDataError
from kernel_attention.registry import SpecError

N = 24


def feature(i: int) -> tuple[float, float]:
    """Two features that separate the classes (class = i % 2)."""
    return (1.0 + i / 100, 0.5) if i % 2 else (0.5, 1.0 + i / 100)


def ring(n: int = N) -> list[tuple[int, int]]:
    """Each node linked to the node two further on: same-class neighbours."""
    return [(i, (i + 2) % n) for i in range(n)]


def write_csv_graph(folder, n=N, labels="label"):
    """features.csv with a node-id column `node` (ids n0, n1, ...) and the label column; edges.csv with a header."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = [f"n{i},{feature(i)[0]},{feature(i)[1]},{'red' if i % 2 else 'blue'}" for i in range(n)]
    (folder / "features.csv").write_text(f"node,a,b,{labels}\n" + "\n".join(rows) + "\n")
    (folder / "edges.csv").write_text("source,target\n" + "".join(f"n{a},n{b}\n" for a, b in ring(n)))
    return folder


def undirected(edges) -> set:
    return {(a, b) for a, b in edges} | {(b, a) for a, b in edges}


def test_csv_folder_with_ids_and_a_label_column(tmp_path):
    g = DATASETS.create(f"graph:path={write_csv_graph(tmp_path / 'g')},id=node")
    assert g.x.shape == (N, 2) and g.x[3].tolist() == pytest.approx(feature(3))
    assert g.label_names == ["blue", "red"] and g.y.tolist() == [i % 2 for i in range(N)]
    assert set(map(tuple, g.edge_index.t().tolist())) == undirected(ring())
    sizes = g.sizes()
    assert (sizes["train"], sizes["val"], sizes["test"]) == (N - 2 * round(0.1 * N), round(0.1 * N), round(0.1 * N))
    assert not (g.train_mask & g.test_mask).any() and bool((g.train_mask | g.val_mask | g.test_mask).all())
    again = DATASETS.create(f"graph:path={tmp_path / 'g'},id=node")
    other = DATASETS.create(f"graph:path={tmp_path / 'g'},id=node,seed=1")
    assert again.test_mask.tolist() == g.test_mask.tolist() and other.test_mask.tolist() != g.test_mask.tolist()
    loops = DATASETS.create(f"graph:path={tmp_path / 'g'},id=node,self_loops=true,normalize_features=true")
    assert loops.edge_index.shape[1] == 2 * N + N and float(loops.x[0].sum()) == pytest.approx(1.0)


def test_linqs_layout_whitespace_split_files_and_gz(tmp_path):
    """cora.cites / cora.content as LINQS ships them: whitespace, no header, id first and the label last;
    the splits as files of node ids, valid drawn from train when there is no valid file."""
    d = tmp_path / "cora"
    d.mkdir()
    content = "".join(f"p{i}\t{feature(i)[0]}\t{feature(i)[1]}\tc{i % 2}\n" for i in range(N))
    (d / "cora.content.gz").write_bytes(gzip.compress(content.encode()))
    (d / "cora.cites").write_text("# citing cited\n" + "".join(f"p{a} p{b} 1.0\n" for a, b in ring()))
    (d / "train.txt").write_text(" ".join(f"p{i}" for i in range(10)) + "\n")
    (d / "test.txt").write_text("\n".join(f"p{i}" for i in range(20, N)) + "\n")
    g = DATASETS.create(f"graph:path={d},edges=cora.cites,features=cora.content,id=0,label=-1")
    assert g.x.shape == (N, 2) and g.label_names == ["c0", "c1"]
    assert g.test_mask.nonzero().flatten().tolist() == list(range(20, N))
    assert sorted((g.train_mask | g.val_mask).nonzero().flatten().tolist()) == list(range(10))
    assert int(g.val_mask.sum()) == 1 and not (g.train_mask & g.val_mask).any()
    (d / "valid.txt").write_text("p10 p11\n")
    g = DATASETS.create(f"graph:path={d},edges=cora.cites,features=cora.content,id=0,label=-1")
    assert g.val_mask.nonzero().flatten().tolist() == [10, 11] and int(g.train_mask.sum()) == 10


def test_split_files_as_masks(tmp_path):
    d = write_csv_graph(tmp_path / "g")
    for split, nodes in (("train", range(0, 12)), ("valid", range(12, 16)), ("test", range(16, N))):
        (d / f"{split}.txt").write_text("".join("1\n" if i in nodes else "0\n" for i in range(N)))
    g = DATASETS.create(f"graph:path={d},id=node")
    assert [m.nonzero().flatten().tolist() for m in (g.train_mask, g.val_mask, g.test_mask)] == [
        list(range(12)), list(range(12, 16)), list(range(16, N))]
    (d / "test.txt").write_text("".join("1\n" if i >= 16 else "0\n" for i in range(N - 1)))   # one value short
    with pytest.raises(DataFormatError, match=rf"test\.txt: {N - 1} values of 0/1, but the features table has {N} "):
        DATASETS.create(f"graph:path={d},id=node")


def test_labels_file_in_row_order_and_a_split_column(tmp_path):
    """No node ids: node i is feature row i; the labels (and a split column) in labels.tsv, one row per node;
    an empty label leaves a node unlabelled."""
    d = tmp_path / "g"
    d.mkdir()
    (d / "features.txt").write_text("".join(f"{feature(i)[0]} {feature(i)[1]}\n" for i in range(N)))
    (d / "edges.txt").write_text("".join(f"{a} {b}\n" for a, b in ring()))
    split = ["train"] * 12 + ["val"] * 4 + ["test"] * 6 + ["", "-"]
    labels = [str(i % 2) for i in range(N - 1)] + [""]
    (d / "labels.tsv").write_text("y\tfold\n" + "".join(f"{y}\t{s}\n" for y, s in zip(labels, split)))
    g = DATASETS.create(f"graph:path={d},label=y,split=fold")
    assert g.label_names == ["0", "1"] and g.y.tolist() == [i % 2 for i in range(N - 1)] + [0]
    assert [int(m.sum()) for m in (g.train_mask, g.val_mask, g.test_mask)] == [12, 4, 6]
    assert g.val_mask.nonzero().flatten().tolist() == [12, 13, 14, 15]


@pytest.mark.parametrize("damage, error, message", [
    (lambda d: (d / "edges.csv").write_text("source,target\nn0,n1\nn2,n99\n"), DataFormatError,
     r"edges\.csv:3: node id 'n99' has no row in features\.csv \(node ids: its node column\)"),
    (lambda d: write_csv_graph(d, labels="class"), DataFormatError, r"no column 'label' for label= in the header"),
    (lambda d: (d / "features.csv").unlink(), MissingDataError, r"no features file .*features\.csv"),
    (lambda d: (d / "features.csv").write_text("node,a,b,label\nn0,1,x,red\n"), DataFormatError,
     r"features\.csv:2: column 'b' holds 'x', not a number .*ignore=b"),
    (lambda d: (d / "features.csv").write_text("node,a,b,part,label\nn0,1,2,Train,red\n"), DataFormatError,
     r"features\.csv:2: column 'part' holds 'Train', not a number \(a column of splits: name it with split=part\)"),
    (lambda d: (d / "features.csv").write_text("node,a,b,label\nn0,1,2,red\nn0,1,2,blue\n"), DataFormatError,
     r"features\.csv:3: node id 'n0' repeats line 2"),
    (lambda d: (d / "train.txt").write_text("n0\n"), MissingDataError, r"train\.txt but no test\.txt"),
    # a first edge between unknown ids is no header row (a header names its columns without digits)
    (lambda d: (d / "edges.csv").write_text("p98,p99\nn0,n1\n"), DataFormatError,
     r"edges\.csv:1: node id 'p98' has no row in features\.csv .*a header row names its columns without digits"),
])
def test_bad_graph_files_name_what_is_wrong(tmp_path, damage, error, message):
    d = write_csv_graph(tmp_path / "g")
    damage(d)
    with pytest.raises(error, match=message):
        DATASETS.create(f"graph:path={d},id=node")


def test_not_a_folder_and_wrong_task(tmp_path):
    with pytest.raises(MissingDataError, match="does not exist: give a folder with edges.csv"):
        DATASETS.create(f"graph:path={tmp_path / 'nowhere'}")
    from kernel_attention.tasks import build_task
    with pytest.raises(SpecError, match=r"'graph' is a graph dataset"):
        build_task({"task": {"name": "classification"}, "data": {"dataset": f"graph:path={tmp_path}"}})
    with pytest.raises(SpecError, match=r"citeseer, cora, pubmed, or your own files: graph:path="):
        build_task({"task": {"name": "node_classification"}, "data": {"dataset": "text:path=x"}})


def config(tmp_path, data: str) -> str:
    cfg = {"task": {"name": "node_classification"}, "data": {"dataset": data},
           "model": {"hidden": 4, "heads": 2, "dropout": 0.0},
           "train": {"max_steps": 30, "lr": 0.02, "progress": False, "test_best": False}}
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(cfg))
    return str(tmp_path / "g.yaml")


def test_node_classifier_on_a_graph_by_path_trains(tmp_path, capsys):
    cfg = config(tmp_path, f"graph:path={write_csv_graph(tmp_path / 'g', n=40)},id=node")
    run = tmp_path / "run"
    assert main(["train", cfg, "--run-dir", str(run)]) == 0
    capsys.readouterr()
    assert main(["evaluate", str(run), "--split", "test"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["accuracy"] >= 0.75          # the two classes are separable by the features (chance: 0.5)


def test_bad_graph_exits_2_with_one_line(tmp_path, capsys):
    d = write_csv_graph(tmp_path / "g")
    (d / "edges.csv").write_text("n0,n1\nn1,n7x\n")
    assert main(["train", config(tmp_path, f"graph:path={d},id=node"), "--check"]) == 2
    err = capsys.readouterr().err
    assert "node id 'n7x' has no row in features.csv" in err and "Traceback" not in err


def test_a_split_value_out_of_the_vocabulary_and_negative_columns(tmp_path):
    d = write_csv_graph(tmp_path / "g")
    rows = (d / "features.csv").read_text().splitlines()
    split = ["train"] * 12 + ["valid"] * 4 + ["test"] * (N - 16)
    (d / "features.csv").write_text("\n".join([rows[0] + ",split"] + [r + f",{s}" for r, s in zip(rows[1:], split)])
                                    + "\n")
    g = DATASETS.create(f"graph:path={d},id=node,label=label,split=split")
    assert [int(m.sum()) for m in (g.train_mask, g.val_mask, g.test_mask)] == [12, 4, N - 16]
    assert DATASETS.create(f"graph:path={d},id=0,label=-2,split=-1").y.tolist() == g.y.tolist()
    (d / "features.csv").write_text((d / "features.csv").read_text().replace("test\n", "tst\n", 1))
    with pytest.raises(DataFormatError, match=r"the split column holds 'tst'; its values are train, valid"):
        DATASETS.create(f"graph:path={d},id=node,label=label,split=split")
    with pytest.raises(DataFormatError, match=r"label=-6 is not a column: the first row has 5 \(0\.\.4, or -1"):
        DATASETS.create(f"graph:path={d},id=node,label=-6,split=split")


def test_a_first_column_headed_id_holds_the_node_ids_even_when_they_are_numbers(tmp_path, capsys):
    d = tmp_path / "g"
    d.mkdir()
    (d / "features.csv").write_text("ID,a,b,label\n" + "".join(
        f"{100 + i},{feature(i)[0]},{feature(i)[1]},{i % 2}\n" for i in range(N)))
    (d / "edges.txt").write_text("".join(f"{100 + a} {100 + b}\n" for a, b in ring()))
    g = DATASETS.create(f"graph:path={d}")
    assert g.x.shape == (N, 2) and set(map(tuple, g.edge_index.t().tolist())) == undirected(ring())
    assert main(["data", "check", str(d), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["spec"] == f"graph:path={d},id=ID"
    with pytest.raises(DataFormatError, match=r"features\.csv:1: column '0' holds 'ID', not a number"):
        DATASETS.create(f"graph:path={d},header=false,label=-1")   # no header: the first row is a node


def test_a_feature_beyond_float32_names_its_line(tmp_path):
    d = write_csv_graph(tmp_path / "g")
    (d / "features.csv").write_text("node,a,b,label\nn0,1,2,red\nn1,3,1e39,blue\n")
    with pytest.raises(DataFormatError, match=r"features\.csv:3: column 'b' holds 1e\+39, beyond float32's range"):
        DATASETS.create(f"graph:path={d}")
