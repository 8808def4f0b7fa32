"""WikiText-2 / WikiText-103 as a word-level language-modelling stream.

Files: ``<root>/wikitext-2/{train,valid,test}.txt`` (the tokenised ``wiki.*.tokens`` release under
pytorch/examples' names; ``wiki.{train,valid,test}.tokens`` are accepted too).  The text is already
tokenised and rare words are already ``<unk>``.  Standard practice (pytorch/examples, Transformer-XL):
split each line on whitespace and append ``<eos>``, blank lines included.  On WikiText-2 this gives
2,088,628 / 217,646 / 245,569 tokens and a 33,278-word vocabulary.

The vocabulary has only the two specials the data needs, ``<unk>`` (id 0) and ``<eos>`` (id 1), so its
size is the published one (there is no padding in a contiguous LM stream).

:class:`LMOrderedIterator` batches a stream like Transformer-XL's iterator of the same name: the token
stream of length L is cut to ``B * n_steps`` tokens and reshaped to ``(B, n_steps)``, so row ``b`` is the
contiguous piece ``stream[b*n_steps:(b+1)*n_steps]``.  Segments of ``tgt_len`` columns are yielded left to
right: segment ``k+1`` starts exactly where segment ``k`` stopped in every row, which is what lets a
memory model (Transformer-XL) carry its memory from one batch to the next.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Iterator

import torch

from .files import DataFormatError, MissingDataError, find_split, read_lines, resolve, split_names
from .vocab import EOS, UNK, Vocab

SPLITS = ("train", "valid", "test")
LM_SPECIALS = (UNK, EOS)

__all__ = ["LMCorpus", "LMSegment", "LMOrderedIterator", "load_wikitext", "load_text_corpus", "tokenize_lm_file",
           "encode_lm_file"]


def tokenize_lm_file(path: str | Path, dataset: str | None = None) -> list[list[str]]:
    """Lines of a tokenised LM file, each split on whitespace with ``<eos>`` appended."""
    p, lines = read_lines(path, "utf-8", dataset)
    out = []
    for i, line in enumerate(lines):
        words = line.split()
        if EOS in words:  # a literal <eos> would be counted as an extra line end
            raise DataFormatError(p, i + 1, f"the text contains a literal {EOS}; lines must be plain tokenised text")
        out.append(words + [EOS])
    return out


@dataclasses.dataclass
class LMCorpus:
    """A word-level LM corpus.  ``splits[name]`` is a (L,) long tensor of token ids (the whole split as one
    stream); ``vocab`` maps ids to words; ``oov[name]`` counts words mapped to ``<unk>`` that were not
    ``<unk>`` in the file (0 on WikiText, whose vocabulary is closed)."""

    name: str
    vocab: Vocab
    splits: dict[str, torch.Tensor]
    oov: dict[str, int]

    def sizes(self) -> dict[str, int]:
        return {k: int(v.numel()) for k, v in self.splits.items()}

    def iterator(self, split: str, batch_size: int, tgt_len: int) -> "LMOrderedIterator":
        return LMOrderedIterator(self.splits[split], batch_size, tgt_len)


def _find_split(folder: Path, split: str, dataset: str) -> Path:
    for name in (f"{split}.txt", f"wiki.{split}.tokens"):
        for cand in (folder / name, folder / (name + ".gz")):
            if cand.is_file():
                return cand
    return resolve(folder / f"{split}.txt", dataset)  # raises MissingDataError with the expected path


def load_wikitext(root: str | Path, name: str = "wikitext-2", vocab_from: str = "train") -> LMCorpus:
    """Load ``<root>/<name>/{train,valid,test}.txt``.  ``vocab_from``: ``"train"`` (Transformer-XL) or
    ``"all"`` (pytorch/examples); on WikiText both give the same vocabulary."""
    if vocab_from not in ("train", "all"):
        raise ValueError(f"vocab_from must be 'train' or 'all', got {vocab_from!r}")
    folder = Path(root) / name
    if not folder.is_dir():
        raise MissingDataError(
            f"missing dataset folder {folder} for {name!r}: place train.txt, valid.txt, test.txt there "
            f"or run `kernel-attention data check --download` (online)"
        )
    lines = {s: tokenize_lm_file(_find_split(folder, s, name), name) for s in SPLITS}
    source = lines["train"] if vocab_from == "train" else [l for s in SPLITS for l in lines[s]]
    vocab = Vocab.build(source, specials=LM_SPECIALS)
    return _corpus(name, lines, vocab)


def _corpus(name: str, lines: dict[str, list[list[str]]], vocab: Vocab) -> LMCorpus:
    splits, oov = {}, {}
    for s, ls in lines.items():
        splits[s] = torch.tensor([vocab[w] for line in ls for w in line], dtype=torch.long)
        oov[s] = sum(1 for line in ls for w in line if w not in vocab)
    return LMCorpus(name, vocab, splits, oov)


def encode_lm_file(path: str | Path, vocab: Vocab) -> tuple[torch.Tensor, int]:
    """A plain-text file as one stream of ids of ``vocab`` (``<eos>`` after every line) and the number of
    words that became ``<unk>``; used to evaluate a trained model on a new test file."""
    lines = tokenize_lm_file(path)
    ids = torch.tensor([vocab[w] for line in lines for w in line], dtype=torch.long)
    return ids, sum(1 for line in lines for w in line if w not in vocab)


def load_text_corpus(path: str | Path, valid: float = 0.1, test: float = 0.1, seed: int = 0,
                     min_freq: int = 1) -> LMCorpus:
    """A word-level corpus of the user's own plain text (one sentence or document per line, words split on
    whitespace, ``<eos>`` after each line; the WikiText recipe).

    ``path`` is a folder holding ``train.txt``, ``valid.txt`` (or ``val.txt``, ``dev.txt``) and ``test.txt``
    (each possibly ``.gz``), or one file whose lines are shuffled with ``seed`` and cut into
    ``valid`` / ``test`` fractions (at least one line each) and the rest for training.  The vocabulary is
    the training split's words seen ``min_freq`` times or more; other words become ``<unk>``."""
    p = Path(path).expanduser()
    if p.is_dir():
        lines = {}
        for s in SPLITS:
            found = find_split(p, s, ".txt")
            if found is None:
                raise MissingDataError(f"text corpus {p} has no {s} split: looked for {split_names(s, '.txt')} (plain "
                                       f"or .gz); or give one text file, split by the valid= and test= fractions")
            lines[s] = tokenize_lm_file(found)
            if not lines[s]:
                raise DataFormatError(found, None, "the file is empty (no lines of text)")
    elif p.is_file() or Path(str(p) + ".gz").is_file():
        if not (0 <= valid < 1 and 0 <= test < 1 and valid + test < 1):
            raise ValueError(f"valid={valid} and test={test} must be fractions in [0, 1) with a sum below 1")
        all_lines = tokenize_lm_file(p)
        if len(all_lines) < 3:
            raise DataFormatError(p, None, f"{len(all_lines)} lines are too few to cut into train/valid/test")
        order = torch.randperm(len(all_lines), generator=torch.Generator().manual_seed(seed)).tolist()
        n_valid = max(1, round(valid * len(order)))
        n_test = max(1, round(test * len(order)))
        cut = {"valid": order[:n_valid], "test": order[n_valid:n_valid + n_test], "train": order[n_valid + n_test:]}
        lines = {s: [all_lines[i] for i in sorted(cut[s])] for s in SPLITS}
    else:
        raise MissingDataError(f"text corpus {p} does not exist: give a folder with train.txt, valid.txt, test.txt "
                               f"or one text file (split by the valid= and test= fractions)")
    vocab = Vocab.build(lines["train"], min_freq=min_freq, specials=LM_SPECIALS)
    return _corpus(p.name or str(p), lines, vocab)


@dataclasses.dataclass
class LMSegment:
    """One batch of an ordered LM stream.  ``input``, ``target``: (B, T) long, ``target[:, t]`` is the
    token after ``input[:, t]``; ``start`` is the column of ``input[:, 0]`` in the (B, n_steps) layout."""

    input: torch.Tensor
    target: torch.Tensor
    start: int


class LMOrderedIterator:
    """Contiguous segments of a token stream for memory models (Transformer-XL's ``LMOrderedIterator``).

    ``data``: (L,) long.  Layout: ``streams = data[:B*n_steps].view(B, n_steps)`` with
    ``n_steps = L // B`` (the last ``L mod B`` tokens are dropped).  Segment k covers columns
    ``[k*tgt_len, min((k+1)*tgt_len, n_steps-1))`` of the inputs and the same columns shifted by one of
    the targets; the last segment may be shorter.  Yields :class:`LMSegment` with batch-first tensors.
    """

    def __init__(self, data: torch.Tensor, batch_size: int, tgt_len: int):
        if data.dim() != 1:
            raise ValueError(f"data must be a 1-D token stream, got shape {tuple(data.shape)}")
        if batch_size < 1 or tgt_len < 1:
            raise ValueError(f"batch_size and tgt_len must be >= 1, got {batch_size}, {tgt_len}")
        n_steps = data.numel() // batch_size
        if n_steps < 2:
            raise ValueError(f"a stream of {data.numel()} tokens is too short for batch_size={batch_size}")
        self.batch_size, self.tgt_len, self.n_steps = batch_size, tgt_len, n_steps
        self.streams = data[: batch_size * n_steps].view(batch_size, n_steps)  # (B, n_steps)

    def __len__(self) -> int:
        return (self.n_steps - 1 + self.tgt_len - 1) // self.tgt_len

    def __iter__(self) -> Iterator[LMSegment]:
        for i in range(0, self.n_steps - 1, self.tgt_len):
            seq_len = min(self.tgt_len, self.n_steps - 1 - i)
            yield LMSegment(self.streams[:, i : i + seq_len], self.streams[:, i + 1 : i + 1 + seq_len], i)
