import gzip
import random

import pytest
import torch

from kernel_attention.data.batching import batch_by_tokens, pad_sequences
from kernel_attention.data.bpe import BPE, detokenize, remove_bpe
from kernel_attention.data.files import DataFormatError
from kernel_attention.data.parallel import (
    prepare_translation,
    read_fairseq_layout,
    read_multi30k,
    simple_tokenize,
)

DE = ["ein mann läuft .", "zwei hunde spielen im park .", "eine frau liest ein buch .", "kinder spielen ."] * 3
EN = ["a man runs .", "two dogs play in the park .", "a woman reads a book .", "children play ."] * 3


def _fairseq(root):
    d = root / "iwslt"
    d.mkdir()
    for split, n in (("train", 12), ("valid", 2), ("test", 2)):
        (d / f"{split}.de").write_text("\n".join(DE[:n]) + "\n", encoding="utf-8")
        (d / f"{split}.en").write_text("\n".join(EN[:n]) + "\n", encoding="utf-8")
    return d


def test_bpe_round_trip_including_unseen_characters():
    bpe = BPE.train(DE + EN, vocab_size=60, min_frequency=1)
    lines = DE[:4] + EN[:4] + ["überraschung qqq ζ spielen", "a  spaced   line "]
    for line in lines:
        enc = bpe.encode(line)
        assert remove_bpe(enc) == " ".join(line.split())
        assert all(p for p in enc.split(" "))
    # a small vocabulary must actually split some words, or the round trip above proves nothing
    assert any("@@" in bpe.encode(l) for l in lines)


def test_bpe_save_load(tmp_path):
    bpe = BPE.train(EN, vocab_size=50, min_frequency=1)
    bpe.save(tmp_path / "bpe.json")
    again = BPE.load(tmp_path / "bpe.json")
    assert [again.encode(l) for l in EN] == [bpe.encode(l) for l in EN]


def test_remove_bpe_and_detokenize():
    assert remove_bpe("low@@ est wor@@ ds") == "lowest words"
    assert remove_bpe("a@@") == "a"  # as fairseq: (s + " ").replace("@@ ", "").rstrip()
    assert detokenize("a kid &apos;s table , ( yes ) .") == "a kid's table, (yes)."
    assert detokenize("well @-@ known &quot;x&quot;") == 'well-known "x"'


def test_fairseq_layout_and_joint_vocab(tmp_path):
    text = read_fairseq_layout(_fairseq(tmp_path))
    assert text.sizes() == {"train": 12, "valid": 2, "test": 2}
    data = prepare_translation(text, bpe_vocab_size=80, joint=True)
    assert data.src_vocab is data.tgt_vocab and data.src_bpe is data.tgt_bpe
    s = data.splits["valid"]
    # ids decode back to the BPE text, and removing BPE gives the reference
    for i in range(len(s)):
        pieces = data.tgt_vocab.decode(s.tgt[i])
        assert remove_bpe(" ".join(pieces)) == s.ref[i] == EN[s.index[i]]
        assert s.src[i][-1].item() == data.src_vocab.eos_id


def test_separate_vocabularies(tmp_path):
    data = prepare_translation(read_fairseq_layout(_fairseq(tmp_path)), bpe_vocab_size=80, joint=False)
    assert data.src_vocab is not data.tgt_vocab
    assert "läuft" not in "".join(data.tgt_vocab.itos)
    assert any("ä" in t for t in data.src_vocab.itos)


def test_length_filter_applies_to_train_only(tmp_path):
    d = _fairseq(tmp_path)
    long_de = " ".join(["wort"] * 30)
    (d / "train.de").write_text("\n".join(DE + [long_de]) + "\n", encoding="utf-8")
    (d / "train.en").write_text("\n".join(EN + ["word"]) + "\n", encoding="utf-8")
    (d / "test.de").write_text(long_de + "\n" + DE[0] + "\n", encoding="utf-8")
    data = prepare_translation(read_fairseq_layout(d), bpe_vocab_size=80, max_len=20)
    assert data.filtered["train"] == 1 and len(data.splits["train"]) == 12
    assert 12 not in data.splits["train"].index
    assert len(data.splits["test"]) == 2  # test keeps every sentence
    ratio = prepare_translation(read_fairseq_layout(d), bpe_vocab_size=80, max_len=100, max_ratio=3.0)
    assert ratio.filtered["train"] == 1


def test_misaligned_parallel_files_name_file(tmp_path):
    d = _fairseq(tmp_path)
    (d / "valid.en").write_text(EN[0] + "\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"valid\.en:2: parallel files are not aligned"):
        read_fairseq_layout(d)


def test_multi30k_layout_gz(tmp_path):
    d = tmp_path / "m"
    names = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
    for ours, theirs in names.items():
        for lang, lines in (("de", DE), ("en", EN)):
            (d / "tok").mkdir(parents=True, exist_ok=True)
            (d / "raw").mkdir(parents=True, exist_ok=True)
            blob = ("\n".join(lines) + "\n").encode()
            (d / "tok" / f"{theirs}.lc.norm.tok.{lang}.gz").write_bytes(gzip.compress(blob))
            raw = ("\n".join(l.capitalize().replace(" .", ".") for l in lines) + "\n").encode()
            (d / "raw" / f"{theirs}.{lang}.gz").write_bytes(gzip.compress(raw))
    tok = read_multi30k(d)
    assert tok.sizes() == {"train": 12, "valid": 12, "test": 12}
    raw = read_multi30k(d, variant="raw")
    assert raw.splits["train"][1] == tok.splits["train"][1]  # simple_tokenize restores the tokenised form
    assert simple_tokenize("Two men, outside.") == "two men , outside ."


def test_token_batches_respect_max_tokens_and_cover_everything():
    rng = random.Random(0)
    lengths = [rng.randint(1, 40) for _ in range(300)]
    for seed in (None, 3):
        batches = batch_by_tokens(lengths, max_tokens=100, seed=seed)
        flat = sorted(i for b in batches for i in b)
        assert flat == list(range(300))
        for b in batches:
            assert len(b) * max(lengths[i] for i in b) <= 100
    # greedy filling: merging two neighbouring sorted batches would overflow
    batches = batch_by_tokens(lengths, max_tokens=100)
    for a, b in zip(batches, batches[1:]):
        assert (len(a) + len(b)) * max(lengths[i] for i in a + b) > 100
    assert batch_by_tokens(lengths, 100, seed=1) == batch_by_tokens(lengths, 100, seed=1)
    assert batch_by_tokens(lengths, 100, seed=1) != batch_by_tokens(lengths, 100, seed=2)
    assert all(len(b) <= 3 for b in batch_by_tokens(lengths, 100, max_sentences=3))
    with pytest.raises(ValueError, match="max_tokens"):
        batch_by_tokens([5, 200], max_tokens=100)


def test_translation_batches_shapes(tmp_path):
    data = prepare_translation(read_fairseq_layout(_fairseq(tmp_path)), bpe_vocab_size=80)
    v = data.tgt_vocab
    seen = []
    for batch in data.splits["train"].batches(max_tokens=40, pad_id=v.pad_id, bos_id=v.bos_id, eos_id=v.eos_id, seed=0):
        assert batch.src.numel() <= 40 and batch.tgt_in.numel() <= 40
        assert (batch.tgt_in[:, 0] == v.bos_id).all()
        for row, i in enumerate(batch.index.tolist()):
            y = data.splits["train"].tgt[i].tolist()
            n = len(y) + 1
            assert batch.tgt_in[row, :n].tolist() == [v.bos_id] + y
            assert batch.tgt_out[row, :n].tolist() == y + [v.eos_id]
            assert (batch.tgt_in[row, n:] == v.pad_id).all() and (batch.tgt_out[row, n:] == v.pad_id).all()
        seen += batch.index.tolist()
    assert sorted(seen) == list(range(12))
    assert pad_sequences([torch.tensor([1, 2]), torch.tensor([3])]).tolist() == [[1, 2], [3, 0]]
