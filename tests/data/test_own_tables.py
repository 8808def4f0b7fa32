"""Your own labelled text by path: ``tsv:path=...`` / ``csv:path=...`` for sentence classification."""

import json
import shutil

import pytest
import yaml

import kernel_attention as ka
from kernel_attention.cli import main
from kernel_attention.data import DATASETS, DataFormatError
from kernel_attention.registry import SpecError

POS = ["a great film", "what a fine movie", "great acting and a fine story", "i loved it"]
NEG = ["a bad film", "what a dull movie", "bad acting and a dull story", "i hated it"]


def write_tsv(folder, n=24, header=True):
    folder.mkdir(parents=True, exist_ok=True)
    for split, k in (("train", n), ("valid", 4), ("test", 4)):
        rows = [f"{(POS if i % 2 else NEG)[i // 2 % 4]}\t{'pos' if i % 2 else 'neg'}" for i in range(k)]
        (folder / f"{split}.tsv").write_text(("sentence\tlabel\n" if header else "") + "\n".join(rows) + "\n")
    return folder


def test_tsv_folder_by_name_and_by_index(tmp_path):
    d = DATASETS.create(f"tsv:path={write_tsv(tmp_path / 'rev')},text=sentence")
    assert d.num_classes == 2 and d.label_names == ["neg", "pos"] and d.sizes() == {"train": 24, "valid": 4, "test": 4}
    assert d.texts[1] == "a great film" and int(d.labels[1]) == 1
    d2 = DATASETS.create(f"tsv:path={write_tsv(tmp_path / 'raw', header=False)},text=0,label=1")
    assert d2.texts == d.texts and d2.labels.tolist() == d.labels.tolist()
    with pytest.raises(DataFormatError, match="no column 'text'"):
        DATASETS.create(f"tsv:path={tmp_path / 'rev'}")           # the header says 'sentence'


def test_csv_single_file_split_by_ratio_with_quotes(tmp_path):
    rows = ["id,review,stars"] + [f'{i},"{(POS if i % 2 else NEG)[i % 4]}, really",{5 if i % 2 else 1}'
                                  for i in range(40)]
    (tmp_path / "r.csv").write_text("\n".join(rows) + "\n")
    spec = f"csv:path={tmp_path / 'r.csv'},text=review,label=2,valid=0.1,test=0.2,seed=3"
    d = DATASETS.create(spec)
    assert d.sizes() == {"valid": 4, "test": 8, "train": 28} and d.label_names == ["1", "5"]
    assert d.texts[0].endswith(", really")
    assert DATASETS.create(spec).texts == d.texts                   # the seed fixes the cut
    assert DATASETS.create(spec.replace("seed=3", "seed=4")).texts != d.texts
    (tmp_path / "one.csv").write_text("text,label\na,x\nb,x\nc,x\n")
    with pytest.raises(DataFormatError, match="one label"):
        DATASETS.create(f"csv:path={tmp_path / 'one.csv'}")


def test_classifier_on_tsv_trains_and_travels(tmp_path, capsys):
    data = write_tsv(tmp_path / "rev")
    cfg = {"task": {"name": "classification", "batch_size": 8},
           "data": {"dataset": f"tsv:path={data},text=sentence,label=label"},
           "model": {"d_model": 16, "n_heads": 2, "d_ff": 16, "n_layers": 1},
           "train": {"max_steps": 6, "lr": 0.01, "progress": False, "test_best": False}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    run = tmp_path / "run"
    assert main(["train", str(tmp_path / "c.yaml"), "--run-dir", str(run)]) == 0
    assert json.loads((run / "vocab.json").read_text())
    capsys.readouterr()
    assert main(["evaluate", str(run)]) == 0
    assert 0.0 <= json.loads(capsys.readouterr().out.strip().splitlines()[-1])["accuracy"] <= 1.0
    shutil.rmtree(data)                                            # the model is still usable without the data
    loaded = ka.load(run)
    assert loaded.task.num_classes == 2 and set(loaded.task.classify(loaded.model, POS[:2] + ["zebra"])) <= {"neg", "pos"}


def test_tsv_is_a_classification_dataset(tmp_path):
    from kernel_attention.tasks import build_task
    with pytest.raises(SpecError, match="'csv' is a classification dataset"):
        build_task({"task": {"name": "lm"}, "data": {"dataset": f"csv:path={tmp_path}"}})
    with pytest.raises(SpecError, match="csv:path=.*tsv:path="):
        build_task({"task": {"name": "classification"}, "data": {"dataset": "text:path=x"}})


def test_a_row_of_another_width_and_an_unclosed_quote_are_named_with_their_line(tmp_path):
    folder = write_tsv(tmp_path / "rev")
    with open(folder / "train.tsv", "a") as f:
        f.write("a great\tfilm\tpos\n")                       # a tab inside the text would make 'film' a label
    with pytest.raises(DataFormatError, match=r"train\.tsv:26: 3 field\(s\), the first row has 2 \(a tab inside"):
        DATASETS.create(f"tsv:path={folder},text=sentence")
    unlabelled = write_tsv(tmp_path / "unlabelled")
    (unlabelled / "test.tsv").write_text("sentence\tlabel\na film\tpos\nno label\t \n")
    with pytest.raises(DataFormatError, match=r"test\.tsv:3: an empty label"):
        DATASETS.create(f"tsv:path={unlabelled},text=sentence")
    rows = [f"{'pos' if i % 2 else 'neg'},a film {i}" for i in range(40)]
    rows[5] = 'neg,"a dull movie'                                # its quote would take in the 34 rows after it
    (tmp_path / "q.csv").write_text("\n".join(rows) + "\n")
    with pytest.raises(DataFormatError, match=r"q\.csv:6: not a CSV record \(unexpected end of data\)"):
        DATASETS.create(f"csv:path={tmp_path / 'q.csv'},text=1,label=0")
    (tmp_path / "ok.csv").write_text('label,text\npos,"two\nlines, quoted"\nneg,b\npos,c\nneg,d\n')
    assert DATASETS.create(f"csv:path={tmp_path / 'ok.csv'},valid=0.25,test=0.25").sizes() == \
        {"valid": 1, "test": 1, "train": 2}


def test_negative_text_and_label_indices(tmp_path):
    folder = write_tsv(tmp_path / "raw", header=False)
    d = DATASETS.create(f"tsv:path={folder},text=0,label=1")
    assert DATASETS.create(f"tsv:path={folder},text=-2,label=-1").labels.tolist() == d.labels.tolist()
    with pytest.raises(DataFormatError, match=r"label=-5 is not a column: the first row has 2 .*a tab\?\)"):
        DATASETS.create(f"tsv:path={folder},text=0,label=-5")
