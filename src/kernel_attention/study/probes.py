"""Looking inside trained attention for the IKA figures (adapters over the tasks; nothing here trains).

* :class:`ProbedTask` wraps a task; on every "valid" evaluation it also runs one fixed training batch
  through the model, records the (q, k) that reach each attention kernel and adds, per attention place,

      <place>.max_similarity  = mean over queries of  max_k exp(log_similarity(q, k))
      <place>.mean_log_magnitude = mean over (q, k) of log_magnitude(q, k)

  (Prop. 1 / the implicit kernels' ``decompose``; the log of the magnitude is averaged because the
  magnitude itself overflows for small p).  These land in ``metrics.jsonl`` -> IKA Fig. 3.
* :func:`capture_kernel_inputs` records the inputs of every ``KernelAttention.kernel.log_kernel`` call.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from kernel_attention.training.task import Task, unwrap

__all__ = ["ProbedTask", "capture_kernel_inputs", "attention_places"]


def attention_places(model: torch.nn.Module) -> dict[str, Any]:
    """{module path: KernelAttention} of a model."""
    from kernel_attention.nn.attention import KernelAttention
    return {name: m for name, m in unwrap(model).named_modules() if isinstance(m, KernelAttention)}


@contextlib.contextmanager
def capture_kernel_inputs(model: torch.nn.Module) -> Iterator[dict[str, list]]:
    """Within the block, ``store[place]`` collects ``(q, k)`` of each log-kernel evaluation."""
    store: dict[str, list] = {}
    patched, backends = [], {}
    for name, att in attention_places(model).items():
        backends[name] = att.backend
        att.backend = "dense"  # the sdpa backend never forms log k; the dense one calls log_kernel
        kern = att.kernel
        if not hasattr(kern, "log_kernel"):
            continue
        orig = kern.log_kernel

        def wrapped(q, k, *a, _orig=orig, _name=name, **kw):
            store.setdefault(_name, []).append((q.detach(), k.detach()))
            return _orig(q, k, *a, **kw)

        kern.log_kernel = wrapped
        patched.append(kern)
    try:
        yield store
    finally:
        for kern in patched:
            del kern.log_kernel  # back to the class method
        for name, att in attention_places(model).items():
            att.backend = backends[name]


class ProbedTask(Task):
    """``task`` with similarity/magnitude statistics added to its validation metrics (see module doc)."""

    def __init__(self, task: Task):
        self.task = task
        self.metric_for_selection = task.metric_for_selection
        self.higher_is_better = task.higher_is_better
        self._batch = None

    def __getattr__(self, name):  # everything else (prepare_data, translate_ids, ...) is the task's
        if name == "task":
            raise AttributeError(name)
        return getattr(self.task, name)

    @property
    def device(self):
        return self.task.device

    @device.setter
    def device(self, value):
        self.task.device = value

    def build_model(self):
        return self.task.build_model()

    def train_batches(self, epoch, rank=0, world_size=1):
        return self.task.train_batches(epoch, rank, world_size)

    def num_batches(self, epoch, rank=0, world_size=1):
        return self.task.num_batches(epoch, rank, world_size)

    def batch_tokens(self, batch):
        return self.task.batch_tokens(batch)

    def loss(self, model, batch):
        return self.task.loss(model, batch)

    def evaluate(self, model, split):
        out = dict(self.task.evaluate(model, split))
        if split == "valid":
            out.update(self.probe(model))
        return out

    def probe(self, model) -> dict[str, float]:
        from kernel_attention.kernels.decomposition import decompose
        if self._batch is None:
            self._batch = next(iter(self.task.train_batches(0)))
        stats: dict[str, float] = {}
        places = attention_places(model)
        with torch.no_grad(), capture_kernel_inputs(model) as store:
            self.task.loss(model, self._batch)
        for name, calls in store.items():
            q, k = calls[0]
            try:
                log_sim, log_mag = decompose(places[name].kernel, q, k)
            except (ValueError, AttributeError):
                continue
            stats[f"{name}.max_similarity"] = float(log_sim.exp().amax(-1).mean())
            stats[f"{name}.mean_log_magnitude"] = float(log_mag.float().mean())
        return stats
