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

from kernel_attention.registry import SpecError
from kernel_attention.tasks.common import check_options, generator, model_spec
from kernel_attention.tasks.data_source import check_dataset_spec, dataset_param, load_dataset
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
        if fold >= folds:
            raise SpecError(f"task 'classification': fold={fold} must be in [0, folds={folds})")
        self.batch_size, self.fold, self.folds, self.max_len, self.min_freq = batch_size, fold, folds, max_len, min_freq
        self.seed = seed
        self.model_spec = model_spec(model, "classifier", ["classifier"])
        self.data = data
        self._ready = False
        self.label_names = None
        self._saved = None  # the run's own vocabulary and classes (load_artifacts), used instead of rebuilding them

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
        if self._saved is not None:
            if ds.num_classes != self._saved["num_classes"]:
                raise ValueError(f"the data of this run now has {ds.num_classes} classes, the run was trained "
                                 f"with {self._saved['num_classes']}")
        else:
            self.vocab = Vocab.build([tokens[i] for i in train], self.min_freq)
            self.num_classes = ds.num_classes
            self.label_names = getattr(ds, "label_names", None)
        enc = lambda idx: ([self.vocab.encode(tokens[i][:self.max_len] or ["<unk>"]) for i in idx],
                           ds.labels[torch.tensor(idx, dtype=torch.long)])
        self.split_data = {"train": enc(train), "valid": enc(dev), "test": enc(test)}
        self._ready = True

    def build_model(self) -> nn.Module:
        from kernel_attention.models import MODELS
        if self._saved is None:
            self._prepare()
        model = MODELS.create(self.model_spec, vocab=len(self.vocab), n_classes=self.num_classes,
                              pad_id=self.vocab.pad_id)
        n_train = self._saved["n_train"] if self._saved is not None else len(self.split_data["train"][0])
        model.n_train = float(n_train)  # IKA regulariser: KL per training sentence
        return model

    # -- a run directory that travels: the vocabulary and the classes are kept next to the checkpoints --
    def save_artifacts(self, run_dir) -> dict[str, Any]:
        """Write ``vocab.json`` into ``run_dir``; returns what :meth:`load_artifacts` needs (with the
        number of classes and, for your own TSV / CSV files, their label strings)."""
        from pathlib import Path
        self._prepare()
        self.vocab.save(Path(run_dir) / "vocab.json")
        return {"vocab": "vocab.json", "num_classes": int(self.num_classes),
                "n_train": len(self.split_data["train"][0]), "label_names": self.label_names}

    def load_artifacts(self, run_dir, artifacts: dict[str, Any]) -> None:
        """Use the vocabulary and classes saved by :meth:`save_artifacts`: no training data is read until a
        split is evaluated."""
        from pathlib import Path

        from kernel_attention.data.vocab import Vocab
        self.vocab = Vocab.load(Path(run_dir) / artifacts["vocab"])
        self.num_classes = int(artifacts["num_classes"])
        self.label_names = artifacts.get("label_names")
        self._saved = dict(artifacts)

    @torch.no_grad()
    def classify(self, model: nn.Module, texts: list[str]) -> list[Any]:
        """The predicted class of each text, split into words as the training texts were (on whitespace, after
        lower-casing and splitting punctuation off where the data spec says ``tokenize=true``): its label string
        where the data named them (your own TSV / CSV files), else the class number."""
        from kernel_attention.data.parallel import simple_tokenize
        model.eval()
        if dataset_param(self.data, "tokenize", False):
            texts = [simple_tokenize(t) for t in texts]
        xs = [self.vocab.encode(t.split()[:self.max_len] or ["<unk>"]) for t in texts]
        pred = model(self.to_device(self._batch(xs, torch.zeros(len(xs), dtype=torch.long)))["tokens"]).argmax(-1)
        return [self.label_names[int(i)] if self.label_names else int(i) for i in pred.cpu()]

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
        return loss, {"accuracy": (logits.argmax(-1) == batch["labels"]).float().mean()}  # not read per step

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
