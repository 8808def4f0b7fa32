"""Byte-pair encoding learned on a training split, written in the subword-nmt ``@@`` notation.

Why HuggingFace ``tokenizers``: it is a maintained, fast (Rust) and deterministic BPE learner that is
already a dependency of this project; subword-nmt (what fairseq's ``prepare-iwslt14.sh`` calls) is a
script-style package we would have to add, and hand-written BPE learning is slow in Python on 160k
sentence pairs.  The merges it learns are not bit-identical to subword-nmt's (tie-breaking differs), so
vocabulary sizes are comparable but not equal to fairseq's; BLEU after ``remove_bpe`` is unaffected by
the notation.

Notation: a word split into pieces is written ``pie@@ ces``: every piece except the last of a word ends in
``@@``, so :func:`remove_bpe` (``"@@ " -> ""``, fairseq's ``--remove-bpe``) gives back the input text
exactly.  Encoding uses the tokenizer's character offsets, so characters never seen in training stay in
the output as their own pieces (the model vocabulary then maps them to ``<unk>``) instead of being dropped.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Iterable, Sequence

from tokenizers import Tokenizer, models, pre_tokenizers, trainers

__all__ = ["BPE", "remove_bpe", "detokenize", "BPE_MARK"]

BPE_MARK = "@@"
_EOW = "</w>"


class BPE:
    """A BPE model over whitespace-separated words.

    ``BPE.train(lines, vocab_size)`` learns merges; ``encode(line) -> str`` returns the ``@@`` segmented
    line; ``decode(line)`` = :func:`remove_bpe`.  ``save``/``load`` keep the learned model as JSON.
    """

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer

    @classmethod
    def train(cls, lines: Iterable[str], vocab_size: int = 10000, min_frequency: int = 2) -> "BPE":
        """Learn BPE on ``lines`` (already tokenised text; words are separated by whitespace).
        ``vocab_size`` counts symbols with and without the end-of-word mark plus all merges."""
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be positive, got {vocab_size}")
        tok = Tokenizer(models.BPE(unk_token="<unk>", end_of_word_suffix=_EOW))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=["<unk>"],
            end_of_word_suffix=_EOW,
            show_progress=False,
        )
        tok.train_from_iterator(lines, trainer=trainer)
        return cls(tok)

    def encode(self, line: str) -> str:
        """``"lowest words"`` -> e.g. ``"low@@ est wor@@ ds"``; whitespace is normalised to one space."""
        return self.encode_batch([line])[0]

    def encode_batch(self, lines: Sequence[str]) -> list[str]:
        out = []
        for line, enc in zip(lines, self.tokenizer.encode_batch(list(lines))):
            pieces = []
            n = len(enc.offsets)
            for i, ((a, b), w) in enumerate(zip(enc.offsets, enc.word_ids)):
                last = i == n - 1 or enc.word_ids[i + 1] != w
                pieces.append(line[a:b] if last else line[a:b] + BPE_MARK)
            out.append(" ".join(pieces))
        return out

    @staticmethod
    def decode(line: str) -> str:
        return remove_bpe(line)

    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.tokenizer.to_str())

    @classmethod
    def load(cls, path: str | Path) -> "BPE":
        text = Path(path).read_text()
        json.loads(text)  # fail early with a JSON error rather than inside the Rust parser
        return cls(Tokenizer.from_str(text))


def remove_bpe(line: str, mark: str = BPE_MARK) -> str:
    """Undo ``@@`` segmentation (fairseq ``--remove-bpe``): ``"low@@ est"`` -> ``"lowest"``."""
    return (line + " ").replace(mark + " ", "").rstrip(" ")


# -- detokenisation for detokenised BLEU (tokenised BLEU compares the output of remove_bpe directly) --
_NO_SPACE_BEFORE = re.compile(r" ([.,!?:;%)\]}]|'s\b|'re\b|'ve\b|'m\b|'ll\b|'d\b|n't\b)")
_NO_SPACE_AFTER = re.compile(r"([(\[{„]) ")
_HYPHEN = re.compile(r" @-@ ")
_ELISION = re.compile(r"\b(\w+['’]) (?=\w)")  # French/Italian/Catalan: "c' est" -> "c'est", "l' homme" -> "l'homme"
ELIDING = ("fr", "it", "ca")


def detokenize(line: str, lang: str | None = None) -> str:
    """Approximate inverse of Moses tokenisation, enough for detokenised BLEU: unescape ``&apos;``,
    ``&quot;``, ``&amp;`` ..., join ``@-@`` hyphens, attach closing punctuation and English clitics to
    the previous word and opening brackets to the next; for ``lang`` in :data:`ELIDING` an elided word is
    joined to the next (``c' est`` -> ``c'est``, as Moses' French detokeniser).  Quotes are left spaced
    (their side is ambiguous)."""
    s = html.unescape(line.strip())
    s = _HYPHEN.sub("-", s)
    s = _NO_SPACE_BEFORE.sub(r"\1", s)
    s = _NO_SPACE_AFTER.sub(r"\1", s)
    if lang in ELIDING:
        s = _ELISION.sub(r"\1", s)
    return s
