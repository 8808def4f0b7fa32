"""Evaluation metrics: perplexity, BLEU (two conventions), accuracy, RMSE.

BLEU: two numbers are in use in the papers this library reproduces, and they are not comparable.

* :func:`sacrebleu_score` -- **detokenised sacreBLEU**: ``sacrebleu.corpus_bleu(hyps, [refs])`` with its
  defaults (``13a`` tokenisation, exponential smoothing, case-sensitive).  Give it plain detokenised text.
* :func:`tokenized_bleu` -- **tokenised BLEU as fairseq reports it** (``fairseq-generate --scoring bleu``,
  the number in Transformer-Dissection's IWSLT'14 table, and what ``multi-bleu.perl`` prints): corpus
  BLEU-4 over whitespace tokens of the already tokenised text (after ``--remove-bpe``), uniform weights,
  brevity penalty ``exp(1 - r/c)`` when ``c < r``, **no smoothing** (BLEU = 0 if some n-gram order has no
  match), case-sensitive.  Computed as ``sacrebleu.corpus_bleu(hyps, [refs], tokenize="none",
  smooth_method="none", force=True)``, i.e. sacrebleu only splits on whitespace.

Both return the score on the 0-100 scale.  Perplexity is ``exp(summed NLL in nats / tokens)``; fairseq
logs the loss in base 2 and ppl = 2**loss, the same number.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

__all__ = ["perplexity", "sacrebleu_score", "tokenized_bleu", "accuracy", "rmse"]


def perplexity(nll_sum: float | torch.Tensor, n_tokens: int | torch.Tensor) -> float:
    """``exp(nll_sum / n_tokens)`` with ``nll_sum`` the summed natural-log negative log-likelihood."""
    n = float(n_tokens)
    if n <= 0:
        raise ValueError(f"perplexity needs a positive token count, got {n_tokens}")
    return math.exp(float(nll_sum) / n)


def _check_pairs(hyps: Sequence[str], refs: Sequence[str]) -> None:
    if isinstance(hyps, str) or isinstance(refs, str):
        raise TypeError("BLEU takes lists of sentences, not a single string")
    if len(hyps) != len(refs):
        raise ValueError(f"BLEU got {len(hyps)} hypotheses but {len(refs)} references")


def sacrebleu_score(hyps: Sequence[str], refs: Sequence[str]) -> float:
    """Detokenised sacreBLEU (default signature: 13a tokenisation, exp smoothing), 0-100."""
    import sacrebleu

    _check_pairs(hyps, refs)
    return float(sacrebleu.corpus_bleu(list(hyps), [list(refs)]).score)


def tokenized_bleu(hyps: Sequence[str], refs: Sequence[str]) -> float:
    """fairseq ``--scoring bleu`` / multi-bleu style BLEU-4 on already tokenised text, 0-100."""
    import sacrebleu

    _check_pairs(hyps, refs)
    return float(sacrebleu.corpus_bleu(list(hyps), [list(refs)], tokenize="none", smooth_method="none",
                                       force=True).score)


def accuracy(pred: torch.Tensor, target: torch.Tensor, ignore_index: int | None = None) -> float:
    """Fraction of positions with ``pred == target`` (class ids), skipping ``target == ignore_index``.
    ``pred`` may also be logits ``(..., C)`` with one more dimension than ``target``: argmax is taken."""
    if pred.dim() == target.dim() + 1:
        pred = pred.argmax(-1)
    if pred.shape != target.shape:
        raise ValueError(f"accuracy: pred shape {tuple(pred.shape)} != target shape {tuple(target.shape)}")
    keep = torch.ones_like(target, dtype=torch.bool) if ignore_index is None else target != ignore_index
    n = int(keep.sum())
    if n == 0:
        raise ValueError("accuracy: no positions left to score")
    return float(((pred == target) & keep).sum()) / n


def rmse(pred: torch.Tensor, target: torch.Tensor) -> float:
    """``sqrt(mean((pred - target)**2))`` over all elements."""
    if pred.shape != target.shape:
        raise ValueError(f"rmse: pred shape {tuple(pred.shape)} != target shape {tuple(target.shape)}")
    return float(torch.sqrt(torch.mean((pred.double() - target.double()) ** 2)))
