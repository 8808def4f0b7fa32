import pytest

from kernel_attention.data.classification import load_classification, read_class_files, read_labelled_lines
from kernel_attention.data.files import DataFormatError
from kernel_attention.data.protocols import kfold_indices
from kernel_attention.data.vocab import Vocab


def _root(tmp_path):
    d = tmp_path / "sentence-classification"
    d.mkdir()
    return d


def test_latin1_file_with_0x85_keeps_line_count(tmp_path):
    d = _root(tmp_path)
    # Latin-1 bytes (0xe9 = é) and 0x85 inside lines; not valid UTF-8
    blob = b"1 a caf\xe9 review\n0 hmmm\x85might be bad\n1 fine\n0 \n"
    (d / "rt-polarity.all").write_bytes(blob)
    data = load_classification(tmp_path, "mr")
    assert len(data) == blob.count(b"\n") == 4
    assert data.encodings == {"rt-polarity.all": "latin-1"}
    assert data.texts[0] == "a café review"
    assert data.texts[1] == "hmmm\x85might be bad"
    assert data.tokens()[1] == ["hmmm", "might", "be", "bad"]  # 0x85 separates words, as the ellipsis does
    assert data.texts[3] == ""  # an empty sentence is kept, as in the released CR / MPQA files
    assert data.labels.tolist() == [1, 0, 1, 0] and data.splits == {}
    assert data.class_counts() == [2, 2]


def test_utf8_file_is_read_as_utf8(tmp_path):
    d = _root(tmp_path)
    (d / "custrev.all").write_text("1 naïve but good\n0 bad\n", encoding="utf-8")
    data = load_classification(tmp_path, "cr")
    assert data.encodings["custrev.all"] == "utf-8" and data.texts[0] == "naïve but good"


@pytest.mark.parametrize("bad,line", [(b"1 ok\nx not a label\n", 2), (b"1 ok\n0 ok\n7 too big\n", 3), (b"just-one-token\n", 1)])
def test_malformed_label_lines_name_file_and_line(tmp_path, bad, line):
    d = _root(tmp_path)
    (d / "mpqa.all").write_bytes(bad)
    with pytest.raises(DataFormatError, match=rf"mpqa\.all:{line}:"):
        load_classification(tmp_path, "mpqa")


def test_given_splits(tmp_path):
    d = _root(tmp_path)
    (d / "TREC.train.all").write_bytes(b"0 How did it start ?\n5 How many ?\n3 Who is he ?\n")
    (d / "TREC.test.all").write_bytes(b"4 Where is it ?\n")
    data = load_classification(tmp_path, "trec")
    assert data.sizes() == {"train": 3, "test": 1}
    assert [data.texts[i] for i in data.splits["test"].tolist()] == ["Where is it ?"]
    assert data.num_classes == 6


def test_class_files_and_cv_protocol(tmp_path):
    pos, neg = tmp_path / "x.pos", tmp_path / "x.neg"
    pos.write_bytes(b"good one\ngreat\x85really\nnice\n")
    neg.write_bytes(b"bad\nawful\n")
    texts, labels = read_class_files([(pos, 1), (neg, 0)])
    assert labels == [1, 1, 1, 0, 0] and texts[1] == "great\x85really"
    folds = kfold_indices(len(texts), k=5, seed=0)
    assert sorted(i for f in folds for i in f.test) == list(range(5))
    neg.write_bytes(b"bad\n\nawful\n")
    with pytest.raises(DataFormatError, match=r"x\.neg:2: empty sentence"):
        read_class_files([(neg, 0)])


def test_encode_with_vocab(tmp_path):
    d = _root(tmp_path)
    (d / "subj.all").write_bytes(b"0 the plot\n1 the film is\n")
    data = load_classification(tmp_path, "subj")
    v = Vocab.build(data.tokens())
    ids = data.encode(v, [1])
    assert v.decode(ids[0]) == ["the", "film", "is"]
    texts, labels, enc = read_labelled_lines(d / "subj.all", 2)
    assert labels == [0, 1] and enc == "utf-8"
