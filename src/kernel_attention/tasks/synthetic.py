r"""Synthetic sequence-to-sequence tasks that need no download: copy, reverse, sort, recall, translation.

Each example is a source sequence of symbols and a target sequence, generated on the fly from a seeded
generator (``(seed, epoch)`` for training, ``(seed, split)`` for the fixed valid / test sets):

    copy         y = x
    reverse      y = x reversed                               needs positions: "none" cannot know where it is
    sort         y = x sorted ascending                       a set task: positions are not needed
    recall       x = k1 v1 k2 v2 ... kn vn <sep> k_q, y = v_q  associative recall (distinct keys)
    translation  y = lexicon(x) with adjacent pairs swapped   a fixed random word map plus local reordering

Token ids: 0 <pad>, 1 <bos>, 2 <eos>, 3 <sep>, symbols 4 .. 4+V-1.  The model (``translation`` by default)
reads ``x <eos>`` and is trained with teacher forcing on ``<bos> y`` -> ``y <eos>``; evaluation reports
``exact_match`` (greedy / beam decoding equals the target, the selection metric), ``token_accuracy``
(teacher-forced arg-max per target token) and the loss.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from kernel_attention.registry import SpecError
from kernel_attention.tasks.common import check_options, generator, label_smoothed_nll, model_spec
from kernel_attention.training.decoding import beam_search, greedy_search
from kernel_attention.training.task import Task, unwrap

__all__ = ["SyntheticSeq2SeqTask", "make_example", "KINDS", "PAD", "BOS", "EOS", "SEP", "FIRST"]

PAD, BOS, EOS, SEP, FIRST = 0, 1, 2, 3, 4
KINDS = ("copy", "reverse", "sort", "recall", "translation")
EVAL_DEFAULTS = {"beam": 1, "len_penalty": 1.0, "max_extra": 4}


def make_example(kind: str, length: int, vocab: int, gen: torch.Generator, lexicon: torch.Tensor | None = None):
    """One ``(x, y)`` pair of symbol ids (>= FIRST) as 1-D long tensors."""
    if kind == "recall":
        n = max(1, min(length // 2, vocab // 2))
        keys = torch.randperm(vocab // 2, generator=gen)[:n] + FIRST
        vals = torch.randint(vocab // 2, vocab, (n,), generator=gen) + FIRST
        q = int(torch.randint(0, n, (1,), generator=gen))
        x = torch.cat([torch.stack([keys, vals], 1).flatten(), torch.tensor([SEP, int(keys[q])])])
        return x, vals[q:q + 1]
    x = torch.randint(FIRST, FIRST + vocab, (length,), generator=gen)
    if kind == "copy":
        y = x.clone()
    elif kind == "reverse":
        y = x.flip(0)
    elif kind == "sort":
        y = x.sort().values
    elif kind == "translation":
        y = lexicon[x - FIRST] + FIRST
        n2 = length - length % 2
        y = torch.cat([y[:n2].view(-1, 2).flip(1).flatten(), y[n2:]])
    else:
        raise SpecError(f"unknown synthetic task {kind!r}; accepted: {', '.join(KINDS)}")
    return x, y


def collate(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """``src`` = x <eos>, ``tgt_in`` = <bos> y, ``tgt_out`` = y <eos>, right-padded with <pad>."""
    pad = nn.utils.rnn.pad_sequence
    eos, bos = torch.tensor([EOS]), torch.tensor([BOS])
    return {"src": pad([torch.cat([x, eos]) for x, _ in pairs], batch_first=True, padding_value=PAD),
            "tgt_in": pad([torch.cat([bos, y]) for _, y in pairs], batch_first=True, padding_value=PAD),
            "tgt_out": pad([torch.cat([y, eos]) for _, y in pairs], batch_first=True, padding_value=PAD)}


class SyntheticSeq2SeqTask(Task):
    """A synthetic seq2seq task trained with the encoder-decoder model.

    Args (the ``task:`` section): kind, vocab (symbols), min_len, max_len, batch_size, train_size
    (examples per epoch), valid_size, test_size, label_smoothing.  ``model``: the ``model:`` section
    (default ``translation``); ``eval``: {beam, len_penalty, max_extra}; ``seed``: the run's seed.
    """

    metric_for_selection = "exact_match"
    higher_is_better = True

    def __init__(self, kind: str = "reverse", vocab: int = 10, min_len: int = 4, max_len: int = 8,
                 batch_size: int = 64, train_size: int = 6400, valid_size: int = 256, test_size: int = 256,
                 label_smoothing: float = 0.0, *, model: Any = None, eval: dict | None = None, seed: int = 0):
        if kind not in KINDS:
            raise SpecError(f"unknown synthetic task {kind!r}; accepted: {', '.join(KINDS)}")
        if not 1 <= min_len <= max_len:
            raise SpecError(f"synthetic task needs 1 <= min_len <= max_len, got {min_len}, {max_len}")
        self.kind, self.vocab, self.min_len, self.max_len = kind, vocab, min_len, max_len
        self.batch_size, self.train_size, self.label_smoothing, self.seed = batch_size, train_size, label_smoothing, seed
        self.model_spec = model_spec(model, "translation", ["translation"])
        self.eval_opts = check_options(eval, EVAL_DEFAULTS, "eval")
        self.lexicon = torch.randperm(vocab, generator=generator(seed, "lexicon"))
        self.n_tokens = FIRST + vocab
        self.splits = {"valid": self._examples(valid_size, generator(seed, "valid")),
                       "test": self._examples(test_size, generator(seed, "test"))}

    def _examples(self, n: int, gen: torch.Generator) -> list[tuple[torch.Tensor, torch.Tensor]]:
        lengths = torch.randint(self.min_len, self.max_len + 1, (n,), generator=gen)
        return [make_example(self.kind, int(t), self.vocab, gen, self.lexicon) for t in lengths]

    # -- Task interface -------------------------------------------------------------------------------
    def build_model(self) -> nn.Module:
        from kernel_attention.models import MODELS
        return MODELS.create(self.model_spec, src_vocab=self.n_tokens, tgt_vocab=self.n_tokens, pad_id=PAD)

    def num_batches(self, epoch, rank=0, world_size=1):
        return len(range(rank, self.train_size // self.batch_size, world_size))

    def train_batches(self, epoch, rank=0, world_size=1):
        gen = generator(self.seed, "train", epoch)
        for i in range(self.train_size // self.batch_size):
            pairs = self._examples(self.batch_size, gen)   # every rank draws every batch: same RNG stream
            if i % world_size == rank:
                yield collate(pairs)

    def batch_tokens(self, batch):
        return int(batch["tgt_out"].ne(PAD).sum())

    def loss(self, model, batch):
        batch = self.to_device(batch)
        logits = model(batch["src"], batch["tgt_in"])
        loss, nll, _ = label_smoothed_nll(logits, batch["tgt_out"], self.label_smoothing, PAD)
        return loss, {"nll": float(nll.detach())}

    def decode(self, model: nn.Module, src: torch.Tensor, max_len: int) -> torch.Tensor:
        """Generated tokens (B, L) ending in <eos>, right-padded (greedy, or beam when eval.beam > 1)."""
        model = unwrap(model)
        enc = model.encode(src)

        def step(prefix, state):
            return model.decode_step(prefix, state), state

        beam = int(self.eval_opts["beam"])
        if beam > 1:
            out = beam_search(step, src.shape[0], beam, BOS, EOS, max_len, state=enc, reorder=model.reorder_state,
                              len_penalty=self.eval_opts["len_penalty"], pad=PAD, device=src.device)
        else:
            out = greedy_search(step, src.shape[0], BOS, EOS, max_len, state=enc, pad=PAD, device=src.device)
        return out.tokens

    def evaluate(self, model, split):
        pairs = self.splits[split]
        exact = correct = tokens = 0
        loss_sum = 0.0
        for i in range(0, len(pairs), 256):
            batch = self.to_device(collate(pairs[i:i + 256]))
            logits = model(batch["src"], batch["tgt_in"])
            _, nll, n = label_smoothed_nll(logits, batch["tgt_out"], 0.0, PAD)
            loss_sum += float(nll) * n
            keep = batch["tgt_out"].ne(PAD)
            correct += int((logits.argmax(-1).eq(batch["tgt_out"]) & keep).sum())
            tokens += int(keep.sum())
            max_len = batch["tgt_out"].shape[1] + int(self.eval_opts["max_extra"])
            hyp = self.decode(model, batch["src"], max_len)
            for b in range(hyp.shape[0]):
                ref = batch["tgt_out"][b][keep[b]].tolist()
                exact += hyp[b][:len(ref)].tolist() == ref and (hyp.shape[1] == len(ref) or int(hyp[b][len(ref)]) == PAD)
        return {"exact_match": exact / len(pairs), "token_accuracy": correct / tokens, "loss": loss_sum / tokens}
