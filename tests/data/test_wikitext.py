import pytest
import torch

from kernel_attention.data.files import DataFormatError, MissingDataError
from kernel_attention.data.wikitext import LMOrderedIterator, load_wikitext

TRAIN = " = Title = \n\n the cat sat on the mat . \n a <unk> dog @-@ like cat \n"
VALID = " the dog sat \n"
TEST = " a mat \n\n"


def _write(root, name="wikitext-2"):
    d = root / name
    d.mkdir(parents=True)
    for split, text in (("train", TRAIN), ("valid", VALID), ("test", TEST)):
        (d / f"{split}.txt").write_text(text, encoding="utf-8")
    return d


def test_tokens_and_eos_per_line(tmp_path):
    _write(tmp_path)
    c = load_wikitext(tmp_path)
    # independent count: whitespace words plus one <eos> per line, blank lines included
    for split, text in (("train", TRAIN), ("valid", VALID), ("test", TEST)):
        lines = text.split("\n")[:-1]
        assert c.splits[split].numel() == sum(len(l.split()) + 1 for l in lines)
    assert c.vocab.itos[:2] == ["<unk>", "<eos>"]
    words = {w for l in TRAIN.split("\n") for w in l.split()}
    assert len(c.vocab) == len(words | {"<unk>", "<eos>"})
    decoded = [c.vocab.itos[i] for i in c.splits["valid"].tolist()]
    assert decoded == ["the", "dog", "sat", "<eos>"]
    assert c.oov == {"train": 0, "valid": 0, "test": 0}


def test_unknown_words_in_valid_map_to_unk(tmp_path):
    d = _write(tmp_path)
    (d / "valid.txt").write_text(" zebra cat \n", encoding="utf-8")
    c = load_wikitext(tmp_path)
    assert c.oov["valid"] == 1
    assert c.splits["valid"][0].item() == c.vocab.unk_id


def test_malformed_file_names_file_and_line(tmp_path):
    d = _write(tmp_path)
    (d / "test.txt").write_bytes(b" fine \n broken \xff byte \n")
    with pytest.raises(DataFormatError, match=r"test\.txt:2"):
        load_wikitext(tmp_path)
    (d / "test.txt").write_text(" fine \n has <eos> inside \n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"test\.txt:2"):
        load_wikitext(tmp_path)


def test_missing_split_names_path(tmp_path):
    d = _write(tmp_path)
    (d / "valid.txt").unlink()
    with pytest.raises(MissingDataError, match="valid.txt"):
        load_wikitext(tmp_path)
    with pytest.raises(MissingDataError, match="wikitext-103"):
        load_wikitext(tmp_path, "wikitext-103")


@pytest.mark.parametrize("length,batch,tgt_len", [(103, 4, 5), (50, 3, 7), (40, 2, 19)])
def test_lm_segments_are_contiguous_across_batches(length, batch, tgt_len):
    stream = torch.arange(length) * 7 + 1  # distinct values, so positions can be traced back
    it = LMOrderedIterator(stream, batch, tgt_len)
    n_steps = length // batch
    segs = list(it)
    assert len(segs) == len(it)
    prev_end = 0
    for s in segs:
        assert s.start == prev_end  # each segment starts where the previous one stopped
        assert s.input.shape == s.target.shape and s.input.shape[0] == batch
        assert s.input.shape[1] <= tgt_len
        prev_end = s.start + s.input.shape[1]
    assert prev_end == n_steps - 1
    inputs = torch.cat([s.input for s in segs], dim=1)
    targets = torch.cat([s.target for s in segs], dim=1)
    for b in range(batch):
        piece = stream[b * n_steps : (b + 1) * n_steps]  # row b = one contiguous piece of the stream
        assert torch.equal(inputs[b], piece[:-1])
        assert torch.equal(targets[b], piece[1:])
    # in every row the last target of segment k is the first input of segment k+1
    for s, t in zip(segs, segs[1:]):
        assert torch.equal(s.target[:, -1], t.input[:, 0])


def test_lm_iterator_rejects_short_streams():
    with pytest.raises(ValueError, match="too short"):
        LMOrderedIterator(torch.arange(5), 4, 2)
