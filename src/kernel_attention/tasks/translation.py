r"""Machine translation on parallel text with BPE (BLEU with greedy or beam search).

    task: {name: translation, max_tokens: 4096, label_smoothing: 0.1, bpe_vocab_size: 10000, joint_bpe: true}
    data: {dataset: iwslt14}                 # or multi30k, or an already prepared TranslationData
    model: {name: translation, ...}          # fairseq transformer_iwslt_de_en shape
    eval: {beam: 5, len_penalty: 1.0, max_len_a: 1.2, max_len_b: 10, bleu: tokenized, max_sentences: null}

Training: token-based batches (``max_tokens`` padded tokens per batch, shuffled with the ``(seed, epoch)``
generator), fairseq's label-smoothed cross-entropy.  Evaluation: the valid/test split is decoded (beam
search of :mod:`kernel_attention.training.decoding`, up to ``max_len_a * S + max_len_b`` tokens), BPE is
removed (``--remove-bpe``) and BLEU is computed on the tokenised text (``bleu: tokenized``, fairseq's
``--scoring bleu``; ``sacrebleu`` for detokenised sacreBLEU).  Also reports the teacher-forced ``loss``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from kernel_attention.registry import SpecError
from kernel_attention.tasks.common import check_options, generator, label_smoothed_nll, model_spec
from kernel_attention.tasks.data_source import check_dataset_spec, dataset_param, load_dataset
from kernel_attention.training.decoding import beam_search, greedy_search
from kernel_attention.training.metrics import sacrebleu_score, tokenized_bleu
from kernel_attention.training.task import Task, unwrap

__all__ = ["TranslationTask"]

EVAL_DEFAULTS = {"beam": 5, "len_penalty": 1.0, "max_len_a": 1.2, "max_len_b": 10, "bleu": "tokenized",
                 "max_sentences": None, "batch_size": 64}


class TranslationTask(Task):
    """Args (``task:``): max_tokens, label_smoothing, bpe_vocab_size, joint_bpe, max_len (training length
    filter in BPE tokens).  ``data``: {dataset}.  ``model``: the ``translation`` model section.  ``eval``:
    see the module docstring."""

    metric_for_selection = "bleu"
    higher_is_better = True

    def __init__(self, max_tokens: int = 4096, label_smoothing: float = 0.1, bpe_vocab_size: int = 10000,
                 joint_bpe: bool = True, max_len: int = 250, *, model: Any = None, data: dict | None = None,
                 eval: dict | None = None, seed: int = 0):
        check_dataset_spec(data, "task 'translation'", ("translation",))
        self.max_tokens, self.label_smoothing, self.seed = max_tokens, label_smoothing, seed
        self.bpe_vocab_size, self.joint_bpe, self.max_len = bpe_vocab_size, joint_bpe, max_len
        self.model_spec = model_spec(model, "translation", ["translation"])
        self.eval_opts = check_options(eval, EVAL_DEFAULTS, "eval")
        if self.eval_opts["bleu"] not in ("tokenized", "sacrebleu"):
            raise SpecError(f"eval.bleu={self.eval_opts['bleu']!r} is not one of ['tokenized', 'sacrebleu']")
        if self.model_spec.get("share_embeddings") and not joint_bpe:
            raise SpecError("model.share_embeddings needs one joint vocabulary: set task.joint_bpe=true")
        self.data = data
        self._prepared = None
        self._n_train = None  # from the run directory (load_artifacts)

    def prepare_data(self) -> None:
        """Load the data and learn BPE now (the runner does this before checking the model)."""
        self.prepared

    @property
    def prepared(self):
        """:class:`~kernel_attention.data.parallel.TranslationData` (BPE learned on train)."""
        if self._prepared is None:
            from kernel_attention.data.parallel import ParallelText, TranslationData, prepare_translation
            obj = load_dataset(self.data, "task 'translation'")
            if isinstance(obj, ParallelText):
                obj = prepare_translation(obj, self.bpe_vocab_size, joint=self.joint_bpe, max_len=self.max_len)
            if not isinstance(obj, TranslationData):
                raise SpecError(f"task 'translation' needs parallel text, got {type(obj).__name__}")
            for name, split in obj.splits.items():
                self._check_split(name, split, obj.filtered.get(name, 0))
            self._prepared = obj
        return self._prepared

    def _check_split(self, name: str, split, dropped: int = 0) -> None:
        """Before any update: the split holds a pair, and its longest pair fits a batch of ``max_tokens``."""
        if not len(split):
            why = f" ({dropped} dropped by the length filter, task.max_len={self.max_len})" if dropped else ""
            raise SpecError(f"task 'translation': the {name} split holds no sentence pair{why}")
        longest = max(split.lengths())
        if longest > self.max_tokens:
            raise SpecError(f"task 'translation': task.max_tokens={self.max_tokens} is less than the longest pair of "
                            f"the {name} split ({longest} tokens with <bos>/<eos>); raise task.max_tokens"
                            + (" or lower task.max_len" if name == "train" else ""))

    def build_model(self) -> nn.Module:
        from kernel_attention.models import MODELS
        d = self.prepared
        model = MODELS.create(self.model_spec, src_vocab=len(d.src_vocab), tgt_vocab=len(d.tgt_vocab),
                              pad_id=d.tgt_vocab.pad_id)
        n_train = self._n_train if self._n_train is not None else len(d.splits["train"])
        model.n_train = float(n_train)  # IKA regulariser: KL per training sentence pair
        return model

    # -- a run directory that travels: BPE model(s) and vocabularies are kept next to the checkpoints --
    def save_artifacts(self, run_dir) -> dict[str, Any]:
        """Write the BPE model(s) and vocabularies into ``run_dir``; returns what :meth:`load_artifacts` needs."""
        d = self.prepared
        return {"files": d.save_tokenizers(run_dir), "n_train": len(d.splits["train"])}

    def load_artifacts(self, run_dir, artifacts: dict[str, Any]) -> None:
        """Use the BPE and vocabularies saved by :meth:`save_artifacts`: no training data is read (a split
        is read from the data only when it is evaluated, and encoded with these)."""
        from kernel_attention.data.parallel import TranslationData
        self._prepared = TranslationData.load_tokenizers(run_dir, artifacts["files"])
        self._n_train = int(artifacts["n_train"])

    def set_test_pair(self, src_path, tgt_path) -> int:
        """Evaluate ``split='test'`` on these two aligned files (one sentence per line, tokenised as the
        training data was, :meth:`_as_trained`) instead of the dataset's test split; returns the number of pairs."""
        from kernel_attention.data.parallel import encode_pairs, read_parallel_files
        src, tgt = read_parallel_files(src_path, tgt_path)
        test = encode_pairs(self.prepared, self._as_trained(src), self._as_trained(tgt))
        self._check_split(f"test ({src_path}, {tgt_path})", test)
        self.prepared.splits["test"] = test
        return len(src)

    def _split(self, split: str):
        d = self.prepared
        if split not in d.splits:  # tokenizers from the run directory: read this split now, encode it with them
            from kernel_attention.data.parallel import ParallelText, encode_pairs
            obj = load_dataset(self.data, "task 'translation'")
            if not isinstance(obj, ParallelText):
                raise SpecError(f"task 'translation' needs parallel text, got {type(obj).__name__}")
            encoded = encode_pairs(d, *obj.splits[split])
            self._check_split(split, encoded)
            d.splits[split] = encoded
        return d.splits[split]

    def _batches(self, split: str, seed: int | None):
        v = self.prepared.tgt_vocab
        return self.prepared.splits[split].batches(self.max_tokens, v.pad_id, v.bos_id, v.eos_id, seed=seed)

    def train_batches(self, epoch, rank=0, world_size=1):
        seed = int(torch.randint(0, 2 ** 31 - 1, (1,), generator=generator(self.seed, "train", epoch)))
        batches = list(self._batches("train", seed))
        n = len(batches) - len(batches) % world_size if world_size > 1 else len(batches)
        for i in range(rank, n, world_size):
            b = batches[i]
            yield {"src": b.src, "tgt_in": b.tgt_in, "tgt_out": b.tgt_out}

    def batch_tokens(self, batch):
        return int(batch["tgt_out"].ne(self.prepared.tgt_vocab.pad_id).sum())

    def loss(self, model, batch):
        batch = self.to_device(batch)
        logits = model(batch["src"], batch["tgt_in"])
        loss, nll, _ = label_smoothed_nll(logits, batch["tgt_out"], self.label_smoothing,
                                          self.prepared.tgt_vocab.pad_id)
        return loss, {"nll": nll.detach()}

    @torch.no_grad()
    def translate_ids(self, model: nn.Module, src: torch.Tensor) -> list[list[int]]:
        """Best hypothesis ids (without <eos>) for a padded source batch (B, S)."""
        m = unwrap(model)
        v = self.prepared.tgt_vocab
        o = self.eval_opts
        src = src.to(self.device)
        enc = m.encode(src, src.ne(v.pad_id))
        max_len = int(o["max_len_a"] * src.shape[1] + o["max_len_b"])
        state = {"enc": enc, "cache": None}
        step = m.step  # incremental: each step runs only the newest token through the decoder
        if int(o["beam"]) > 1:
            out = beam_search(step, src.shape[0], int(o["beam"]), v.bos_id, v.eos_id, max_len, state=state,
                              reorder=m.reorder_state, len_penalty=float(o["len_penalty"]), pad=v.pad_id,
                              device=src.device)
        else:
            out = greedy_search(step, src.shape[0], v.bos_id, v.eos_id, max_len, state=state, pad=v.pad_id,
                                device=src.device)
        return [[t for t in row if t not in (v.pad_id, v.eos_id)] for row in out.tokens.tolist()]

    def _as_trained(self, lines: list[str]) -> list[str]:
        """Sentences tokenised as the training data was: lower-cased with punctuation split off where the data
        spec says ``tokenize=true``, else as they are (whitespace-tokenised text)."""
        from kernel_attention.data.parallel import simple_tokenize
        return [simple_tokenize(x) for x in lines] if dataset_param(self.data, "tokenize", False) else list(lines)

    def translate_lines(self, model: nn.Module, lines: list[str]) -> list[str]:
        """Source sentences (tokenised as the training data was, :meth:`_as_trained`) -> tokenised
        translations (BPE applied and removed); an empty (or blank) line gives an empty one."""
        from kernel_attention.data.bpe import remove_bpe
        d = self.prepared
        words = [line.split() for line in self._as_trained(lines)]
        todo = [i for i, w in enumerate(words) if w]
        ids = [d.src_vocab.encode(d.src_bpe.encode(" ".join(words[i])).split(), eos=True) for i in todo]
        out = [""] * len(lines)
        bs = int(self.eval_opts["batch_size"])
        for i in range(0, len(ids), bs):
            src = nn.utils.rnn.pad_sequence(ids[i:i + bs], batch_first=True, padding_value=d.src_vocab.pad_id)
            for j, hyp in zip(todo[i:i + bs], self.translate_ids(model, src)):
                out[j] = remove_bpe(" ".join(d.tgt_vocab.decode(hyp)))
        return out

    def evaluate(self, model, split):
        from kernel_attention.data.bpe import detokenize, remove_bpe
        from kernel_attention.data.parallel import collate
        d = self.prepared
        data = self._split(split)
        n = len(data) if self.eval_opts["max_sentences"] is None else min(len(data), int(self.eval_opts["max_sentences"]))
        v = d.tgt_vocab
        hyps, refs, nll_sum, tokens = [], [], 0.0, 0
        bs = int(self.eval_opts["batch_size"])
        for i in range(0, n, bs):
            idx = list(range(i, min(n, i + bs)))
            b = collate([data.src[j] for j in idx], [data.tgt[j] for j in idx], idx, v.pad_id, v.bos_id, v.eos_id)
            src, tgt_in, tgt_out = (t.to(self.device) for t in (b.src, b.tgt_in, b.tgt_out))
            _, nll, k = label_smoothed_nll(model(src, tgt_in), tgt_out, 0.0, v.pad_id)
            nll_sum, tokens = nll_sum + float(nll) * int(k), tokens + int(k)
            for j, hyp in zip(idx, self.translate_ids(model, src)):
                hyps.append(remove_bpe(" ".join(v.decode(hyp))))
                refs.append(data.ref[j])
        if self.eval_opts["bleu"] == "sacrebleu":
            bleu = sacrebleu_score([detokenize(h) for h in hyps], [detokenize(r) for r in refs])
        else:
            bleu = tokenized_bleu(hyps, refs)
        return {"bleu": bleu, "loss": nll_sum / max(tokens, 1)}
