"""Your own TSV / CSV files: labelled text for sentence classification (``tsv:path=...``, ``csv:path=...``),
or a numeric table for regression (``csv:path=FILE,target=NAME|INDEX``).

    data: {dataset: "tsv:path=my-reviews"}                          # my-reviews/{train,valid,test}.tsv
    data: {dataset: "csv:path=reviews.csv,text=review,label=stars,valid=0.1,test=0.1,seed=0"}

``path`` is a folder holding ``train.tsv`` and ``test.tsv`` (``.csv`` for ``csv``; plain or ``.gz``) and
optionally ``valid.tsv`` (or ``val`` / ``dev``; without one the classification task keeps 10% of train for
validation), or one file whose rows are shuffled with ``seed`` and cut into ``valid`` / ``test`` fractions
(at least one row each) and the rest for training.

The text and label columns are chosen by header name or by 0-based index, -1 the last (``text=``,
``label=``; default ``text`` and ``label``).  ``header``: ``auto`` (the default) reads the first row as a
header when a column is chosen by name, and as data when both are indices; ``true`` / ``false`` say so.
Every row has the first row's number of fields.  Labels are any strings
(``pos``, ``neg``, ``3``); the classes are the labels of all splits, sorted (as numbers when all are
integers), numbered from 0.  TSV fields are split on tabs with no quoting (quotes are text); CSV follows the
usual quoting (``"a, b"``).  ``tokenize=true`` lower-cases the text and splits punctuation off (words are
otherwise split on whitespace).

With ``target=`` the same entries read one numeric table for the ``regression`` task
(:func:`load_table_regression`): the target column is y, the other columns (less ``ignore=a+b``) the features.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import torch

from .classification import ClassificationData
from .files import DataFormatError, MissingDataError, find_split, read_lines, resolve
from .protocols import cut_by_fractions
from .uci import RegressionData

__all__ = ["load_table_classification", "load_table_regression", "read_table", "class_names"]


def read_table(path: str | Path, sep: str, encoding: str = "utf-8") -> tuple[Path, list[list[str]]]:
    """The rows of a TSV (``sep="\\t"``, no quoting) or CSV (``sep=","``) file; empty lines are skipped, and a
    file with no row is an error."""
    p, lines = read_lines(path, encoding)
    if sep == "\t":
        rows = [line.split("\t") for line in lines if line.strip()]
    else:
        rows = _csv_rows(p, lines)
    if not rows:
        raise DataFormatError(p, None, "the file is empty (no rows)")
    return p, rows


def _csv_rows(p: Path, lines: list[str]) -> list[list[str]]:
    """The non-empty records of CSV lines; a malformed one (an unclosed quote would take in the rest of the
    file) is an error naming the line it starts on."""
    reader = csv.reader(io.StringIO("\n".join(lines) + "\n"), strict=True)
    rows, start = [], 1
    try:
        for r in reader:
            if r and any(c.strip() for c in r):
                rows.append(r)
            start = reader.line_num + 1
    except csv.Error as e:
        raise DataFormatError(p, start, f"not a CSV record ({e}): a field holding a comma, quote or line break is "
                                        f'quoted "like, this", with a quote inside it doubled ""') from None
    return rows


def _column(which: str, width: int, header: list[str] | None, p: Path, role: str, hint: str = "") -> int:
    """The 0-based index of column ``which`` (a header name, or an index; negative counts from the end)."""
    if which.lstrip("-").isdigit():
        i = int(which)
        if not -width <= i < width:
            raise DataFormatError(p, None, f"{role}={which} is not a column: the first row has {width} "
                                           f"(0..{width - 1}, or -1 for the last){hint}")
        return i % width
    if header is None:
        raise DataFormatError(p, None, f"{role}={which!r} names a column but the file is read without a header "
                                       f"(header=false); give the column's 0-based index")
    names = [h.strip() for h in header]
    if which not in names:
        raise DataFormatError(p, 1, f"no column {which!r} for {role}= in the header {names}; give {role}=NAME "
                                    f"or a 0-based index")
    return names.index(which)


def _read_split(path: Path, sep: str, text: str, label: str, header: str,
                encoding: str) -> tuple[list[str], list[str]]:
    p, rows = read_table(path, sep, encoding)
    by_name = not (text.lstrip("-").isdigit() and label.lstrip("-").isdigit())
    has_header = by_name if header == "auto" else header == "true"
    head = rows[0] if has_header and rows else None
    body = rows[1:] if has_header else rows
    width = len(rows[0])
    hint = f" (is the separator {'a tab' if sep == chr(9) else 'a comma'}?)"
    ti, li = _column(text, width, head, p, "text", hint), _column(label, width, head, p, "label", hint)
    texts, labels = [], []
    first = 2 if has_header else 1
    for i, row in enumerate(body):
        if len(row) != width:
            why = hint[2:-1] if len(row) < width else \
                "a tab inside the text? TSV has no quoting; a CSV file can quote it" if sep == "\t" else \
                "a comma inside an unquoted text? quote it"
            raise DataFormatError(p, i + first, f"{len(row)} field(s), the first row has {width} ({why})")
        if not row[li].strip():
            raise DataFormatError(p, i + first, "an empty label")
        texts.append(row[ti].strip())
        labels.append(row[li].strip())
    if not texts:
        raise DataFormatError(p, None, "no rows under the header")
    return texts, labels


def class_names(labels) -> list[str]:
    """The distinct label strings, sorted (as numbers when all are integers): class i is the i-th."""
    names = sorted(set(labels))
    if all(n.lstrip("-").isdigit() for n in names):
        names.sort(key=int)
    return names


def load_table_classification(path: str | Path, sep: str, text: str = "text", label: str = "label",
                              header: str = "auto", valid: float = 0.1, test: float = 0.1, seed: int = 0,
                              tokenize: bool = False, encoding: str = "utf-8") -> ClassificationData:
    """:class:`ClassificationData` from TSV (``sep="\\t"``) or CSV (``sep=","``) files; see the module
    docstring.  The splits are always given (``train``, ``test``, and ``valid`` when there is one)."""
    if header not in ("auto", "true", "false"):
        raise ValueError(f"header={header!r} must be auto, true or false")
    ext = "tsv" if sep == "\t" else "csv"
    p = Path(path).expanduser()
    parts: dict[str, tuple[list[str], list[str]]] = {}
    if p.is_dir():
        for split in ("train", "valid", "test"):
            f = find_split(p, split, f".{ext}")
            if f is None:
                if split == "valid":
                    continue
                raise MissingDataError(f"{ext} data {p} has no {split}.{ext}: give a folder with train.{ext}, "
                                       f"test.{ext} (and valid.{ext}) or one {ext} file split by valid= and test=")
            parts[split] = _read_split(f, sep, text, label, header, encoding)
    elif p.is_file() or Path(str(p) + ".gz").is_file():
        t, y = _read_split(resolve(p), sep, text, label, header, encoding)
        cut = cut_by_fractions(len(t), valid, test, seed, "rows", str(p))
        parts = {s: ([t[i] for i in idx], [y[i] for i in idx]) for s, idx in cut.items() if idx}
    else:
        raise MissingDataError(f"{ext} data {p} does not exist: give a folder with train.{ext}, valid.{ext}, "
                               f"test.{ext} or one {ext} file (split by the valid= and test= fractions)")
    names = class_names(y for _, ys in parts.values() for y in ys)
    if len(names) < 2:
        raise DataFormatError(p, None, f"one label only ({names[0]!r}) in column label={label}: a classifier needs two")
    index = {n: i for i, n in enumerate(names)}
    texts: list[str] = []
    labels: list[int] = []
    splits = {}
    for split, (t, y) in parts.items():
        splits[split] = torch.arange(len(texts), len(texts) + len(t))
        if tokenize:
            from .parallel import simple_tokenize
            t = [simple_tokenize(x) for x in t]
        texts += t
        labels += [index[v] for v in y]
    return ClassificationData(p.name or str(p), texts, torch.tensor(labels, dtype=torch.long), len(names), splits,
                              {ext: encoding}, names)


def _number(cell: str) -> float | None:
    """The cell as a finite float, else None (``nan`` and ``inf`` are no measurement)."""
    try:
        v = float(cell)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def load_table_regression(path: str | Path, sep: str, target: str, ignore: str | None = None,
                          header: str = "auto", encoding: str = "utf-8") -> RegressionData:
    """:class:`~kernel_attention.data.uci.RegressionData` from one CSV (``sep=","``) or TSV file: the
    ``target`` column (header name or 0-based index) is y, every other column is a feature except those
    named in ``ignore`` (names or indices joined by ``+``: ``ignore=id+date``).  ``header=auto`` reads the
    first row as a header when one of its cells is not a number.  Every feature and target cell must be a
    number.  The regression task cuts its own seeded train / test splits (``task.split``, ``n_splits``)."""
    if header not in ("auto", "true", "false"):
        raise ValueError(f"header={header!r} must be auto, true or false")
    p = Path(path).expanduser()
    if p.is_dir():
        raise MissingDataError(f"regression data {p} is a folder: give one table file (target=... reads "
                               f"one file; the regression task cuts its own splits)")
    p, rows = read_table(resolve(p), sep, encoding)
    has_header = (any(_number(c) is None for c in rows[0]) if header == "auto" else header == "true")
    head = [h.strip() for h in rows[0]] if has_header else None
    body = rows[1:] if has_header else rows
    width = len(rows[0])
    names = head or [str(i) for i in range(width)]
    ti = _column(target, width, head, p, "target")
    skip = {_column(w.strip(), width, head, p, "ignore") for w in (ignore or "").split("+") if w.strip()}
    feats = [i for i in range(width) if i != ti and i not in skip]
    if not feats:
        raise DataFormatError(p, None, "no feature column is left besides the target")
    values = []
    first = 2 if has_header else 1
    for r, row in enumerate(body):
        if len(row) != width:
            raise DataFormatError(p, r + first, f"{len(row)} columns, the first row has {width}")
        nums = [_number(c) for c in row]
        bad = next((i for i in [ti, *feats] if nums[i] is None), None)
        if bad is not None:
            left_out = "+".join(names[i] for i in sorted(skip | {bad}))
            fix = "every row needs a target" if bad == ti else f"leave such columns out with ignore={left_out}"
            raise DataFormatError(p, r + first, f"column {names[bad]!r} holds {row[bad][:30]!r}, not a finite "
                                                f"number ({fix})")
        values.append([nums[i] for i in feats] + [nums[ti]])  # the ignored cells need not be numbers
    if len(values) < 3:
        raise DataFormatError(p, None, f"{len(values)} rows are too few for a regression")
    t = torch.tensor(values, dtype=torch.float64)
    return RegressionData(p.name, t[:, :-1], t[:, -1:], [names[i] for i in feats], names[ti])
