"""The contract between a task family and the one training loop (:class:`~.loop.Trainer`).

A task (language modelling, translation, classification, regression, node classification, a synthetic
task, ...) subclasses :class:`Task` and implements four methods; the trainer owns everything else
(optimiser, schedule, precision, accumulation, DDP, evaluation cadence, checkpoints, logging, resume).

    class MyTask(Task):
        metric_for_selection = "bleu"        # a key of evaluate(model, "valid")
        higher_is_better = True

        def build_model(self) -> nn.Module: ...
        def train_batches(self, epoch, rank=0, world_size=1): ...   # iterable of micro-batches
        def loss(self, model, batch): ...                            # -> (scalar tensor, {name: float})
        def evaluate(self, model, split): ...                        # -> {metric: float}

Rules the trainer relies on
---------------------------
* ``build_model`` is called once, right after the trainer seeds every RNG with ``seed``; so the initial
  weights depend only on the seed (and are identical on every rank).
* ``train_batches(epoch, rank, world_size)`` must be **deterministic given the task's own seed and
  ``epoch``** (use a generator seeded with ``(seed, epoch)``; never the global RNG) and must give rank
  ``rank`` its own shard (e.g. every ``world_size``-th batch starting at ``rank``; ranks should get the
  same number of batches or DDP will wait forever).  Resume re-creates the epoch's iterable and skips the
  micro-batches already consumed, so an epoch may be a generator; :meth:`num_batches` (optional) lets the
  progress bar show an ETA.  Each item is one *micro-batch*: with ``accum_steps = n`` the trainer makes one
  optimiser update per ``n`` consecutive items (the last group of an epoch may be shorter).
* ``loss(model, batch)`` moves the batch to ``self.device`` (set by the trainer before the first call;
  use :meth:`to_device`), runs the model and returns the **mean** loss of the micro-batch and a dict of
  floats to log (averaged over micro-batches and ranks).  ``model`` may be wrapped in
  ``DistributedDataParallel``: call it, do not reach into it (use :func:`unwrap` for attributes).
* Regularisers: if the (unwrapped) model has a method ``regularization() -> scalar tensor`` (e.g. the KL
  term of a variational kernel), the trainer adds ``config.regularization_weight * model.regularization()``
  to each micro-batch loss, after ``loss`` was called (so a value cached during the forward pass is fine),
  and logs it as ``regularization``.  ``loss`` itself must not add it again.  For the IKA kernels a model
  writes ``def regularization(self): return kernel_attention.kernels.implicit.regularization(self, n_train)``.
* ``evaluate(model, split)`` is called on rank 0 only, with the unwrapped model in ``eval()`` mode under
  ``torch.no_grad()``; the trainer restores the RNG state afterwards so evaluation never changes training.
  ``split`` is ``"valid"`` or ``"test"``.  The returned dict must contain ``metric_for_selection`` when
  ``split == "valid"`` (the trainer keeps ``best.pt`` by it).
* ``batch_tokens(batch)`` (optional) returns the number of target tokens or examples of a micro-batch;
  the progress bar then shows tokens/s instead of steps/s and ``metrics.jsonl`` gets ``tokens``.
* ``train_state()`` / ``load_train_state(state)`` (optional): what ``loss`` carries from one micro-batch to the
  next (a Transformer-XL memory), kept per rank in ``last.pt`` so that a resumed run goes on as the
  uninterrupted one; a task whose micro-batches are independent leaves them out.
"""

from __future__ import annotations

import abc
from typing import Any, Iterable

import torch
from torch import nn

__all__ = ["Task", "unwrap"]


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside a ``DistributedDataParallel`` (or ``torch.compile``) wrapper, else the model."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            return model
        model = inner


class Task(abc.ABC):
    """One task family, as the trainer sees it.  See the module docstring for the rules."""

    #: key of ``evaluate(model, "valid")`` that selects ``best.pt``
    metric_for_selection: str = "loss"
    #: whether a larger ``metric_for_selection`` is better (accuracy, BLEU) or worse (loss, ppl, RMSE)
    higher_is_better: bool = False
    #: what :meth:`batch_tokens` counts, as the progress lines name it ("tokens", or "examples")
    throughput_unit: str = "tokens"
    #: set by the trainer before training starts
    device: torch.device = torch.device("cpu")

    @abc.abstractmethod
    def build_model(self) -> nn.Module:
        """A freshly initialised model (on CPU; the trainer moves it)."""

    @abc.abstractmethod
    def train_batches(self, epoch: int, rank: int = 0, world_size: int = 1) -> Iterable[Any]:
        """The micro-batches of ``epoch`` for ``rank``; deterministic given the task's seed and ``epoch``."""

    @abc.abstractmethod
    def loss(self, model: nn.Module, batch: Any) -> tuple[torch.Tensor, dict[str, float | torch.Tensor]]:
        """Mean loss of one micro-batch (a scalar tensor with a graph) and values to log: floats, or scalar
        tensors, which the trainer reads only when it writes a record (a read waits for a GPU)."""

    @abc.abstractmethod
    def evaluate(self, model: nn.Module, split: str) -> dict[str, float]:
        """Metrics of ``model`` on ``split`` ("valid" or "test")."""

    def train_state(self) -> dict[str, Any] | None:
        """What this rank's training carries from one update to the next besides the model, the optimiser and
        the RNGs (a Transformer-XL memory), for the checkpoint: tensors on the CPU and plain Python; None when
        nothing."""
        return None

    def load_train_state(self, state: dict[str, Any] | None) -> None:
        """Take back what :meth:`train_state` gave, on resume (None: a checkpoint without it, or written by
        another number of ranks: start afresh)."""

    def num_batches(self, epoch: int, rank: int = 0, world_size: int = 1) -> int | None:
        """Number of micro-batches ``train_batches`` yields, if known (for the progress bar's ETA)."""
        return None

    def batch_tokens(self, batch: Any) -> int | None:
        """Tokens (or examples) in a micro-batch, for throughput; ``None`` shows steps/s."""
        return None

    def to_device(self, batch: Any) -> Any:
        """Move tensors of a (nested) batch to :attr:`device`."""
        if isinstance(batch, torch.Tensor):
            return batch.to(self.device, non_blocking=True)
        if isinstance(batch, dict):
            return {k: self.to_device(v) for k, v in batch.items()}
        if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
            return type(batch)(*(self.to_device(v) for v in batch))
        if isinstance(batch, (list, tuple)):
            return type(batch)(self.to_device(v) for v in batch)
        return batch
