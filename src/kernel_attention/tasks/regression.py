r"""The IKA paper's regression protocol (official code, reference notes 2.6): RMSE on UCI tables and series.

    task: {name: regression, split: 0, n_splits: 10, train_fraction: 0.9, scale: minmax, valid_fraction: 0.1}
    data: {dataset: concrete}
    model: {name: regressor, d_model: 64, n_heads: 8}          # 1 post-LN layer, no PE
    train: {max_epochs: 1000, lr: 0.01, clip_norm: 1000}

The whole dataset (train and test rows) is ONE sequence (B = 1, T = N); every step is one full batch.
The loss is the MSE on the training rows only.  Split ``split`` of ``n_splits`` random
``train_fraction`` splits (seeded by the run's seed); ``valid_fraction`` of the training rows are held out
for model selection (``valid_fraction: 0`` selects on the test rows, as the official code's "best test RMSE
over epochs" does -- optimistic).  ``scale``: ``minmax`` to [-1, 1] (housing, parkinsons in the paper),
``standard``, or ``none``; fitted on the training rows; ``rmse`` is in the target's original units and
``rmse_scaled`` in the scaled target's, the units of the paper's Table 4.

    model: {name: gp, kernel: sm}                            # the paper's GP rows (models/gp.py)

A Gaussian process conditions on the training rows (set when the model is built); its loss is the negative
marginal log likelihood of those rows per row instead of the MSE, and it predicts the posterior mean.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from kernel_attention.registry import SpecError
from kernel_attention.tasks.common import check_options, generator, model_spec
from kernel_attention.tasks.data_source import check_dataset_spec, load_dataset
from kernel_attention.training.metrics import rmse
from kernel_attention.training.task import Task, unwrap

__all__ = ["RegressionTask"]


class RegressionTask(Task):
    metric_for_selection = "rmse"
    higher_is_better = False

    def __init__(self, split: int = 0, n_splits: int = 10, train_fraction: float = 0.9, scale: str = "minmax",
                 valid_fraction: float = 0.1, *, model: Any = None, data: dict | None = None,
                 eval: dict | None = None, seed: int = 0):
        check_dataset_spec(data, "task 'regression'", ("regression",))
        check_options(eval, {}, "eval")  # this task evaluates one way: an eval key would be ignored
        if scale not in ("minmax", "standard", "none"):
            raise SpecError(f"task 'regression': scale={scale!r} is not one of ['minmax', 'standard', 'none']")
        if not 0 <= split < n_splits:
            raise SpecError(f"task 'regression': split={split} must be in [0, {n_splits})")
        self.split, self.n_splits, self.train_fraction, self.scale = split, n_splits, train_fraction, scale
        self.valid_fraction, self.seed = valid_fraction, seed
        self.model_spec = model_spec(model, "regressor", ["regressor", "gp"])
        self.data = data
        self._ready = False

    def prepare_data(self) -> None:
        self._prepare()

    def _prepare(self):
        if self._ready:
            return
        from kernel_attention.data.uci import fit_scaler
        ds = load_dataset(self.data, "task 'regression'")
        s = ds.random_splits(self.n_splits, self.train_fraction, self.seed)[self.split]
        train, test = list(s.train), list(s.test)
        if self.valid_fraction > 0:
            perm = torch.randperm(len(train), generator=generator(self.seed, "valid")).tolist()
            k = max(1, int(round(len(train) * self.valid_fraction)))
            valid, train = [train[i] for i in perm[:k]], [train[i] for i in perm[k:]]
        else:
            valid = test
        x, y = ds.x.float(), ds.y.float().reshape(len(ds), -1)
        if self.scale != "none":
            self.x_scaler = fit_scaler(x, self.scale, train)
            self.y_scaler = fit_scaler(y, self.scale, train)
            x, y = self.x_scaler.transform(x), self.y_scaler.transform(y)
        else:
            self.y_scaler = None
        self.x, self.y = x.float(), y.float()
        self.index = {k: torch.tensor(v, dtype=torch.long) for k, v in
                      (("train", train), ("valid", valid), ("test", test))}
        self._ready = True

    def build_model(self) -> nn.Module:
        from kernel_attention.models import MODELS
        self._prepare()
        model = MODELS.create(self.model_spec, in_features=self.x.shape[1], out_features=self.y.shape[1])
        train = self.index["train"]
        if hasattr(model, "condition"):  # a GP: its predictions are conditioned on the training rows
            model.condition(self.x[train], self.y[train])
        model.n_train = float(len(train))  # IKA regulariser: official 0.1 KL / N_train
        return model

    def num_batches(self, epoch, rank=0, world_size=1):
        return 1

    def train_batches(self, epoch, rank=0, world_size=1):
        self._prepare()
        yield {"x": self.x[None], "y": self.y[None], "index": self.index["train"]}

    def loss(self, model, batch):
        batch = self.to_device(batch)
        gp = unwrap(model)
        if hasattr(gp, "negative_mll"):  # fitted to the rows it was conditioned on (build_model), not the batch
            if gp is not model:
                raise RuntimeError("model 'gp' trains in one process: its loss is one factorisation of all the "
                                   "training rows, which data-parallel ranks would not share out")
            return gp.negative_mll(), {}
        pred = model(batch["x"]).reshape(batch["y"].shape)
        diff = (pred - batch["y"])[:, batch["index"]]
        return (diff ** 2).mean(), {}

    def evaluate(self, model, split):
        self._prepare()
        x = self.x[None].to(self.device)
        pred = model(x).reshape(1, *self.y.shape)[0].cpu()
        idx = self.index[split]
        p, t = pred[idx], self.y[idx]
        if self.y_scaler is None:
            return {"rmse": rmse(p, t)}
        return {"rmse": rmse(self.y_scaler.inverse(p), self.y_scaler.inverse(t)), "rmse_scaled": rmse(p, t)}
