"""Parallel text for translation: the fairseq/IWSLT layout and the Multi30k layout.

Layouts (line i of the source file translates line i of the target file):

* fairseq / IWSLT'14 (output of fairseq's ``prepare-iwslt14.sh`` before its BPE step, or any folder of that
  shape): ``<folder>/{train,valid,test}.{de,en}``, Moses-tokenised, lower-cased.
* Multi30k task 1: ``<folder>/tok/{train,val,test_2016_flickr}.lc.norm.tok.{de,en}.gz`` (tokenised,
  lower-cased; the default) or ``<folder>/raw/{train,val,test_2016_flickr}.{de,en}.gz`` (original text,
  tokenised here by :func:`simple_tokenize`).  ``val`` is reported as ``valid``, ``test_2016_flickr`` as
  ``test``.

:func:`prepare_translation` learns BPE on the training split only (jointly on both languages, or one
model per language), builds the vocabularies (joint or separate), applies a length filter to the
training split and returns id tensors ready for :func:`kernel_attention.data.batching.batch_by_tokens`.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Iterator, Sequence

import torch

from .batching import batch_by_tokens, pad_sequences
from .bpe import BPE
from .files import SPLIT_NAMES, DataFormatError, MissingDataError, find_split, read_lines, split_names
from .vocab import Vocab

__all__ = [
    "ParallelText",
    "TranslationSplit",
    "TranslationData",
    "TranslationBatch",
    "read_parallel_files",
    "read_fairseq_layout",
    "read_multi30k",
    "read_parallel_folder",
    "encode_pairs",
    "prepare_translation",
    "simple_tokenize",
]

MULTI30K_SPLITS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
_TOKEN = re.compile(r"\w+(?:[-'’]\w+)*|[^\w\s]", re.UNICODE)


def simple_tokenize(line: str, lower: bool = True) -> str:
    """Split words from punctuation (``"Two men, outside."`` -> ``"two men , outside ."``); used for
    the raw Multi30k files, which are not tokenised."""
    return " ".join(_TOKEN.findall(line.lower() if lower else line))


@dataclasses.dataclass
class ParallelText:
    """Sentence pairs as text.  ``splits[name] = (src_lines, tgt_lines)``, equal lengths."""

    src_lang: str
    tgt_lang: str
    splits: dict[str, tuple[list[str], list[str]]]

    def sizes(self) -> dict[str, int]:
        return {k: len(v[0]) for k, v in self.splits.items()}


def read_parallel_files(src_path: Path, tgt_path: Path, dataset: str | None = None) -> tuple[list[str], list[str]]:
    """Read two aligned UTF-8 files; error (naming both files) if their line counts differ."""
    sp, src = read_lines(src_path, "utf-8", dataset)
    tp, tgt = read_lines(tgt_path, "utf-8", dataset)
    if len(src) != len(tgt):
        shorter, n = (sp, len(src)) if len(src) < len(tgt) else (tp, len(tgt))
        raise DataFormatError(
            shorter, n + 1, f"parallel files are not aligned: {sp} has {len(src)} lines, {tp} has {len(tgt)}"
        )
    return src, tgt


def read_fairseq_layout(folder: str | Path, src: str = "de", tgt: str = "en", dataset: str = "iwslt14") -> ParallelText:
    folder = Path(folder)
    if not folder.is_dir():
        raise MissingDataError(
            f"missing dataset folder {folder} for {dataset!r}: it should hold train/valid/test.{src} and .{tgt} "
            f"(e.g. the output of fairseq's examples/translation/prepare-iwslt14.sh before its BPE step)"
        )
    splits = {s: read_parallel_files(folder / f"{s}.{src}", folder / f"{s}.{tgt}", dataset) for s in ("train", "valid", "test")}
    return ParallelText(src, tgt, splits)


def read_parallel_folder(folder: str | Path, src: str, tgt: str, tokenize: bool = False) -> ParallelText:
    """The user's own parallel text: ``<folder>/{train,valid,test}.{src,tgt}`` for any language codes
    (``valid`` may be named ``val`` or ``dev``; any file may be gzipped).  Lines are whitespace-tokenised
    text; ``tokenize=True`` lower-cases them and splits punctuation off with :func:`simple_tokenize`."""
    folder = Path(folder).expanduser()
    if not src or not tgt or src == tgt:
        raise ValueError(f"src and tgt must be two different language codes, got {src!r} and {tgt!r}")
    if not folder.is_dir():
        raise MissingDataError(f"parallel-text folder {folder} does not exist: it should hold "
                               f"train.{src}, train.{tgt}, valid.{src}, valid.{tgt}, test.{src}, test.{tgt}")
    splits = {}
    for ours in SPLIT_NAMES:
        found = find_split(folder, ours, f".{src}")
        if found is None:
            raise MissingDataError(f"parallel-text folder {folder} has no {ours} split: looked for "
                                   f"{split_names(ours, '.' + src)} (plain or .gz), each with its .{tgt} beside it")
        s, t = read_parallel_files(found, folder / f"{found.name.split('.')[0]}.{tgt}")
        if tokenize:
            s, t = [simple_tokenize(x) for x in s], [simple_tokenize(x) for x in t]
        splits[ours] = (s, t)
    return ParallelText(src, tgt, splits)


def read_multi30k(folder: str | Path, src: str = "de", tgt: str = "en", variant: str = "tok") -> ParallelText:
    if variant not in ("tok", "raw"):
        raise ValueError(f"Multi30k variant must be 'tok' or 'raw', got {variant!r}")
    folder = Path(folder)
    splits = {}
    for ours, theirs in MULTI30K_SPLITS.items():
        if variant == "tok":
            paths = [folder / "tok" / f"{theirs}.lc.norm.tok.{l}.gz" for l in (src, tgt)]
        else:
            paths = [folder / "raw" / f"{theirs}.{l}.gz" for l in (src, tgt)]
        s, t = read_parallel_files(paths[0], paths[1], "multi30k")
        if variant == "raw":
            s, t = [simple_tokenize(x) for x in s], [simple_tokenize(x) for x in t]
        splits[ours] = (s, t)
    return ParallelText(src, tgt, splits)


@dataclasses.dataclass
class TranslationSplit:
    """One split as ids.  ``src[i]``: (S_i,) long ending in ``<eos>``; ``tgt[i]``: (T_i,) long, target
    tokens without specials; ``index[i]``: line of the original file (0-based) so results can be traced;
    ``ref[i]``: target text after BPE removal (the tokenised reference for BLEU)."""

    src: list[torch.Tensor]
    tgt: list[torch.Tensor]
    index: list[int]
    ref: list[str]

    def __len__(self) -> int:
        return len(self.src)

    def lengths(self) -> list[int]:
        """The padded length each pair needs in a batch: ``max(S_i, T_i + 1)`` (``<bos>`` / ``<eos>`` counted)."""
        return [max(s.numel(), t.numel() + 1) for s, t in zip(self.src, self.tgt)]

    def batches(self, max_tokens: int, pad_id: int, bos_id: int, eos_id: int, seed: int | None = None,
                max_sentences: int | None = None) -> Iterator["TranslationBatch"]:
        """Token-based batches (padded size <= ``max_tokens``, counting ``<bos>``/``<eos>``)."""
        for idx in batch_by_tokens(self.lengths(), max_tokens, max_sentences, seed):
            yield collate([self.src[i] for i in idx], [self.tgt[i] for i in idx], [self.index[i] for i in idx],
                          pad_id, bos_id, eos_id)


@dataclasses.dataclass
class TranslationBatch:
    """``src``: (B, S); ``tgt_in``: (B, T) = ``<bos> y``; ``tgt_out``: (B, T) = ``y <eos>``; pad 0;
    ``index``: (B,) original line numbers."""

    src: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    index: torch.Tensor


def collate(src, tgt, index, pad_id: int, bos_id: int, eos_id: int) -> TranslationBatch:
    bos, eos = torch.tensor([bos_id]), torch.tensor([eos_id])
    return TranslationBatch(
        pad_sequences(src, pad_id),
        pad_sequences([torch.cat([bos, t]) for t in tgt], pad_id),
        pad_sequences([torch.cat([t, eos]) for t in tgt], pad_id),
        torch.tensor(index, dtype=torch.long),
    )


@dataclasses.dataclass
class TranslationData:
    """BPE models, vocabularies (the same object twice when joint) and the id splits."""

    src_bpe: BPE
    tgt_bpe: BPE
    src_vocab: Vocab
    tgt_vocab: Vocab
    splits: dict[str, TranslationSplit]
    filtered: dict[str, int]  # training pairs removed by the length filter, per split

    def sizes(self) -> dict[str, int]:
        return {k: len(v) for k, v in self.splits.items()}

    def save_tokenizers(self, folder: str | Path) -> dict[str, str]:
        """Write the BPE model(s) and vocabularies into ``folder`` (plain JSON); returns the file names by
        role, for :meth:`load_tokenizers`.  A joint model is written once."""
        folder = Path(folder)
        joint = self.src_bpe is self.tgt_bpe and self.src_vocab is self.tgt_vocab
        files = ({"bpe": "bpe.json", "vocab": "vocab.json"} if joint else
                 {"src_bpe": "bpe.src.json", "tgt_bpe": "bpe.tgt.json",
                  "src_vocab": "vocab.src.json", "tgt_vocab": "vocab.tgt.json"})
        objs = ({"bpe": self.src_bpe, "vocab": self.src_vocab} if joint else
                {"src_bpe": self.src_bpe, "tgt_bpe": self.tgt_bpe, "src_vocab": self.src_vocab,
                 "tgt_vocab": self.tgt_vocab})
        for role, name in files.items():
            objs[role].save(folder / name)
        return files

    @classmethod
    def load_tokenizers(cls, folder: str | Path, files: dict[str, str]) -> "TranslationData":
        """BPE models and vocabularies written by :meth:`save_tokenizers`, with no splits: add some with
        :func:`encode_pairs`."""
        folder = Path(folder)
        if "bpe" in files:
            bpe, vocab = BPE.load(folder / files["bpe"]), Vocab.load(folder / files["vocab"])
            return cls(bpe, bpe, vocab, vocab, {}, {})
        return cls(BPE.load(folder / files["src_bpe"]), BPE.load(folder / files["tgt_bpe"]),
                   Vocab.load(folder / files["src_vocab"]), Vocab.load(folder / files["tgt_vocab"]), {}, {})


def prepare_translation(
    text: ParallelText,
    bpe_vocab_size: int = 10000,
    joint: bool = True,
    min_len: int = 1,
    max_len: int = 250,
    max_ratio: float | None = None,
    filter_splits: Sequence[str] = ("train",),
    min_freq: int = 1,
) -> TranslationData:
    """BPE (learned on ``text.splits["train"]`` only), vocabularies and ids.

    Length filter (applied to ``filter_splits``; valid/test are kept whole so scores cover every
    sentence): keep a pair when ``min_len <= len <= max_len`` for both sides counted in BPE tokens and,
    if ``max_ratio`` is given, ``max(ls, lt) / min(ls, lt) <= max_ratio`` (Moses ``clean-corpus-n``).
    """
    if "train" not in text.splits:
        raise ValueError(f"parallel text has no 'train' split (has {sorted(text.splits)})")
    train_src, train_tgt = text.splits["train"]
    if joint:
        src_bpe = tgt_bpe = BPE.train(train_src + train_tgt, bpe_vocab_size)
    else:
        src_bpe, tgt_bpe = BPE.train(train_src, bpe_vocab_size), BPE.train(train_tgt, bpe_vocab_size)

    pieces = {name: (src_bpe.encode_batch(s), tgt_bpe.encode_batch(t)) for name, (s, t) in text.splits.items()}
    tr_s = [l.split() for l in pieces["train"][0]]
    tr_t = [l.split() for l in pieces["train"][1]]
    if joint:
        src_vocab = tgt_vocab = Vocab.build(tr_s + tr_t, min_freq)
    else:
        src_vocab, tgt_vocab = Vocab.build(tr_s, min_freq), Vocab.build(tr_t, min_freq)

    splits, filtered = {}, {}
    for name, (s_lines, t_lines) in pieces.items():
        flt = (min_len, max_len, max_ratio) if name in filter_splits else None
        splits[name], filtered[name] = _encode(s_lines, t_lines, text.splits[name][1], src_vocab, tgt_vocab, flt)
    return TranslationData(src_bpe, tgt_bpe, src_vocab, tgt_vocab, splits, filtered)


def _encode(s_lines, t_lines, refs, src_vocab, tgt_vocab, flt=None) -> tuple[TranslationSplit, int]:
    out = TranslationSplit([], [], [], [])
    dropped = 0
    for i, (s, t) in enumerate(zip(s_lines, t_lines)):
        ss, tt = s.split(), t.split()
        if flt is not None:
            min_len, max_len, max_ratio = flt
            ls, lt = len(ss), len(tt)
            bad = not (min_len <= ls <= max_len and min_len <= lt <= max_len)
            if not bad and max_ratio is not None:
                bad = max(ls, lt) > max_ratio * min(ls, lt)
            if bad:
                dropped += 1
                continue
        out.src.append(src_vocab.encode(ss, eos=True))
        out.tgt.append(tgt_vocab.encode(tt))
        out.index.append(i)
        out.ref.append(" ".join(refs[i].split()))
    return out, dropped


def encode_pairs(data: TranslationData, src_lines: Sequence[str], tgt_lines: Sequence[str]) -> TranslationSplit:
    """New sentence pairs (e.g. a test set given after training) as a split of ``data``: its BPE models and
    vocabularies applied, no length filter."""
    if len(src_lines) != len(tgt_lines):
        raise ValueError(f"{len(src_lines)} source lines but {len(tgt_lines)} target lines")
    return _encode(data.src_bpe.encode_batch(list(src_lines)), data.tgt_bpe.encode_batch(list(tgt_lines)),
                   list(tgt_lines), data.src_vocab, data.tgt_vocab)[0]
