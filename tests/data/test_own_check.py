"""``kernel-attention data check PATH`` on the user's own data: what it detects, for each kind."""

import json

import pytest

from kernel_attention.cli import main
from tests.data.test_own_data import EN, FR, LINES, write_pairs, write_text
from tests.data.test_own_graph import write_csv_graph
from tests.data.test_own_regression_table import write_table
from tests.data.test_own_tables import write_tsv


def check(capsys, path, *options) -> tuple[int, str, str]:
    rc = main(["data", "check", str(path), *options])
    out, err = capsys.readouterr()
    return rc, out, err


def report(capsys, path) -> dict:
    rc, out, err = check(capsys, path, "--json")
    assert rc == 0, err
    return json.loads(out)


def test_language_model_folder_and_single_file(tmp_path, capsys):
    rep = report(capsys, write_text(tmp_path / "corpus", n=24))
    assert rep["task"] == "lm" and rep["spec"] == f"text:path={tmp_path / 'corpus'}"
    assert rep["lines"] == {"train": 24, "valid": 24, "test": 24}
    assert rep["vocabulary"] == 2 + len({w for line in LINES for w in line.split()})   # <unk>, <eos> and the words
    assert rep["splits"] == "files test.txt, train.txt, valid.txt"
    one = tmp_path / "all.txt"
    one.write_text("\n".join(LINES * 10) + "\n")
    rep = report(capsys, one)
    assert rep["splits"].startswith("made by ratio (valid=0.1, test=0.1") and sum(rep["lines"].values()) == 40
    rc, out, _ = check(capsys, one)
    assert rc == 0 and "task       lm" in out and "checksums  none" in out


def test_parallel_folder(tmp_path, capsys):
    rep = report(capsys, write_pairs(tmp_path / "pairs", n=36))
    assert rep["task"] == "translation" and rep["spec"].endswith(",src=en,tgt=fr")
    assert rep["sizes"] == "pairs train 36 / valid 6 / test 6"
    assert rep["vocabulary"] == {"en": len({w for s in EN for w in s.split()}), "fr": len({w for s in FR for w in s.split()})}


def test_classification_tsv_folder_and_csv_file(tmp_path, capsys):
    rep = report(capsys, write_tsv(tmp_path / "rev", n=24))
    assert rep["task"] == "classification" and rep["spec"].endswith(",text=sentence,label=label")
    assert rep["classes"] == {"neg": 16, "pos": 16}   # 24 + 4 + 4 rows, half each and rep["splits"] == "files test.tsv, train.tsv, valid.tsv"
    (tmp_path / "r.csv").write_text("".join(f"{i % 3},a review with words {i}\n" for i in range(30)))
    rep = report(capsys, tmp_path / "r.csv")
    assert rep["spec"].endswith(",text=1,label=0") and rep["classes"] == {"0": 10, "1": 10, "2": 10}
    assert rep["splits"].startswith("made by ratio")


def test_regression_table(tmp_path, capsys):
    rep = report(capsys, write_table(tmp_path / "t.csv"))
    assert rep["task"] == "regression" and rep["spec"].endswith(",target=y")
    assert rep["columns"] == {"features": ["id", "a", "b"], "target": "y"} and rep["sizes"] == "rows 30, features 3"
    rc, out, _ = check(capsys, tmp_path / "t.csv")
    assert "columns    features id, a, b; target y" in out


def test_graph_folder_and_spec(tmp_path, capsys):
    g = write_csv_graph(tmp_path / "g", n=20)
    rep = report(capsys, g)
    assert rep["task"] == "node_classification" and rep["spec"] == f"graph:path={g},id=node"
    assert rep["files"] == ["edges.csv", "features.csv"] and rep["classes"] == {"blue": 10, "red": 10}
    assert rep["sizes"].startswith("nodes 20, edges 40") and "of the labelled nodes" in rep["splits"]
    (g / "train.txt").write_text("n0 n1 n2 n3\n")
    (g / "test.txt").write_text("n4 n5\n")
    rep = report(capsys, f"graph:path={g},id=node,valid=0.5")
    assert rep["splits"] == "files train.txt, test.txt" and rep["sizes"].endswith("train 2 / val 2 / test 2")


def test_bad_paths_exit_2_and_bad_files_1(tmp_path, capsys):
    rc, out, err = check(capsys, tmp_path / "nowhere")
    assert rc == 2 and "nowhere does not exist" in err and "Traceback" not in err
    rc, _, err = check(capsys, "graph:path=nowhere")
    assert rc == 2 and "graph data nowhere does not exist" in err
    g = write_csv_graph(tmp_path / "g")
    (g / "edges.csv").write_text("n0,n1\nn1,zz\n")
    rc, _, err = check(capsys, g)
    assert rc == 1 and "edges.csv:2: node id 'zz' has no row in features.csv" in err


def test_empty_files_a_bom_and_an_unknown_spec_are_named(tmp_path, capsys):
    """An empty table or text split is an error that says so (1: unreadable); a UTF-8 byte-order mark is dropped;
    a spec of no by-path dataset says which are (2)."""
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    for path in (empty, f"tsv:path={empty}"):
        rc, _, err = check(capsys, path)
        assert rc == 1 and "the file is empty (no rows)" in err and "Traceback" not in err
    corpus = write_text(tmp_path / "corpus", n=4)
    (corpus / "valid.txt").write_text("")
    rc, _, err = check(capsys, corpus)
    assert rc == 1 and "valid.txt: the file is empty (no lines of text)" in err
    bom = tmp_path / "bom.tsv"
    bom.write_bytes(b"\xef\xbb\xbftext\tlabel\n" + b"".join(b"a b c\t%d\n" % (i % 2) for i in range(20)))
    assert report(capsys, f"tsv:path={bom}")["classes"] == {"0": 10, "1": 10}
    rc, _, err = check(capsys, "bogus:path=x")
    assert rc == 2 and "'bogus' is no dataset that reads your own data; accepted: csv, graph" in err


def test_a_folders_table_is_labelled_text_even_with_one_word_texts(tmp_path, capsys):
    """A folder's train/valid/test tables are labelled text (a regression table is one file), so a header that
    names other columns is read by those names, and a short row is named, not taken for a regression folder."""
    for name, rows in (("other-names", "text\tlab\nhello\tpos\nbye\tneg\n"),
                       ("short-row", "text\tlabel\nhello\tpos\nnolabel\n")):
        folder = tmp_path / name
        folder.mkdir()
        for split in ("train", "valid", "test"):
            (folder / f"{split}.tsv").write_text(rows)
        rc, out, err = check(capsys, folder)
        if name == "other-names":
            assert rc == 0 and f"tsv:path={folder},text=text,label=lab" in out
        else:
            assert rc == 1 and "train.tsv:3: 1 field(s), the first row has 2 (is the separator a tab?)" in err


@pytest.mark.parametrize("layout", ["staged", "empty"])
def test_a_data_root_is_still_checked_as_one(tmp_path, capsys, layout):
    if layout == "staged":
        (tmp_path / "planetoid").mkdir()
        (tmp_path / "train.txt").write_text("a b\n")     # a stray file does not make the root a corpus
    rc, out, _ = check(capsys, tmp_path)
    assert rc == 0 and out.startswith(f"data root: {tmp_path}") and "summary: " in out


def test_a_folder_whose_file_does_not_read_is_named_and_one_of_no_layout_exits_2(tmp_path, capsys):
    """Detection reads the folder's files too: a file it cannot read is reported as unreadable (1, file and
    line), never a traceback; a folder with files of no layout and no staged dataset is no data root (2)."""
    g = write_csv_graph(tmp_path / "g")
    (g / "features.csv").write_text("")
    empty = tmp_path / "e"
    empty.mkdir()
    (empty / "train.tsv").write_text("")
    extra = write_tsv(tmp_path / "xt")
    with open(extra / "train.tsv", "a") as f:
        f.write("a great\tfilm\tpos\n")
    for path, message in ((g, "features.csv: the file is empty"), (empty, "train.tsv: the file is empty (no rows)"),
                          (extra, "train.tsv:26: 3 field(s), the first row has 2")):
        rc, _, err = check(capsys, path)
        assert rc == 1 and message in err and "Traceback" not in err, err
    other = tmp_path / "m"
    other.mkdir()
    (other / "training.tsv").write_text("sentence\tlabel\na b c\tpos\n")
    rc, out, err = check(capsys, other)
    assert rc == 2 and "holds none of the layouts of your own data" in err and "no staged dataset" in err and not out


def test_a_path_with_a_comma_says_how_to_give_it(tmp_path, capsys):
    corpus = write_text(tmp_path / "c,v2", n=4)
    rc, out, err = check(capsys, corpus)
    assert rc == 2 and "a path with a comma cannot go in a spec string" in err and "Traceback" not in err
    assert f"data: {{dataset: {{name: ..., path: {str(corpus)!r}}}}}" in err


@pytest.mark.parametrize("layout", ["labels-file", "split-last"])
def test_a_graphs_label_column_is_found_in_a_labels_file_and_before_a_split_column(tmp_path, capsys, layout):
    """The detected label column is the labels file's last (when there is one and it has no column `label`), and a
    last column of train / valid / test values is read as the split column, the label the one before it."""
    g = write_csv_graph(tmp_path / "g", n=20, labels="topic")
    rows = (g / "features.csv").read_text().splitlines()
    if layout == "labels-file":
        (g / "features.csv").write_text("\n".join(r.rsplit(",", 1)[0] for r in rows) + "\n")
        (g / "labels.csv").write_text("\n".join(",".join((r.split(",")[0], r.rsplit(",", 1)[1])) for r in rows) + "\n")
        want = f"graph:path={g},id=node,label=topic"
    else:
        split = ["train"] * 12 + ["valid"] * 4 + ["test"] * 4
        (g / "features.csv").write_text("\n".join([rows[0] + ",part"] + [r + f",{s}" for r, s in zip(rows[1:], split)])
                                        + "\n")
        want = f"graph:path={g},id=node,split=part,label=topic"
    rep = report(capsys, g)
    assert rep["spec"] == want and rep["classes"] == {"blue": 10, "red": 10}
    if layout == "split-last":
        assert rep["splits"] == "column split=part" and rep["sizes"].endswith("train 12 / val 4 / test 4")


def test_a_last_column_headed_split_is_the_split_column_even_with_a_bad_value(tmp_path, capsys):
    """A value out of the split vocabulary ('tst') is named in the split column, not blamed on the label column
    (which, the split column not detected, was read as a feature)."""
    g = write_csv_graph(tmp_path / "g", n=20, labels="topic")
    rows = (g / "features.csv").read_text().splitlines()
    split = ["train"] * 12 + ["valid"] * 4 + ["test"] * 3 + ["tst"]
    (g / "features.csv").write_text("\n".join([rows[0] + ",split"] + [r + f",{s}" for r, s in zip(rows[1:], split)])
                                    + "\n")
    assert main(["data", "check", str(g)]) == 1
    assert "the split column holds 'tst'; its values are train, valid" in capsys.readouterr().err


def test_a_header_cell_that_reads_as_a_number_is_given_by_index(tmp_path, capsys):
    """A header naming a column `1` cannot go in the spec as label=1 (an index): the spec names the columns by
    index and says header=true, so the detected spec reads the file as detected."""
    folder = tmp_path / "h"
    folder.mkdir()
    for split in ("train", "valid", "test"):
        (folder / f"{split}.tsv").write_text("review\t1\na great film\tpos\na dull movie\tneg\nso good\tpos\n")
    rep = report(capsys, folder)
    assert rep["spec"] == f"tsv:path={folder},text=0,label=1,header=true" and rep["classes"] == {"neg": 3, "pos": 6}


def test_a_config_file_checks_the_data_it_names(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_text(tmp_path / "corpus")
    (tmp_path / "lm.yaml").write_text("task: {name: lm}\ndata: {dataset: {name: text, path: corpus}}\n")
    rc, out, _ = check(capsys, "lm.yaml")
    assert rc == 0 and out.startswith("text:path=corpus: your own data") and "lines      train 24" in out
    (tmp_path / "wt.yaml").write_text(f"task: {{name: lm}}\ndata: {{dataset: wikitext-2, root: {tmp_path}}}\n")
    rc, out, _ = check(capsys, "wt.yaml")    # a staged dataset: checked under the config's data root
    assert rc == 1 and out.startswith(f"data root: {tmp_path}") and "wikitext-2    missing" in out
    (tmp_path / "none.yaml").write_text("task: {name: lm}\n")
    rc, _, err = check(capsys, "none.yaml")
    assert rc == 2 and "config none.yaml needs data.dataset" in err


@pytest.mark.parametrize("kind", ["text", "parallel"])
def test_a_missing_validation_split_names_the_files_looked_for(tmp_path, capsys, kind):
    folder = write_text(tmp_path / "d") if kind == "text" else write_pairs(tmp_path / "d")
    suffix = ".txt" if kind == "text" else ".en"
    (folder / f"valid{suffix}").unlink()
    rc, _, err = check(capsys, folder)
    assert rc == 2 and f"has no valid split: looked for valid{suffix}, val{suffix} or dev{suffix}" in err
    (folder / f"valid{suffix}").write_text("a line\n" if kind == "text" else "the cat\n" * 6)
    (folder / f"valid{suffix}").rename(folder / f"dev{suffix}")
    if kind == "parallel":
        (folder / "valid.fr").rename(folder / "dev.fr")
    assert report(capsys, folder)["task"] in ("lm", "translation")
