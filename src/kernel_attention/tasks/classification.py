r"""Sentence classification (accuracy): MR, CR, SUBJ, SST, TREC, or any labelled text.

    task: {name: classification, batch_size: 50, fold: 0, folds: 10, max_len: 100, min_freq: 1}
    data: {dataset: mr}
    model: {name: classifier, d_model: 128, attention: {kernel: exp, position: none}}

Splits: a dataset's own train/test (and dev) are used when it has them; otherwise fold ``fold`` of a
stratified ``folds``-fold cross-validation (:func:`~kernel_attention.data.protocols.kfold_indices`).  When
there is no dev split, 10% of the training part (seeded) becomes the validation set.  The vocabulary is
built on the training part only.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from kernel_attention.tasks.common import check_options, generator, model_spec
from kernel_attention.tasks.data_source import check_dataset_spec, load_dataset
from kernel_attention.training.metrics import accuracy
from kernel_attention.training.task import Task

__all__ = ["ClassificationTask"]


class ClassificationTask(Task):
    metric_for_selection = "accuracy"
    higher_is_better = True
    throughput_unit = "examples"  # batch_tokens counts sentences

    def __init__(self, batch_size: int = 50, fold: int = 0, folds: int = 10, max_len: int = 100, min_freq: int = 1,
                 *, model: Any = None, data: dict | None = None, eval: dict | None = None, seed: int = 0):
        check_dataset_spec(data, "task 'classification'", ("classification",))
        check_options(eval, {}, "eval")  # this task evaluates one way: an eval key would be ignored
        self.batch_size, self.fold, self.folds, self.max_len, self.min_freq = batch_size, fold, folds, max_len, min_freq
        self.seed = seed
        self.model_spec = model_spec(model, "classifier", ["classifier"])
        self.data = data
        self._ready = False

    def prepare_data(self) -> None:
        self._prepare()

    def _prepare(self):
        if self._ready:
            return
        from kernel_attention.data.protocols import kfold_indices
        from kernel_attention.data.vocab import Vocab
        ds = load_dataset(self.data, "task 'classification'")
        if "train" in ds.splits and "test" in ds.splits:
            train, test = ds.splits["train"].tolist(), ds.splits["test"].tolist()
            dev = ds.splits["dev"].tolist() if "dev" in ds.splits else (ds.splits["valid"].tolist()
                                                                        if "valid" in ds.splits else [])
        else:
            s = kfold_indices(len(ds), self.folds, self.seed, ds.labels.tolist())[self.fold]
            train, test, dev = list(s.train), list(s.test), list(s.dev)
        if not dev:
            perm = torch.randperm(len(train), generator=generator(self.seed, "dev")).tolist()
            n_dev = max(1, len(train) // 10)
            dev, train = [train[i] for i in perm[:n_dev]], [train[i] for i in perm[n_dev:]]
        tokens = ds.tokens()
        self.vocab = Vocab.build([tokens[i] for i in train], self.min_freq)
        self.num_classes = ds.num_classes
        enc = lambda idx: ([self.vocab.encode(tokens[i][:self.max_len] or ["<unk>"]) for i in idx],
                           ds.labels[torch.tensor(idx, dtype=torch.long)])
        self.split_data = {"train": enc(train), "valid": enc(dev), "test": enc(test)}
        self._ready = True

    def build_model(self) -> nn.Module:
        from kernel_attention.models import MODELS
        self._prepare()
        model = MODELS.create(self.model_spec, vocab=len(self.vocab), n_classes=self.num_classes,
                              pad_id=self.vocab.pad_id)
        model.n_train = float(len(self.split_data["train"][0]))  # IKA regulariser: KL per training sentence
        return model

    def _batch(self, xs, ys):
        return {"tokens": nn.utils.rnn.pad_sequence(xs, batch_first=True, padding_value=self.vocab.pad_id), "labels": ys}

    def num_batches(self, epoch, rank=0, world_size=1):
        self._prepare()
        n = -(-len(self.split_data["train"][0]) // self.batch_size)
        return len(range(rank, n - n % world_size if world_size > 1 else n, world_size))

    def train_batches(self, epoch, rank=0, world_size=1):
        self._prepare()
        xs, ys = self.split_data["train"]
        perm = torch.randperm(len(xs), generator=generator(self.seed, "train", epoch)).tolist()
        starts = list(range(0, len(xs), self.batch_size))
        if world_size > 1:
            starts = starts[:len(starts) - len(starts) % world_size]
        for k in range(rank, len(starts), world_size):
            idx = perm[starts[k]:starts[k] + self.batch_size]
            yield self._batch([xs[i] for i in idx], ys[idx])

    def batch_tokens(self, batch):
        return int(batch["labels"].numel())

    def loss(self, model, batch):
        batch = self.to_device(batch)
        logits = model(batch["tokens"])
        loss = F.cross_entropy(logits.float(), batch["labels"])
        return loss, {"accuracy": accuracy(logits.argmax(-1), batch["labels"])}

    def evaluate(self, model, split):
        self._prepare()
        xs, ys = self.split_data[split]
        preds, loss = [], 0.0
        for i in range(0, len(xs), 256):
            b = self.to_device(self._batch(xs[i:i + 256], ys[i:i + 256]))
            logits = model(b["tokens"])
            loss += float(F.cross_entropy(logits.float(), b["labels"], reduction="sum"))
            preds.append(logits.argmax(-1).cpu())
        pred = torch.cat(preds)
        return {"accuracy": accuracy(pred, ys), "loss": loss / max(len(xs), 1)}
