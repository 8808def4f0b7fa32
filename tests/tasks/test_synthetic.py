"""Synthetic seq2seq tasks: data generation against hand-written rules, and a short end-to-end run."""

import pytest
import torch

from kernel_attention.registry import SpecError
from kernel_attention.tasks import TASKS, build_task
from kernel_attention.tasks.synthetic import FIRST

TINY = {"d_model": 16, "n_heads": 2, "d_ff": 32, "enc_layers": 1, "dec_layers": 1, "dropout": 0.0}


def test_batches_come_from_the_synthetic_data_with_teacher_forcing_inputs():
    task = build_task({"task": {"name": "synthetic", "kind": "reverse", "vocab": 6, "min_len": 3, "max_len": 5,
                                "batch_size": 8, "train_size": 32}, "seed": 3})
    batches = list(task.train_batches(0))
    assert len(batches) == 4 == task.num_batches(0)
    for b in batches:
        src, tgt_in, tgt_out = b["src"], b["tgt_in"], b["tgt_out"]
        assert torch.all(tgt_in[:, 0] == 1)                              # <bos>
        real = tgt_out.ne(0)
        assert torch.equal(tgt_in[:, 1:][real[:, 1:]], tgt_out[:, :-1][real[:, 1:]])
        for s, t in zip(src, tgt_out):                                   # reverse, each ending in <eos>
            s, t = s[s.ne(0)].tolist(), t[t.ne(0)].tolist()
            assert t[:-1] == s[:-1][::-1] and s[-1] == t[-1] == 2 and min(s[:-1]) >= FIRST
    # shuffled per epoch, deterministically
    again = list(task.train_batches(0))
    assert all(torch.equal(a["src"], b["src"]) for a, b in zip(batches, again))
    assert not all(torch.equal(a["src"], b["src"]) for a, b in zip(batches, task.train_batches(1)))


def test_copy_trains_evaluates_and_decodes(train):
    task = build_task({"task": {"name": "synthetic", "kind": "copy", "vocab": 6, "min_len": 3, "max_len": 4,
                                "batch_size": 32, "train_size": 32 * 40, "valid_size": 32, "test_size": 32},
                       "model": TINY, "eval": {"beam": 2}, "seed": 1})
    trainer, summary = train(task, 40, lr=1e-2)
    m = trainer.evaluate("test")
    assert set(m) == {"exact_match", "token_accuracy", "loss"}
    assert m["token_accuracy"] > 0.35         # chance is about 1/7 per token (6 symbols + <eos>)
    model = trainer.model.eval()
    src = torch.tensor([[3, 4, 5, 2]])
    out = task.decode(model, src, 6)
    assert out.shape[0] == 1 and (out[0] == 2).any()


def test_bad_synthetic_configs():
    with pytest.raises(SpecError, match="kind.*not one of"):
        build_task({"task": {"name": "synthetic", "kind": "mirror"}})
    with pytest.raises(SpecError, match="unknown task 'seq2seq'; accepted"):
        build_task({"task": "seq2seq"})
    with pytest.raises(SpecError, match="unknown eval option.*beam_size"):
        build_task({"task": "synthetic", "eval": {"beam_size": 4}})
    with pytest.raises(SpecError, match="does not fit this task; accepted: translation"):
        build_task({"task": "synthetic", "model": {"name": "lm"}})
    with pytest.raises(SpecError, match="makes its own data and reads no data.dataset.*: classification, lm"):
        build_task({"task": "synthetic", "data": {"dataset": "wikitext-3"}})  # a typo would pass unread
    assert "synthetic" in TASKS
