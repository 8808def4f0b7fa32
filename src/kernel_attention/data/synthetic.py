"""Synthetic sequence-to-sequence tasks: no download, seeded, and sensitive to how attention is built.

    from kernel_attention.data.synthetic import SYNTHETIC
    data = SYNTHETIC.create("reverse:length=12,vocab=20,n_train=1000")
    src, tgt = data["train"][0]                       # 1-D LongTensors, each ending with EOS
    for src, tgt in data.batches("train", 32, shuffle=True, seed=0, epoch=3):   # (B, S), (B, T) padded
        ...

Vocabulary: ids ``0 = pad``, ``1 = bos``, ``2 = eos``; content symbols are ``3 .. vocab-1``
(``vocab`` counts the specials).  Every source and target ends with EOS (the fairseq convention); a
decoder's input is ``[BOS] + target[:-1]``.  The ids are also attributes ``pad_id``, ``bos_id``, ``eos_id``
(the names :class:`~kernel_attention.data.vocab.Vocab` uses), so models should read them from the data.

Tasks (x = source symbols, y = target symbols, before EOS):

``copy``       y = x.
``reverse``    y = x reversed: position i attends to position L-1-i.
``sort``       y = x sorted ascending: content-based, order-free attention.
``recall``     associative recall.  x = k1 v1 k2 v2 ... kP vP q with distinct keys k from the first half of
               the content symbols, values v from the second half, and a query q = one of the keys;
               y = [the value that followed q].
``translate``  a toy language pair: y_j = lex[x_{pi(j)}] where ``lex`` is a fixed random bijection of the
               content symbols (the "dictionary", drawn from ``seed``) and ``pi`` reverses each
               consecutive block of ``block`` positions (local reordering, so the alignment is not the
               identity and must be learnt).

Sizes: ``length`` symbols per source (uniform in ``[min_length, length]`` when ``min_length`` is given),
``n_train`` / ``n_valid`` / ``n_test`` examples.  All splits come from one generator seeded by ``seed``,
and no source appears twice across the three splits (so valid/test are unseen sequences).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterator

import numpy as np
import torch

from kernel_attention.registry import Param, Registry

__all__ = ["SYNTHETIC", "SyntheticData", "PAD_ID", "BOS_ID", "EOS_ID", "N_SPECIALS"]

SYNTHETIC = Registry("synthetic task")
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
N_SPECIALS = 3
SPLITS = ("train", "valid", "test")

Example = tuple[torch.Tensor, torch.Tensor]


@dataclasses.dataclass
class SyntheticData:
    """Fixed splits of (source, target) pairs of 1-D LongTensors; ``data["train"]`` is a list of pairs."""

    name: str
    vocab_size: int
    splits: dict[str, list[Example]]
    params: dict
    pad_id: int = PAD_ID
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID

    def __getitem__(self, split: str) -> list[Example]:
        if split not in self.splits:
            raise KeyError(f"unknown split {split!r}; accepted: {', '.join(self.splits)}")
        return self.splits[split]

    def __len__(self) -> int:
        return len(self.splits["train"])

    def batches(self, split: str, batch_size: int, shuffle: bool = False, seed: int = 0, epoch: int = 0,
                rank: int = 0, world_size: int = 1, drop_last: bool = False) -> Iterator[Example]:
        """Padded ``(src (B, S), tgt (B, T))`` batches.  The order is a permutation drawn from
        ``(seed, epoch)`` when ``shuffle`` (deterministic, as :class:`~kernel_attention.training.Task`
        needs); rank ``r`` of ``world_size`` gets batches ``r, r + world_size, ...``, with ``drop_last`` every
        rank as many (the last ``n % world_size`` batches go too: ranks that end an epoch at different steps
        would disagree on where a resumed run is)."""
        data = self[split]
        order = np.arange(len(data))
        if shuffle:
            order = np.random.default_rng([seed, epoch]).permutation(len(data))
        starts = range(0, len(data), batch_size)
        if drop_last:
            starts = range(0, len(data) - batch_size + 1, batch_size)
            starts = starts[:len(starts) - len(starts) % world_size]
        for i, start in enumerate(starts):
            if i % world_size != rank:
                continue
            pairs = [data[j] for j in order[start:start + batch_size]]
            yield _pad([s for s, _ in pairs], self.pad_id), _pad([t for _, t in pairs], self.pad_id)


def _pad(seqs: list[torch.Tensor], pad: int) -> torch.Tensor:
    out = torch.full((len(seqs), max(len(s) for s in seqs)), pad, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = s
    return out


def _build(name: str, sample: Callable[[np.random.Generator], tuple[list[int], list[int]]], rng, vocab: int,
           n_train: int, n_valid: int, n_test: int, params: dict) -> SyntheticData:
    sizes = dict(zip(SPLITS, (n_train, n_valid, n_test)))
    total = sum(sizes.values())
    seen: set[tuple[int, ...]] = set()
    examples: list[Example] = []
    tries = 0
    while len(examples) < total:
        tries += 1
        if tries > 20 * total + 1000:
            raise ValueError(f"synthetic task {name!r} cannot draw {total} distinct sources with {params}; "
                             f"raise length or vocab, or lower n_train/n_valid/n_test")
        src, tgt = sample(rng)
        if tuple(src) in seen:
            continue
        seen.add(tuple(src))
        examples.append((torch.tensor(src + [EOS_ID], dtype=torch.long),
                         torch.tensor(tgt + [EOS_ID], dtype=torch.long)))
    splits, i = {}, 0
    for split, n in sizes.items():
        splits[split] = examples[i:i + n]
        i += n
    return SyntheticData(name, vocab, splits, params)


def _length(rng: np.random.Generator, length: int, min_length: int | None) -> int:
    return length if min_length is None else int(rng.integers(min_length, length + 1))


def _symbols(rng: np.random.Generator, n: int, vocab: int) -> list[int]:
    return rng.integers(N_SPECIALS, vocab, size=n).tolist()


def _pos(x) -> bool:
    return x >= 1


def _common(length: int = 16) -> list[Param]:
    return [
        Param("length", int, length, "source symbols (the maximum when min_length is set)", check=_pos, rule=">= 1"),
        Param("min_length", int, None, "shortest source; lengths uniform in [min_length, length]",
              optional=True, check=_pos, rule=">= 1"),
        Param("vocab", int, 16, "vocabulary size including pad/bos/eos", check=lambda v: v >= 4, rule=">= 4"),
    ]


_SIZES = [
    Param("n_train", int, 2000, check=_pos, rule=">= 1"),
    Param("n_valid", int, 200, check=_pos, rule=">= 1"),
    Param("n_test", int, 200, check=_pos, rule=">= 1"),
    Param("seed", int, 0),
]


def _check_lengths(name: str, length: int, min_length: int | None) -> None:
    if min_length is not None and min_length > length:
        raise ValueError(f"synthetic task {name!r}: min_length={min_length} > length={length}")


def _simple(name: str, transform: Callable[[list[int]], list[int]], doc: str) -> None:
    @SYNTHETIC.register(name, _common() + _SIZES, doc)
    def factory(length=16, min_length=None, vocab=16, n_train=2000, n_valid=200, n_test=200, seed=0):
        _check_lengths(name, length, min_length)
        params = dict(length=length, min_length=min_length, vocab=vocab, n_train=n_train, n_valid=n_valid,
                      n_test=n_test, seed=seed)

        def sample(rng):
            x = _symbols(rng, _length(rng, length, min_length), vocab)
            return x, transform(x)

        return _build(name, sample, np.random.default_rng(seed), vocab, n_train, n_valid, n_test, params)


_simple("copy", lambda x: list(x), "target = source")
_simple("reverse", lambda x: x[::-1], "target = source reversed")
_simple("sort", sorted, "target = source sorted ascending")


@SYNTHETIC.register(
    "recall",
    [Param("pairs", int, 4, "key-value pairs per example", check=_pos, rule=">= 1"),
     Param("vocab", int, 20, "vocabulary size including pad/bos/eos", check=lambda v: v >= 5, rule=">= 5")] + _SIZES,
    "associative recall: k1 v1 .. kP vP q -> value of q",
)
def _recall(pairs=4, vocab=20, n_train=2000, n_valid=200, n_test=200, seed=0) -> SyntheticData:
    n_content = vocab - N_SPECIALS
    n_keys = n_content // 2
    if n_keys < pairs:
        raise ValueError(f"synthetic task 'recall': {pairs} distinct keys need vocab >= {2 * pairs + N_SPECIALS}, "
                         f"got vocab={vocab}")
    keys = np.arange(N_SPECIALS, N_SPECIALS + n_keys)
    values = np.arange(N_SPECIALS + n_keys, vocab)
    params = dict(pairs=pairs, vocab=vocab, n_train=n_train, n_valid=n_valid, n_test=n_test, seed=seed)

    def sample(rng):
        k = rng.choice(keys, size=pairs, replace=False).tolist()
        v = rng.choice(values, size=pairs, replace=True).tolist()
        q = int(rng.integers(pairs))
        src = [t for kv in zip(k, v) for t in kv] + [k[q]]
        return src, [v[q]]

    return _build("recall", sample, np.random.default_rng(seed), vocab, n_train, n_valid, n_test, params)


@SYNTHETIC.register(
    "translate",
    _common() + [Param("block", int, 3, "reordering window: positions reversed within each block",
                       check=_pos, rule=">= 1")] + _SIZES,
    "toy translation: fixed dictionary + reversal within blocks of `block` positions",
)
def _translate(length=16, min_length=None, vocab=16, block=3, n_train=2000, n_valid=200, n_test=200,
               seed=0) -> SyntheticData:
    _check_lengths("translate", length, min_length)
    rng = np.random.default_rng(seed)
    lex = np.arange(vocab)
    lex[N_SPECIALS:] = N_SPECIALS + rng.permutation(vocab - N_SPECIALS)  # the "dictionary"
    params = dict(length=length, min_length=min_length, vocab=vocab, block=block, n_train=n_train,
                  n_valid=n_valid, n_test=n_test, seed=seed)

    def sample(rng):
        x = _symbols(rng, _length(rng, length, min_length), vocab)
        reordered = [t for i in range(0, len(x), block) for t in reversed(x[i:i + block])]
        return x, [int(lex[t]) for t in reordered]

    data = _build("translate", sample, rng, vocab, n_train, n_valid, n_test, params)
    data.lexicon = torch.as_tensor(lex)  # type: ignore[attr-defined]  # for inspection and tests
    return data
