"""A tiny next-token task (embedding + dropout + linear) for the training-loop tests."""

from __future__ import annotations

import torch
from torch import nn

from kernel_attention.training import Task


class ToyLM(nn.Module):
    def __init__(self, vocab: int = 13, dim: int = 8, reg: bool = False):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.drop = nn.Dropout(0.1)
        self.out = nn.Linear(dim, vocab)
        self.reg = reg
        if reg:  # a model-exposed regulariser, added by the trainer
            self.regularization = lambda: 1e-3 * self.out.weight.pow(2).sum()

    def forward(self, x):
        return self.out(self.drop(self.emb(x)))


class ToyTask(Task):
    """Sequences where token t+1 = (token t * 3 + 1) mod V with noise; batches from a (seed, epoch) generator."""

    metric_for_selection = "loss"
    higher_is_better = False

    def __init__(self, seed=0, vocab=13, batch=8, seq=6, n_batches=6, reg=False, dropout=True):
        self.seed, self.vocab, self.batch, self.seq, self.n_batches = seed, vocab, batch, seq, n_batches
        self.reg, self.dropout = reg, dropout

    def _make(self, g, n):
        x = torch.randint(0, self.vocab, (n, 1), generator=g)
        cols = [x]
        for _ in range(self.seq - 1):
            nxt = (cols[-1] * 3 + 1) % self.vocab
            noise = torch.randint(0, self.vocab, nxt.shape, generator=g)
            keep = torch.rand(nxt.shape, generator=g) < 0.8
            cols.append(torch.where(keep, nxt, noise))
        return torch.cat(cols, 1)

    def build_model(self):
        m = ToyLM(self.vocab, reg=self.reg)
        if not self.dropout:
            m.drop.p = 0.0
        return m

    def all_batches(self, epoch):
        g = torch.Generator().manual_seed(self.seed * 1000 + epoch)
        return [self._make(g, self.batch) for _ in range(self.n_batches)]

    def train_batches(self, epoch, rank=0, world_size=1):
        return self.all_batches(epoch)[rank::world_size]

    def num_batches(self, epoch, rank=0, world_size=1):
        return len(range(rank, self.n_batches, world_size))

    def batch_tokens(self, batch):
        return batch[:, 1:].numel()

    def loss(self, model, batch):
        batch = self.to_device(batch)
        logits = model(batch[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, self.vocab), batch[:, 1:].reshape(-1))
        return loss, {"nll": loss.detach()}  # a tensor: the trainer reads it when it writes a record

    def evaluate(self, model, split):
        g = torch.Generator().manual_seed(10_000 + (split == "test"))
        x = self.to_device(self._make(g, 32))
        logits = model(x[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, self.vocab), x[:, 1:].reshape(-1))
        acc = (logits.argmax(-1) == x[:, 1:]).float().mean()
        return {"loss": float(loss), "acc": float(acc)}
