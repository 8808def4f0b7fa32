"""Vocabulary: token <-> id, with the four special tokens every model here uses.

Ids 0..3 are ``<pad>``, ``<unk>``, ``<bos>``, ``<eos>`` (pad is 0 so that ``torch.zeros`` is an all-pad
batch and ``padding_idx=0`` works in ``nn.Embedding``).  Other tokens follow in order of decreasing
count, ties broken alphabetically, so a vocabulary built from the same text is always the same.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Iterable, Sequence

import torch

PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<bos>", "<eos>"
SPECIALS = (PAD, UNK, BOS, EOS)

__all__ = ["Vocab", "PAD", "UNK", "BOS", "EOS", "SPECIALS"]


class Vocab:
    """A fixed token list.  ``vocab[token] -> id`` (unknown tokens map to ``unk_id``),
    ``vocab.itos[id] -> token``, ``len(vocab)``."""

    def __init__(self, tokens: Sequence[str], specials: Sequence[str] = SPECIALS):
        self.itos: list[str] = list(specials)
        for t in tokens:
            if t not in specials:
                self.itos.append(t)
        self.stoi: dict[str, int] = {}
        for i, t in enumerate(self.itos):
            if t in self.stoi:
                raise ValueError(f"token {t!r} appears twice in the vocabulary (ids {self.stoi[t]} and {i})")
            self.stoi[t] = i
        self.specials = tuple(specials)

    # ids of the special tokens (-1 when a vocabulary was built without one of them)
    @property
    def pad_id(self) -> int:
        return self.stoi.get(PAD, -1)

    @property
    def unk_id(self) -> int:
        return self.stoi.get(UNK, -1)

    @property
    def bos_id(self) -> int:
        return self.stoi.get(BOS, -1)

    @property
    def eos_id(self) -> int:
        return self.stoi.get(EOS, -1)

    @classmethod
    def build(
        cls,
        sentences: Iterable[Sequence[str]],
        min_freq: int = 1,
        max_size: int | None = None,
        specials: Sequence[str] = SPECIALS,
    ) -> "Vocab":
        """Count tokens over ``sentences`` (each a list of tokens); keep those seen ``min_freq`` times
        or more, the ``max_size`` most frequent if given (specials not counted)."""
        counts: Counter[str] = Counter()
        for s in sentences:
            counts.update(s)
        for sp in specials:
            counts.pop(sp, None)
        kept = sorted((t for t, c in counts.items() if c >= min_freq), key=lambda t: (-counts[t], t))
        if max_size is not None:
            kept = kept[:max_size]
        return cls(kept, specials)

    def __len__(self) -> int:
        return len(self.itos)

    def __contains__(self, token: str) -> bool:
        return token in self.stoi

    def __getitem__(self, token: str) -> int:
        i = self.stoi.get(token)
        if i is None:
            if UNK not in self.stoi:
                raise KeyError(f"token {token!r} is not in the vocabulary and it has no {UNK}")
            return self.stoi[UNK]
        return i

    def encode(self, tokens: Sequence[str], bos: bool = False, eos: bool = False) -> torch.Tensor:
        """Tokens -> (len,) long tensor, optionally wrapped in ``<bos>`` ... ``<eos>``."""
        ids = [self[t] for t in tokens]
        if bos:
            ids.insert(0, self.bos_id)
        if eos:
            ids.append(self.eos_id)
        return torch.tensor(ids, dtype=torch.long)

    def decode(self, ids: Iterable[int], strip_specials: bool = True) -> list[str]:
        """Ids -> tokens; stops at the first ``<eos>`` and drops pad/bos when ``strip_specials``."""
        out = []
        for i in ids:
            i = int(i)
            if strip_specials:
                if i == self.eos_id:
                    break
                if i in (self.pad_id, self.bos_id):
                    continue
            out.append(self.itos[i])
        return out

    # -- persistence (plain JSON so a run directory can be read without this library) --
    def to_json(self) -> dict:
        return {"specials": list(self.specials), "itos": self.itos}

    @classmethod
    def from_json(cls, obj: dict) -> "Vocab":
        specials = obj.get("specials", list(SPECIALS))
        return cls(obj["itos"][len(specials):], specials)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), ensure_ascii=False))

    @classmethod
    def load(cls, path: str | Path) -> "Vocab":
        return cls.from_json(json.loads(Path(path).read_text()))

    def __repr__(self) -> str:
        return f"Vocab({len(self)} tokens, pad={self.pad_id}, unk={self.unk_id})"
