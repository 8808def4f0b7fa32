"""Checkpoint averaging: step_<k>.pt snapshots kept by the trainer (``train.keep_last``), the mean of their
weights against a plain reference, and the ``average`` command end to end."""

import json

import pytest
import torch
import yaml

from _toy_task import ToyTask
from kernel_attention.cli import main
from kernel_attention.training import TrainConfig, Trainer, load_checkpoint
from kernel_attention.training.averaging import average_states, parameter_names, snapshots


def _cfg(**kw):
    base = dict(seed=1, max_steps=10, lr=3e-2, checkpoint_every=3, keep_last=2, progress=False)
    base.update(kw)
    return TrainConfig(**base)


def test_the_mean_of_the_parameters_and_the_newest_buffers():
    g = torch.Generator().manual_seed(0)
    states = [{"w": torch.randn(3, 2, generator=g), "b": torch.randn(2, generator=g).half(),
               "table": torch.full((2,), float(i)), "count": torch.tensor(i)} for i in range(3)]
    avg = average_states(states, ["w", "b"])
    torch.testing.assert_close(avg["w"], sum(s["w"] for s in states) / 3)
    assert avg["b"].dtype == torch.float16
    torch.testing.assert_close(avg["b"], (sum(s["b"].double() for s in states) / 3).half())
    assert torch.equal(avg["table"], states[-1]["table"]) and int(avg["count"]) == 2
    with pytest.raises(ValueError, match="count is torch.int64"):
        average_states(states, ["count"])
    with pytest.raises(ValueError, match="no checkpoints"):
        average_states([], ["w"])


def test_a_tied_weight_is_averaged_under_each_of_its_names():
    emb = torch.nn.Embedding(4, 3)
    model = torch.nn.ModuleDict({"emb": emb, "out": torch.nn.Linear(3, 4, bias=False)})
    model["out"].weight = emb.weight
    assert parameter_names(model) == ["emb.weight", "out.weight"]
    states = [{k: v.clone() + i for k, v in model.state_dict().items()} for i in range(2)]
    avg = average_states(states, parameter_names(model))
    model.load_state_dict(avg)  # loads both names into the one tensor: they must agree
    torch.testing.assert_close(model["out"].weight, states[0]["emb.weight"] + 0.5)


def test_the_trainer_keeps_the_newest_snapshots_and_a_resume_keeps_the_same(tmp_path):
    Trainer(ToyTask(), _cfg(), tmp_path / "full").fit()
    kept = snapshots(tmp_path / "full")
    assert [p.name for p in kept] == ["step_9.pt", "step_10.pt"]  # every 3 steps and the final one, newest 2
    last = load_checkpoint(tmp_path / "full" / "last.pt")
    snap = load_checkpoint(kept[-1])
    assert "optimizer" not in snap and "rng" not in snap and snap["step"] == 10
    assert all(torch.equal(snap["model"][k], last["model"][k]) for k in last["model"])

    Trainer(ToyTask(), _cfg(stop_after=7), tmp_path / "part").fit()
    assert [p.name for p in snapshots(tmp_path / "part")] == ["step_3.pt", "step_6.pt"]
    Trainer(ToyTask(), _cfg(), tmp_path / "part").fit()
    again = snapshots(tmp_path / "part")
    assert [p.name for p in again] == ["step_9.pt", "step_10.pt"]
    for a, b in zip(kept, again):
        x, y = load_checkpoint(a)["model"], load_checkpoint(b)["model"]
        assert all(torch.equal(x[k], y[k]) for k in x)


def test_a_run_started_over_does_not_keep_the_old_runs_snapshots(tmp_path):
    Trainer(ToyTask(), _cfg(), tmp_path / "run").fit()                          # snapshots 9 and 10
    Trainer(ToyTask(), _cfg(max_steps=8, lr=1e-2), tmp_path / "run", resume=False).fit()
    assert [p.name for p in snapshots(tmp_path / "run")] == ["step_6.pt", "step_8.pt"]
    assert load_checkpoint(tmp_path / "run" / "step_6.pt")["config"]["lr"] == 1e-2


def test_keep_last_needs_periodic_checkpoints():
    with pytest.raises(ValueError, match="train.keep_last=2 .* needs train.checkpoint_every > 0"):
        _cfg(checkpoint_every=0)
    with pytest.raises(ValueError, match="train.keep_last must be an integer >= 0"):
        _cfg(keep_last=-1)


SYNTH = {
    "task": {"name": "synthetic", "kind": "copy", "vocab": 5, "min_len": 2, "max_len": 3, "batch_size": 16,
             "train_size": 16 * 8, "valid_size": 8, "test_size": 8},
    "model": {"d_model": 16, "n_heads": 2, "d_ff": 16, "enc_layers": 1, "dec_layers": 1, "dropout": 0.0},
    "train": {"max_steps": 8, "lr": 0.01, "progress": False, "checkpoint_every": 2, "keep_last": 3},
}


def test_the_average_command_writes_a_checkpoint_that_evaluates(tmp_path, capsys):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(SYNTH))
    run = tmp_path / "run"
    assert main(["train", str(cfg), "--run-dir", str(run), "--threads", "1"]) == 0
    capsys.readouterr()
    assert main(["average", str(run)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == {"out": str(run / "average.pt"), "steps": [4, 6, 8]}
    avg = load_checkpoint(run / "average.pt")
    assert avg["averaged"] == [4, 6, 8] and "optimizer" not in avg
    models = [load_checkpoint(run / f"step_{k}.pt")["model"] for k in (4, 6, 8)]
    floats = [k for k, t in avg["model"].items() if t.is_floating_point()]
    assert any(k.endswith("bias") for k in floats)
    for name in floats:  # parameters are averaged; a float buffer is the same in every checkpoint, its own mean
        torch.testing.assert_close(avg["model"][name], sum(m[name] for m in models) / 3)
    assert main(["evaluate", str(run / "average.pt"), "--split", "valid"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["split"] == "valid"

    assert main(["average", str(run), "--last", "2", "--out", str(tmp_path / "two.pt")]) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == [6, 8]

    wider = tmp_path / "wider"  # a checkpoint of another model is named, not averaged in
    assert main(["train", str(cfg), "--run-dir", str(wider), "--threads", "1", "model.d_model=8",
                 "train.max_steps=2"]) == 0
    capsys.readouterr()
    assert main(["average", str(run / "step_8.pt"), str(wider / "step_2.pt")]) == 2
    assert "are checkpoints of two runs (model.d_model: 8 vs 16)" in capsys.readouterr().err
    rbf = tmp_path / "rbf"  # the same shapes, another kernel: weights that fit, of another run
    assert main(["train", str(cfg), "--run-dir", str(rbf), "--threads", "1", "train.max_steps=2",
                 "model.encoder_attention.kernel=rbf"]) == 0
    capsys.readouterr()
    assert main(["average", str(run / "step_8.pt"), str(rbf / "step_2.pt")]) == 2
    assert "checkpoints of two runs (model.encoder_attention.kernel" in capsys.readouterr().err
    assert main(["average", str(run / "step_8.pt"), str(run / "step_8.pt")]) == 2
    assert "are both step 8: the checkpoints of one run have distinct steps" in capsys.readouterr().err


def test_the_average_command_names_what_is_wrong(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["average", str(empty)]) == 2
    assert "holds no step_<k>.pt checkpoints" in capsys.readouterr().err
    assert main(["average", str(empty), "--last", "0"]) == 2
    assert "--last must be an integer >= 1, got 0" in capsys.readouterr().err
    assert main(["average", str(tmp_path / "missing.pt")]) == 2
    assert "does not exist" in capsys.readouterr().err
