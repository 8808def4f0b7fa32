r"""Word-level language modelling with Transformer-XL segment memory (perplexity).

    task: {name: lm, batch_size: 60, tgt_len: 150}
    data: {dataset: wikitext-103}
    model: {name: lm, mem_len: 150, attention: {kernel: exp, position: xl}}
    eval: {tgt_len: 64, mem_len: 640, clamp_len: 400, batch_size: 10}      # TXL's evaluation setting

The training stream is cut into ``batch_size`` contiguous rows (per rank: ``batch_size`` rows of its own,
as TXL's data-parallel split) and read ``tgt_len`` tokens at a time; the model's memory is carried from one
segment to the next and reset at the start of every epoch.  Evaluation reads a split the same way with the
``eval`` lengths (memory length and clamp length are switched for the evaluation only) and reports
``ppl = exp(sum NLL / tokens)`` and ``loss`` (mean NLL).  Checkpoints keep each rank's memory, so that a resumed
run goes on with the memory an uninterrupted one would have.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from kernel_attention.data.wikitext import LMOrderedIterator
from kernel_attention.registry import SpecError
from kernel_attention.tasks.common import check_options, model_spec
from kernel_attention.tasks.data_source import check_dataset_spec, load_dataset
from kernel_attention.training.metrics import perplexity
from kernel_attention.training.task import Task, unwrap

__all__ = ["LanguageModelingTask"]

EVAL_DEFAULTS = {"tgt_len": None, "mem_len": None, "clamp_len": None, "batch_size": 10}


class LanguageModelingTask(Task):
    """Args (``task:``): batch_size, tgt_len.  ``data``: {dataset}.  ``model``: the ``lm`` model section.
    ``eval``: {tgt_len, mem_len, clamp_len, batch_size} (None = the training values)."""

    metric_for_selection = "ppl"
    higher_is_better = False

    def __init__(self, batch_size: int = 60, tgt_len: int = 150, *, model: Any = None, data: dict | None = None,
                 eval: dict | None = None, seed: int = 0):
        check_dataset_spec(data, "task 'lm'", ("lm",))
        self.batch_size, self.tgt_len, self.seed = batch_size, tgt_len, seed
        self.model_spec = model_spec(model, "lm", ["lm"])
        self.eval_opts = check_options(eval, EVAL_DEFAULTS, "eval")
        self.data = data
        self._corpus = None
        self._mems = None
        self._vocab = None      # the run's own vocabulary (load_artifacts), used instead of rebuilding it
        self._n_train = None
        self._eval_splits: dict[str, torch.Tensor] = {}

    def prepare_data(self) -> None:
        """Load the corpus now (the runner does this before checking the model), and refuse a split too short for
        its rows: each of ``batch_size`` rows (the ``eval`` one for valid and test) needs two tokens or more."""
        for split, rows in (("train", self.batch_size), ("valid", self.eval_opts["batch_size"]),
                            ("test", self.eval_opts["batch_size"])):
            n = self.corpus.splits[split].numel()
            if n < 2 * int(rows):
                raise SpecError(f"task 'lm': the {split} split holds {n} tokens, too few for {rows} rows of two or "
                                f"more (batch_size); give it more text or a smaller batch_size")

    @property
    def corpus(self):
        if self._corpus is None:
            self._corpus = load_dataset(self.data, "task 'lm'")
        return self._corpus

    @property
    def vocab(self):
        return self._vocab if self._vocab is not None else self.corpus.vocab

    def build_model(self) -> nn.Module:
        from kernel_attention.models import MODELS
        model = MODELS.create(self.model_spec, vocab=len(self.vocab))
        n_train = self._n_train if self._n_train is not None else self.corpus.splits["train"].numel()
        model.n_train = float(n_train)  # IKA regulariser: KL per training token
        return model

    # -- a run directory that travels: the vocabulary is kept next to the checkpoints --
    def save_artifacts(self, run_dir) -> dict[str, Any]:
        """Write ``vocab.json`` into ``run_dir``; returns what :meth:`load_artifacts` needs."""
        from pathlib import Path
        self.vocab.save(Path(run_dir) / "vocab.json")
        return {"vocab": "vocab.json", "n_train": int(self.corpus.splits["train"].numel())}

    def load_artifacts(self, run_dir, artifacts: dict[str, Any]) -> None:
        """Use the vocabulary saved by :meth:`save_artifacts`: no training data is read."""
        from pathlib import Path

        from kernel_attention.data.vocab import Vocab
        self._vocab = Vocab.load(Path(run_dir) / artifacts["vocab"])
        self._n_train = int(artifacts["n_train"])

    def set_test_file(self, path) -> int:
        """Evaluate ``split='test'`` on a plain-text file (one line per sentence) instead of the dataset's;
        returns how many of its words are not in the vocabulary (they count as ``<unk>``)."""
        from kernel_attention.data.wikitext import encode_lm_file
        ids, oov = encode_lm_file(path, self.vocab)
        self._eval_splits["test"] = ids
        return oov

    def _split(self, split: str) -> torch.Tensor:
        if split in self._eval_splits:
            return self._eval_splits[split]
        if self._vocab is not None and self.corpus.vocab.itos != self._vocab.itos:
            raise ValueError(f"the data of this run now gives another vocabulary ({len(self.corpus.vocab)} words) "
                             f"than the run was trained with ({len(self._vocab)}); evaluate a file with --test-file")
        return self.corpus.splits[split]

    def _rows(self, rank: int, world_size: int) -> torch.Tensor:
        it = LMOrderedIterator(self.corpus.splits["train"], self.batch_size * world_size, self.tgt_len)
        return it.streams[rank * self.batch_size:(rank + 1) * self.batch_size]

    def num_batches(self, epoch, rank=0, world_size=1):
        n = self._rows(rank, world_size).shape[1]
        return (n - 1 + self.tgt_len - 1) // self.tgt_len

    def train_batches(self, epoch, rank=0, world_size=1):
        rows = self._rows(rank, world_size)
        n = rows.shape[1]
        for k, i in enumerate(range(0, n - 1, self.tgt_len)):
            t = min(self.tgt_len, n - 1 - i)
            yield {"input": rows[:, i:i + t], "target": rows[:, i + 1:i + 1 + t], "reset": k == 0}

    def batch_tokens(self, batch):
        return int(batch["target"].numel())

    def train_state(self):
        return {"mems": None if self._mems is None else [m.cpu() for m in self._mems]}

    def load_train_state(self, state):
        mems = (state or {}).get("mems")
        self._mems = None if mems is None else [m.to(self.device) for m in mems]

    def loss(self, model, batch):
        batch = self.to_device(batch)
        if batch["reset"]:
            self._mems = None
        nll, self._mems = model(batch["input"], self._mems, targets=batch["target"])
        return nll.float().mean(), {}

    def evaluate(self, model, split):
        m = unwrap(model)
        saved = (m.mem_len, [getattr(l.self_attn.position, "clamp_len", None) for l in m.layers])
        o = self.eval_opts
        if o["mem_len"] is not None:
            m.mem_len = int(o["mem_len"])
        if o["clamp_len"] is not None:
            m.set_clamp_len(int(o["clamp_len"]))
        try:
            it = LMOrderedIterator(self._split(split), int(o["batch_size"]), int(o["tgt_len"] or self.tgt_len))
            mems, nll, n = None, 0.0, 0
            for seg in it:
                x, y = seg.input.to(self.device), seg.target.to(self.device)
                seg_nll, mems = m(x, mems, targets=y)
                nll += float(seg_nll.detach().float().sum())
                n += y.numel()
        finally:
            m.mem_len = saved[0]
            for layer, c in zip(m.layers, saved[1]):
                if hasattr(layer.self_attn.position, "clamp_len"):
                    layer.self_attn.position.clamp_len = c
        return {"ppl": perplexity(nll, n), "loss": nll / max(n, 1)}

    @torch.no_grad()
    def generate(self, model: nn.Module, prompt: list[str], max_new: int = 20, temperature: float = 0.0,
                 seed: int = 0) -> list[str]:
        """Continue ``prompt`` (words) token by token, feeding each new token with the memory;
        temperature 0 = greedy."""
        m = unwrap(model).eval()
        vocab = self.vocab
        ids = torch.tensor([[vocab[w] for w in prompt]], device=self.device)
        gen = torch.Generator(device="cpu").manual_seed(seed)
        mem_len = m.mem_len
        m.mem_len = max(mem_len, 10 ** 6) if mem_len > 0 else 0  # keep the whole context when memory is on
        out: list[str] = []
        try:
            mems = None
            x = ids
            ctx = ids
            for _ in range(max_new):
                logits, mems = m(x if mems is not None else ctx, mems)
                last = logits[0, -1].float()
                if temperature > 0:
                    tok = int(torch.multinomial(torch.softmax(last / temperature, -1).cpu(), 1, generator=gen))
                else:
                    tok = int(last.argmax())
                out.append(vocab.decode([tok], strip_specials=False)[0])
                x = torch.tensor([[tok]], device=self.device)
                ctx = torch.cat([ctx, x], 1)
                if m.mem_len == 0:
                    mems = None  # no memory: recompute on the whole context
        finally:
            m.mem_len = mem_len
        return out
