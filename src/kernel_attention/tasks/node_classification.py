r"""Planetoid node classification (Cora, Citeseer, Pubmed) with the GAT node classifier (accuracy).

    task: {name: node_classification}
    data: {dataset: cora}                                 # or your own graph: "graph:path=DIR,id=paper"
    model: {name: node_classifier, kernel: gat}           # or ikan-direct, mikan, ...
    train: {max_epochs: 1000, lr: 0.005, weight_decay: 5e-4}

Full-batch: one step per epoch over the whole graph, the loss on the training nodes; valid / test
accuracy on the standard Planetoid masks.
"""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from torch import nn

from kernel_attention.tasks.common import check_options, model_spec
from kernel_attention.tasks.data_source import check_dataset_spec, load_dataset
from kernel_attention.training.metrics import accuracy
from kernel_attention.training.task import Task

__all__ = ["NodeClassificationTask"]


class NodeClassificationTask(Task):
    metric_for_selection = "accuracy"
    higher_is_better = True

    def __init__(self, *, model: Any = None, data: dict | None = None, eval: dict | None = None, seed: int = 0):
        check_dataset_spec(data, "task 'node_classification'", ("graph",))
        check_options(eval, {}, "eval")  # this task evaluates one way: an eval key would be ignored
        self.model_spec = model_spec(model, "node_classifier", ["node_classifier"])
        self.data, self.seed, self._graph = data, seed, None

    def prepare_data(self) -> None:
        self.graph

    @property
    def graph(self):
        if self._graph is None:
            self._graph = load_dataset(self.data, "task 'node_classification'")
        return self._graph

    def build_model(self) -> nn.Module:
        from kernel_attention.models import MODELS
        g = self.graph
        model = MODELS.create(self.model_spec, in_features=g.x.shape[1], n_classes=g.num_classes)
        model.n_train = float(g.train_mask.sum())  # IKA regulariser: KL per training node
        return model

    def num_batches(self, epoch, rank=0, world_size=1):
        return 1

    def train_batches(self, epoch, rank=0, world_size=1):
        g = self.graph
        yield {"x": g.x, "edge_index": g.edge_index, "y": g.y, "mask": g.train_mask}

    def loss(self, model, batch):
        b = self.to_device(batch)
        logits = model(b["x"], b["edge_index"])
        loss = F.cross_entropy(logits[b["mask"]], b["y"][b["mask"]])
        return loss, {}

    def evaluate(self, model, split):
        g = self.graph
        mask = (g.val_mask if split == "valid" else g.test_mask).to(self.device)
        logits = model(g.x.to(self.device), g.edge_index.to(self.device))
        y = g.y.to(self.device)
        return {"accuracy": accuracy(logits[mask].argmax(-1), y[mask]),
                "loss": float(F.cross_entropy(logits[mask], y[mask]))}
