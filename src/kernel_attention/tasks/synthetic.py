r"""Synthetic sequence-to-sequence tasks that need no download: copy, reverse, sort, recall, translation.

The data come from :mod:`kernel_attention.data.synthetic` (fixed, seeded splits; no source appears in two
splits); this module trains and evaluates the encoder-decoder model on them:

    copy         y = x
    reverse      y = x reversed                               needs positions: "none" cannot know where it is
    sort         y = x sorted ascending                       a set task: positions are not needed
    recall       x = k1 v1 k2 v2 ... kP vP q, y = v_q          associative recall (distinct keys)
    translation  y = lexicon(x), reversed within blocks        a fixed random dictionary plus local reordering

Token ids: 0 <pad>, 1 <bos>, 2 <eos>, symbols 3 .. 3+V-1 (``vocab`` = V counts the symbols only).  The model
reads ``x <eos>`` and is trained with teacher forcing on ``<bos> y`` -> ``y <eos>``; evaluation reports
``exact_match`` (greedy / beam decoding equals the target, the selection metric), ``token_accuracy``
(teacher-forced arg-max per target token) and the loss.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from kernel_attention.data.synthetic import BOS_ID as BOS
from kernel_attention.data.synthetic import EOS_ID as EOS
from kernel_attention.data.synthetic import N_SPECIALS as FIRST
from kernel_attention.data.synthetic import PAD_ID as PAD
from kernel_attention.data.synthetic import SYNTHETIC
from kernel_attention.registry import SpecError
from kernel_attention.tasks.common import check_options, label_smoothed_nll, model_spec
from kernel_attention.training.decoding import beam_search, greedy_search
from kernel_attention.training.task import Task, unwrap

__all__ = ["SyntheticSeq2SeqTask", "KINDS", "PAD", "BOS", "EOS", "FIRST"]

KINDS = ("copy", "reverse", "sort", "recall", "translation")
EVAL_DEFAULTS = {"beam": 1, "len_penalty": 1.0, "max_extra": 4}


def with_decoder_input(src: torch.Tensor, tgt: torch.Tensor) -> dict[str, torch.Tensor]:
    """``src`` (B, S) and ``tgt`` (B, T) = y <eos> (padded) -> the batch dict with ``tgt_in`` = <bos> y."""
    tgt_in = torch.cat([torch.full_like(tgt[:, :1], BOS), tgt[:, :-1]], 1)
    tgt_in = tgt_in.masked_fill(tgt.eq(PAD), PAD)
    return {"src": src, "tgt_in": tgt_in, "tgt_out": tgt}


class SyntheticSeq2SeqTask(Task):
    """A synthetic seq2seq task trained with the encoder-decoder model.

    Args (the ``task:`` section): kind, vocab (symbols), min_len, max_len, batch_size, train_size
    (training examples; an epoch is one pass), valid_size, test_size, label_smoothing, pairs (recall),
    block (translation).  The data seed is the run's seed.  ``model``: the ``model:`` section
    (default ``translation``); ``eval``: {beam, len_penalty, max_extra}; ``seed``: the run's seed.
    """

    metric_for_selection = "exact_match"
    higher_is_better = True

    def __init__(self, kind: str = "reverse", vocab: int = 10, min_len: int = 4, max_len: int = 8,
                 batch_size: int = 64, train_size: int = 6400, valid_size: int = 256, test_size: int = 256,
                 label_smoothing: float = 0.0, pairs: int = 4, block: int = 3, *, model: Any = None,
                 eval: dict | None = None, seed: int = 0):
        if kind not in KINDS:
            raise SpecError(f"unknown synthetic task {kind!r}; accepted: {', '.join(KINDS)}")
        if not 1 <= min_len <= max_len:
            raise SpecError(f"synthetic task needs 1 <= min_len <= max_len, got {min_len}, {max_len}")
        self.kind, self.vocab, self.min_len, self.max_len = kind, vocab, min_len, max_len
        self.batch_size, self.train_size, self.label_smoothing, self.seed = batch_size, train_size, label_smoothing, seed
        self.model_spec = model_spec(model, "translation", ["translation"])
        self.eval_opts = check_options(eval, EVAL_DEFAULTS, "eval")
        self.n_tokens = FIRST + vocab
        if kind == "recall":
            spec = {"name": "recall", "pairs": pairs, "vocab": self.n_tokens}
        else:
            spec = {"name": "translate" if kind == "translation" else kind, "length": max_len, "min_length": min_len,
                    "vocab": self.n_tokens, **({"block": block} if kind == "translation" else {})}
        try:
            self.data = SYNTHETIC.create({**spec, "n_train": train_size, "n_valid": valid_size, "n_test": test_size,
                                          "seed": seed})
        except ValueError as e:
            raise SpecError(f"task 'synthetic': {e}") from None
        self.splits = {k: v for k, v in self.data.splits.items()}

    # -- Task interface -------------------------------------------------------------------------------
    def build_model(self) -> nn.Module:
        from kernel_attention.models import MODELS
        model = MODELS.create(self.model_spec, src_vocab=self.n_tokens, tgt_vocab=self.n_tokens, pad_id=PAD)
        model.n_train = float(self.train_size)  # IKA regulariser: KL per training example
        return model

    def num_batches(self, epoch, rank=0, world_size=1):
        n = self.train_size // self.batch_size
        return len(range(rank, n - n % world_size, world_size))

    def train_batches(self, epoch, rank=0, world_size=1):
        for src, tgt in self.data.batches("train", self.batch_size, shuffle=True, seed=self.seed, epoch=epoch,
                                          rank=rank, world_size=world_size, drop_last=True):
            yield with_decoder_input(src, tgt)

    def batch_tokens(self, batch):
        return int(batch["tgt_out"].ne(PAD).sum())

    def loss(self, model, batch):
        batch = self.to_device(batch)
        logits = model(batch["src"], batch["tgt_in"])
        loss, nll, _ = label_smoothed_nll(logits, batch["tgt_out"], self.label_smoothing, PAD)
        return loss, {"nll": nll.detach()}

    def decode(self, model: nn.Module, src: torch.Tensor, max_len: int) -> torch.Tensor:
        """Generated tokens (B, L) ending in <eos>, right-padded (greedy, or beam when eval.beam > 1)."""
        model = unwrap(model)
        enc = model.encode(src)
        state = {"enc": enc, "cache": None}
        step = model.step  # incremental: each step runs only the newest token through the decoder
        beam = int(self.eval_opts["beam"])
        if beam > 1:
            out = beam_search(step, src.shape[0], beam, BOS, EOS, max_len, state=state, reorder=model.reorder_state,
                              len_penalty=self.eval_opts["len_penalty"], pad=PAD, device=src.device)
        else:
            out = greedy_search(step, src.shape[0], BOS, EOS, max_len, state=state, pad=PAD, device=src.device)
        return out.tokens

    def evaluate(self, model, split):
        pairs = self.splits[split]
        exact = correct = tokens = 0
        loss_sum = 0.0
        for src, tgt in self.data.batches(split, 256):
            batch = self.to_device(with_decoder_input(src, tgt))
            logits = model(batch["src"], batch["tgt_in"])
            _, nll, n = label_smoothed_nll(logits, batch["tgt_out"], 0.0, PAD)
            loss_sum += float(nll) * int(n)
            keep = batch["tgt_out"].ne(PAD)
            correct += int((logits.argmax(-1).eq(batch["tgt_out"]) & keep).sum())
            tokens += int(keep.sum())
            max_len = batch["tgt_out"].shape[1] + int(self.eval_opts["max_extra"])
            hyp = self.decode(model, batch["src"], max_len)
            for b in range(hyp.shape[0]):
                ref = batch["tgt_out"][b][keep[b]].tolist()
                exact += hyp[b][:len(ref)].tolist() == ref and (hyp.shape[1] == len(ref) or int(hyp[b][len(ref)]) == PAD)
        return {"exact_match": exact / len(pairs), "token_accuracy": correct / tokens, "loss": loss_sum / tokens}
