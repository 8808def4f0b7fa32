"""LM task end to end on a tiny WikiText-layout corpus the test writes."""

import math

import pytest
import torch

from kernel_attention.data import MissingDataError
from kernel_attention.registry import SpecError
from kernel_attention.tasks import build_task

WORDS = "the cat sat on a mat and the dog ran to a log".split()


def write_corpus(root, name="wikitext-2"):
    folder = root / name
    folder.mkdir(parents=True)
    g = torch.Generator().manual_seed(0)
    for split, n in (("train", 60), ("valid", 10), ("test", 10)):
        lines = [" ".join(WORDS[int(i)] for i in torch.randint(0, len(WORDS), (8,), generator=g)) for _ in range(n)]
        (folder / f"{split}.txt").write_text("\n".join(lines) + "\n")
    return {"name": name, "root": str(root)}


def config(root, **model):
    return {"task": {"name": "lm", "batch_size": 4, "tgt_len": 8},
            "data": {"dataset": write_corpus(root)},
            "model": {"d_model": 16, "n_heads": 2, "d_ff": 32, "n_layers": 2, "mem_len": 8, "dropout": 0.0, **model},
            "eval": {"tgt_len": 6, "mem_len": 12, "clamp_len": 10, "batch_size": 2}}


def test_lm_trains_with_memory_evaluates_and_generates(tmp_path, train):
    task = build_task(config(tmp_path))
    with torch.no_grad():
        before = task.evaluate(task.build_model().eval(), "valid")
    trainer, _ = train(task, 20, lr=1e-2)
    after = trainer.evaluate("valid")
    vocab = len(task.vocab)
    assert math.isclose(after["ppl"], math.exp(after["loss"]), rel_tol=1e-6)
    assert after["ppl"] < before["ppl"] and after["ppl"] < vocab   # learned something beyond uniform
    model = trainer.model
    assert model.mem_len == 8                                       # eval settings were restored
    assert all(l.self_attn.position.clamp_len is None for l in model.layers)
    words = task.generate(model, ["the", "cat"], max_new=5)
    assert len(words) == 5 and all(isinstance(w, str) for w in words)


def test_memory_is_carried_between_training_segments(tmp_path):
    task = build_task(config(tmp_path))
    model = task.build_model()
    batches = list(task.train_batches(0))
    assert batches[0]["reset"] and not batches[1]["reset"]
    # consecutive segments continue each row of the stream
    assert torch.equal(batches[0]["target"][:, -1], batches[1]["input"][:, 0])
    task.loss(model, batches[0])
    assert task._mems is not None and task._mems[0].shape == (4, 8, 16)


def test_a_resumed_run_goes_on_with_the_memory_an_uninterrupted_one_has(tmp_path):
    """Checkpoints keep the Transformer-XL memory: a run killed after a checkpoint taken mid-epoch and resumed
    ends with the weights and records of the run that was not (each epoch has 5 segments; the checkpoint falls
    after the third)."""
    import json

    from kernel_attention.training import TrainConfig, Trainer, load_checkpoint

    tasks = {name: config(tmp_path / name) for name in ("full", "part")}

    def run(name, **kw):
        cfg = TrainConfig(max_steps=8, lr=1e-2, eval_every=4, checkpoint_every=3, log_every=2, progress=False,
                          seed=1, **kw)
        return Trainer(build_task(tasks[name]), cfg, tmp_path / name / "run").fit()

    run("full")
    run("part", stop_after=5)
    assert load_checkpoint(tmp_path / "part" / "run" / "last.pt")["task_state"][0]["mems"][0].shape == (4, 8, 16)
    run("part")
    a, b = (load_checkpoint(tmp_path / name / "run" / "last.pt")["model"] for name in ("full", "part"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    logs = [[{k: v for k, v in json.loads(line).items() if k not in ("wall_s", "steps_per_s", "tokens_per_s")}
             for line in (tmp_path / name / "run" / "metrics.jsonl").read_text().splitlines()]
            for name in ("full", "part")]
    assert logs[0] == logs[1]


def test_lm_bad_configs(tmp_path):
    with pytest.raises(SpecError, match="needs data.dataset"):
        build_task({"task": "lm"})
    with pytest.raises(SpecError, match="is a graph dataset; accepted: wikitext-103, wikitext-2"):
        build_task({"task": "lm", "data": {"dataset": "cora"}})
    with pytest.raises(MissingDataError):
        build_task({"task": "lm", "data": {"dataset": {"name": "wikitext-2", "root": str(tmp_path)}}}).build_model()
    too_wide = config(tmp_path / "wide")
    too_wide["eval"]["batch_size"] = 200                  # the valid split holds 90 tokens: not 200 rows of two
    with pytest.raises(SpecError, match="the valid split holds 90 tokens, too few for 200 rows"):
        build_task(too_wide).prepare_data()
