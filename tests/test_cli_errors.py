"""Every bad input to the command line answered with exit status 2 and one line naming what was wrong and
what is accepted (or how to go on), never a traceback; and the command line as people type it: options and
key=value overrides in any order, --threads, the config keys in --help, progress lines in a log."""

import errno
import json
import re

import pytest
import torch
import yaml

from kernel_attention.cli import main

SYNTH = {
    "task": {"name": "synthetic", "kind": "copy", "vocab": 5, "min_len": 2, "max_len": 3, "batch_size": 16,
             "train_size": 16 * 2, "valid_size": 8, "test_size": 8},
    "model": {"d_model": 16, "n_heads": 2, "d_ff": 16, "enc_layers": 1, "dec_layers": 1, "dropout": 0.0},
    "train": {"max_steps": 2, "lr": 0.01, "progress": False},
}


def write(tmp_path, cfg, name="cfg.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture
def trained(tmp_path, capsys):
    """A config and a finished 2-step run directory of it."""
    cfg = write(tmp_path, SYNTH)
    run_dir = tmp_path / "run"
    assert main(["train", cfg, "--run-dir", str(run_dir)]) == 0
    capsys.readouterr()
    return cfg, run_dir


# -- 1. --check validates the train / data sections ----------------------------------------------------
@pytest.mark.parametrize("override, message", [
    ("train.max_steps=abc", "train.max_steps must be an integer >= 1 (or null), got 'abc'"),
    ("train.log_every=0", "train.log_every must be an integer >= 1, got 0"),
    ("train.lr=nan", "train.lr must be a finite number > 0, got 'nan'"),
    ("train.lr=.nan", "train.lr must be a finite number > 0, got nan"),
    ("train.lr=-1", "train.lr must be a finite number > 0, got -1"),
    ("train.max_steps=-5", "train.max_steps must be an integer >= 1 (or null), got -5"),
    ("train.clip_norm=-1", "train.clip_norm must be a finite number >= 0 (0 = no clipping), got -1"),
    ("train.eval_every=-1", "train.eval_every must be an integer >= 0 (0 = only at the end), got -1"),
    ("train.compile=yes please", "train.compile must be true or false, got 'yes please'"),
    ("data.bogus=1", "unknown data option(s) bogus; accepted: dataset, root"),
    ("eval.beam=0", "eval.beam must be an integer >= 1 (1 = greedy), got 0"),
    ("eval.len_penalty=.nan", "eval.len_penalty must be a finite number, got nan"),
    ("eval.max_extra=x", "eval.max_extra must be an integer >= 0, got 'x'"),
    ("train.device=tpu", "train.device must be a device name such as cpu, cuda or cuda:0 (or null), got 'tpu'"),
    ("train.device=cuda:x", "got 'cuda:x'"),
    ("run.foo=1", "unknown run option(s) foo; accepted: name, dir"),
    ("seed=1.5", "seed must be an integer, got 1.5"),
    ("seed=abc", "seed must be an integer, got 'abc'"),
    ("study.x=1", "unknown config section 'study'; accepted: run, seed, task, data, model, train, eval"),
])
def test_check_rejects_bad_train_eval_and_data_values(tmp_path, capsys, override, message):
    assert main(["train", write(tmp_path, SYNTH), override, "--check"]) == 2
    assert message in one_line(capsys.readouterr().err)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has a CUDA device")
def test_a_cuda_device_on_a_machine_without_one_exits_2(tmp_path, capsys):
    assert main(["train", write(tmp_path, SYNTH), "train.device=cuda", "--run-dir", str(tmp_path / "run")]) == 2
    assert "train.device='cuda': this machine has no CUDA device" in one_line(capsys.readouterr().err)


def test_data_root_is_the_root_the_dataset_is_read_from(tmp_path, capsys):
    folder = tmp_path / "copy" / "wikitext-2"
    folder.mkdir(parents=True)
    for split in ("train", "valid", "test"):
        (folder / f"{split}.txt").write_text("the cat sat on the mat\n" * 4)
    cfg = write(tmp_path, {"task": {"name": "lm", "batch_size": 2, "tgt_len": 4}, "data": {"dataset": "wikitext-2"},
                           "model": {"d_model": 16, "n_heads": 2, "d_ff": 16, "n_layers": 1}, "train": {"max_steps": 1}})
    assert main(["train", cfg, f"data.root={tmp_path / 'copy'}", "--check"]) == 0
    assert main(["train", cfg, f"data.root={tmp_path / 'elsewhere'}", "--check"]) == 2
    assert str(tmp_path / "elsewhere") in one_line(capsys.readouterr().err)


def test_a_self_referencing_yaml_exits_2(tmp_path, capsys):
    path = tmp_path / "loop.yaml"
    path.write_text("task: &t\n  name: synthetic\n  again: *t\ntrain: {max_steps: 1}\n")
    assert main(["train", str(path), "--check"]) == 2
    assert "refers to itself" in one_line(capsys.readouterr().err)


# -- 2. checkpoints and resume ------------------------------------------------------------------------
@pytest.mark.parametrize("damage", ["truncated", "random", "empty"])
def test_a_damaged_last_pt_says_so_and_how_to_start_over(trained, capsys, damage):
    cfg, run_dir = trained
    last = run_dir / "last.pt"
    data = last.read_bytes()
    last.write_bytes({"truncated": data[: len(data) // 2], "random": bytes(range(256)) * 8, "empty": b""}[damage])
    assert main(["train", cfg, "--run-dir", str(run_dir)]) == 2
    line = one_line(capsys.readouterr().err)
    assert "last.pt" in line and ("damaged" in line or "empty" in line) and "--no-resume" in line
    assert main(["train", cfg, "--run-dir", str(run_dir), "--no-resume"]) == 0       # the way out works


def test_a_refused_pickle_in_last_pt_exits_2(trained, capsys):
    import argparse
    cfg, run_dir = trained
    torch.save({"format": "kernel-attention-checkpoint", "x": argparse.Namespace(a=1)}, run_dir / "last.pt")
    assert main(["train", cfg, "--run-dir", str(run_dir)]) == 2
    line = one_line(capsys.readouterr().err)
    assert "refused because loading them could run code" in line and "--no-resume" in line
    assert main(["evaluate", str(run_dir / "last.pt")]) == 2
    assert "refused" in one_line(capsys.readouterr().err)


def test_a_checkpoint_of_another_model_is_named_as_such(trained, capsys):
    cfg, run_dir = trained
    assert main(["train", cfg, "model.d_model=32", "--run-dir", str(run_dir), "--allow-config-change"]) == 2
    line = one_line(capsys.readouterr().err)
    assert "was written by a different model than this config builds" in line and "another shape" in line
    assert "--no-resume" in line


def test_a_resume_with_another_config_names_the_keys_and_needs_a_flag(trained, capsys):
    cfg, run_dir = trained
    assert main(["train", cfg, "train.lr=0.5", "train.max_steps=3", "train.checkpoint_minutes=1",
                 "--run-dir", str(run_dir)]) == 2
    line = one_line(capsys.readouterr().err)
    assert "train.lr: 0.01 -> 0.5" in line and "train.max_steps: 2 -> 3" in line and "--allow-config-change" in line
    assert "checkpoint_minutes" not in line                    # how often to save is not another run
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["train"]["lr"] == 0.01   # left as it was
    assert main(["train", cfg, "train.lr=0.5", "train.max_steps=3", "--run-dir", str(run_dir),
                 "--allow-config-change"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out.rsplit("run directory", 1)[0])["step"] == 3
    assert f"resuming {run_dir} at step 2 from last.pt" in err
    assert "--allow-config-change" in _help(["train"], capsys)


def test_a_resume_that_writes_out_a_default_is_the_same_run(trained, capsys):
    """A key set to the value its section gives when it is left out (train.weight_decay, train.seed, the model's
    attention_dropout, the top-level seed) is no change; a change names the old value the run trained with."""
    cfg, run_dir = trained
    from kernel_attention.training import TrainConfig
    wd = TrainConfig(max_steps=1).weight_decay
    assert main(["train", cfg, f"train.weight_decay={wd}", "train.seed=0", "seed=0", "model.attention_dropout=0.0",
                 "model.name=translation", "--run-dir", str(run_dir)]) == 0
    capsys.readouterr()
    assert main(["train", cfg, "train.weight_decay=0.5", "--run-dir", str(run_dir)]) == 2
    assert f"train.weight_decay: {wd!r} -> 0.5" in one_line(capsys.readouterr().err)


def test_a_spec_written_another_way_or_data_moved_elsewhere_is_the_same_run():
    from kernel_attention.tasks.resume_check import changed_keys

    def lm(**attention):
        return {"task": {"name": "lm"}, "model": {"d_model": 16, "attention": attention}}

    same = lm(kernel={"name": "poly", "degree": 2}, position={"name": "xl"}, filter="causal & local:window=4")
    assert changed_keys(lm(kernel="poly", position="xl", filter="causal&local:window=4"), same) == []
    moved = {"task": {"name": "lm"}, "data": {"dataset": {"name": "text", "path": "/elsewhere/corpus"}}}
    assert changed_keys({"task": {"name": "lm"}, "data": {"dataset": "text:path=corpus"}}, moved) == []
    assert changed_keys({"task": {"name": "lm"}, "data": {"dataset": "text:path=corpus,min_freq=2"}}, moved) == [
        ("data.dataset.min_freq", "2", None)]
    assert changed_keys(lm(kernel="poly"), lm(kernel="poly:degree=3", position="none")) == [
        ("model.attention.kernel.degree", 2, 3), ("model.attention.position.name", None, "none")]


def test_a_full_disk_says_no_space_left_on_device(tmp_path, capsys, monkeypatch):
    import kernel_attention.training.checkpoint as checkpoint

    def full(obj, f, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", str(f))

    monkeypatch.setattr(checkpoint.torch, "save", full)
    assert main(["train", write(tmp_path, SYNTH), "--run-dir", str(tmp_path / "run")]) == 2
    line = one_line(capsys.readouterr().err)
    assert "No space left on device" in line and "cannot write checkpoint" in line


# -- 3. data files reach the user as one line ---------------------------------------------------------
def test_a_uci_file_with_nan_exits_2_naming_file_and_line(tmp_path, capsys):
    d = tmp_path / "uci-regression" / "concrete"
    d.mkdir(parents=True)
    (d / "data.txt").write_text("1 2 3\n4 nan 6\n7 8 9\n")
    (d / "index_features.txt").write_text("0\n1\n")
    (d / "index_target.txt").write_text("2\n")
    (d / "n_splits.txt").write_text("1\n")
    (d / "index_train_0.txt").write_text("0\n1\n")
    (d / "index_test_0.txt").write_text("2\n")
    cfg = write(tmp_path, {"task": {"name": "regression", "n_splits": 2},
                           "data": {"dataset": "concrete", "root": str(tmp_path)},
                           "model": {"name": "regressor", "d_model": 8, "n_heads": 2}, "train": {"max_steps": 1}})
    assert main(["train", cfg, "--check"]) == 2
    line = one_line(capsys.readouterr().err)
    assert f"{d / 'data.txt'}:2:" in line and "'nan'" in line


class _Evil:
    def __reduce__(self):
        return (print, ("unpickled",))


@pytest.mark.parametrize("graph, message", [
    (_Evil(), "bad data file: .*ind.cora.graph: refusing to load (__builtin__|builtins).print from a pickle"),
    ({0: 5}, "bad data file: .*ind.cora.graph: node 0: expected integer node ids"),
])
def test_a_refused_or_malformed_planetoid_file_exits_2(tmp_path, capsys, graph, message):
    import pickle

    import numpy as np
    d = tmp_path / "planetoid"
    d.mkdir()
    eye = np.eye(2)
    parts = {"x": np.ones((1, 3)), "y": eye[:1], "tx": np.ones((1, 3)), "ty": eye[:1], "allx": np.ones((2, 3)),
             "ally": eye, "graph": graph}
    for part, obj in parts.items():
        (d / f"ind.cora.{part}").write_bytes(pickle.dumps(obj, protocol=2))
    (d / "ind.cora.test.index").write_text("2\n")
    cfg = write(tmp_path, {"task": {"name": "node_classification"}, "data": {"dataset": "cora", "root": str(tmp_path)},
                           "model": {"hidden": 2, "heads": 1}, "train": {"max_steps": 1}})
    assert main(["train", cfg, "--check"]) == 2
    assert re.search(message, one_line(capsys.readouterr().err))


# -- 4. the command line as people use it -------------------------------------------------------------
def test_overrides_may_follow_the_options(trained, capsys):
    cfg, run_dir = trained
    assert main(["evaluate", str(run_dir), "--split", "valid", "eval.beam=2"]) == 0
    assert json.loads(capsys.readouterr().out)["split"] == "valid"
    assert main(["evaluate", str(run_dir), "--split", "valid", "eval.bogus=2"]) == 2   # and are still checked
    assert "unknown eval option(s) bogus" in capsys.readouterr().err
    other = cfg.replace("cfg.yaml", "other")
    assert main(["train", cfg, "--run-dir", other, "train.max_steps=1", "--no-resume", "train.lr=0.02"]) == 0
    stored = yaml.safe_load(open(f"{other}/config.yaml"))["train"]
    assert stored["max_steps"] == 1 and stored["lr"] == 0.02
    with pytest.raises(SystemExit):
        main(["evaluate", str(run_dir), "--split", "valid", "stray"])          # not key=value: still an error
    assert "unrecognized arguments: stray" in capsys.readouterr().err


def _help(command, capsys):
    with pytest.raises(SystemExit):
        main([*command, "--help"])
    return capsys.readouterr().out


def test_help_lists_the_config_keys_and_threads(capsys):
    text = _help(["train"], capsys)
    for key in ("eval.batch_size", "eval.max_sentences", "train.progress", "train.log_every", "data.root",
                "--threads"):
        assert key in text, key
    assert "eval.max_sentences" in _help(["evaluate"], capsys)


def test_help_descriptions_are_whole_sentences(capsys):
    """A registry entry's description is its docstring's first paragraph, not its first source line: the
    periodic kernel's goes on to its formula, the local filter's to the end of its sentence."""
    text = _help([], capsys)
    assert not re.search(r"one factor per feature axis:\n", text)
    assert "sum_i sin^2" in text
    flat = " ".join(text.split())
    assert "(compose with causal for a one-sided window)" in flat
    assert "comes with the batch or is fixed at construction" in flat


def test_threads_sets_torch_intra_op_threads(tmp_path, monkeypatch, capsys):
    got = []
    monkeypatch.setattr(torch, "set_num_threads", got.append)
    assert main(["train", write(tmp_path, SYNTH), "--check", "--threads", "1"]) == 0
    assert got == [1]
    with pytest.raises(SystemExit):
        main(["train", write(tmp_path, SYNTH), "--check", "--threads", "0"])
    assert "must be an integer >= 1" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["run", "--steps", "0"], "--steps: must be an integer >= 1 (optimiser updates), got '0'"),
    (["run", "--steps", "-1"], "--steps: must be an integer >= 1"),
    (["run", "--jobs", "0"], "--jobs: must be an integer >= 1 (worker processes)"),
    (["run", "--test-size", "-5"], "--test-size: must be an integer >= 1 (test examples)"),
    (["study", "dissection-kernels", "--threads", "0"], "--threads: must be an integer >= 1"),
    (["bench", "--repeats", "0"], "--repeats: must be an integer >= 1"),
    (["bench", "--T", "0"], "--T: must be an integer >= 1 (sequence length)"),
    (["bench", "--no-dense-above", "-1"], "--no-dense-above: must be an integer >= 1 (a sequence length)"),
])
def test_counts_below_one_are_refused_before_any_work(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["run", "--out", "no/such/folder/t.md"], "--out no/such/folder/t.md: its folder does not exist"),
    (["bench", "--kernels", "gauss"], "--kernels gauss: unknown kernel 'gauss'; accepted: exp"),
    (["bench", "--positions", "rope"], "--positions rope: unknown position 'rope'"),
    (["bench", "--filters", "casual"], "--filters casual: unknown filter 'casual'"),
    (["bench", "--backends", "fastest"], "--backends fastest: unknown backend 'fastest'; accepted: banded"),
    (["bench", "--dtype", "float8"], "--dtype 'float8' is not a torch dtype"),
    (["bench", "--dtype", "int32"], "--dtype 'int32' is not a floating-point dtype"),
    (["bench", "--device", "tpu"], "--device tpu: "),
    (["bench", "--dropout", "1.5"], "--dropout must be a rate in [0, 1), got 1.5"),
    (["bench", "--dropout", "-1"], "--dropout must be a rate in [0, 1), got -1.0"),
    (["bench", "--timeout", "0"], "--timeout must be > 0 seconds, got 0.0"),
    pytest.param(["bench", "--device", "cuda"], "--device cuda: this machine's torch has no CUDA device",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here")),
])
def test_bad_names_and_paths_exit_2_before_any_work(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert message in one_line(capsys.readouterr().err)


def test_run_sets_the_threads_of_each_worker(monkeypatch, capsys):
    from kernel_attention.cli import run as run_command

    got = []
    monkeypatch.setattr(torch, "set_num_threads", got.append)
    cfg = run_command.config("copy", "exp", "none", True, steps=1, seed=0, test_size=4)
    run_command._one((("exp", "none"), cfg, 2))
    assert got == [2]
    assert "--threads N" in _help(["run"], capsys)
