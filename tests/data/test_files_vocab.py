import gzip

import pytest
import torch

from kernel_attention.data.files import DataFormatError, MissingDataError, default_root, read_lines, resolve
from kernel_attention.data.vocab import Vocab


def test_read_lines_splits_on_newline_only_and_keeps_0x85(tmp_path):
    p = tmp_path / "latin.txt"
    # byte 0x85 (cp1252 ellipsis) inside a line, a CRLF line, a trailing newline
    p.write_bytes(b"first\x85second line\nthird\r\nfourth\n")
    _, lines = read_lines(p, "latin-1")
    assert lines == ["first\x85second line", "third", "fourth"]
    # what the loader avoids: str.splitlines would have broken the first line in two
    assert len(p.read_bytes().decode("latin-1").splitlines()) == 4


def test_read_lines_utf8_error_names_file_and_line(tmp_path):
    p = tmp_path / "bad.txt"
    p.write_bytes(b"ok\nalso ok\nbad \xe9 byte\n")
    with pytest.raises(DataFormatError, match=r"bad\.txt:3: cannot decode as utf-8 .*save the file as UTF-8 "
                                              r".*encoding=latin-1 where the dataset takes one"):
        read_lines(p, "utf-8")


def test_gz_and_plain_are_interchangeable(tmp_path):
    (tmp_path / "a.txt.gz").write_bytes(gzip.compress(b"x\ny\n"))
    assert read_lines(tmp_path / "a.txt")[1] == ["x", "y"]
    (tmp_path / "b.txt").write_bytes(b"z\n")
    assert read_lines(tmp_path / "b.txt.gz")[1] == ["z"]


def test_missing_file_names_expected_path_and_download_flag(tmp_path):
    with pytest.raises(MissingDataError) as e:
        resolve(tmp_path / "nothing" / "train.txt", dataset="wikitext-2")
    msg = str(e.value)
    assert str(tmp_path / "nothing" / "train.txt") in msg and "--download" in msg


def test_default_root_order(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNEL_ATTENTION_DATA", str(tmp_path / "env"))
    assert default_root() == tmp_path / "env"
    monkeypatch.delenv("KERNEL_ATTENTION_DATA")
    work = tmp_path / "a" / "work"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_root() == tmp_path / "home" / ".cache" / "kernel-attention"
    (tmp_path / "a" / "shared" / "data").mkdir(parents=True)
    assert default_root().resolve() == (tmp_path / "a" / "shared" / "data").resolve()


def test_vocab_specials_order_and_unknowns():
    v = Vocab.build([["b", "a", "b"], ["c", "b", "a"]], min_freq=1)
    assert v.itos[:4] == ["<pad>", "<unk>", "<bos>", "<eos>"]
    assert (v.pad_id, v.unk_id, v.bos_id, v.eos_id) == (0, 1, 2, 3)
    assert v.itos[4:] == ["b", "a", "c"]  # by count, ties alphabetical
    assert v["zzz"] == v.unk_id
    ids = v.encode(["a", "zzz"], bos=True, eos=True)
    assert ids.tolist() == [2, 5, 1, 3]
    assert v.decode(torch.tensor([2, 5, 6, 3, 4])) == ["a", "c"]  # stops at <eos>
    assert len(Vocab.build([["b", "a", "b"]], min_freq=2)) == 5


def test_vocab_json_round_trip(tmp_path):
    v = Vocab.build([["x", "y", "y"]], specials=("<unk>", "<eos>"))
    v.save(tmp_path / "v.json")
    w = Vocab.load(tmp_path / "v.json")
    assert w.itos == v.itos and w.pad_id == -1 and w.unk_id == 0
