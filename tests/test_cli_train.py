"""The train / evaluate / translate / generate commands end to end, and bad configs failing before training."""

import json
from pathlib import Path

import pytest
import yaml

from kernel_attention.cli import main

ROOT = Path(__file__).resolve().parents[1]

SYNTH = {
    "task": {"name": "synthetic", "kind": "copy", "vocab": 5, "min_len": 2, "max_len": 3, "batch_size": 16,
             "train_size": 16 * 8, "valid_size": 8, "test_size": 8},
    "model": {"d_model": 16, "n_heads": 2, "d_ff": 16, "enc_layers": 1, "dec_layers": 1, "dropout": 0.0},
    "train": {"max_steps": 8, "lr": 0.01, "progress": False},
}


def write(tmp_path, cfg, name="cfg.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_train_evaluate_translate_synthetic(tmp_path, capsys):
    cfg = write(tmp_path, SYNTH)
    run_dir = tmp_path / "run"
    assert main(["train", cfg, "model.encoder_attention.kernel=rbf", "--run-dir", str(run_dir)]) == 0
    assert (run_dir / "last.pt").is_file() and (run_dir / "config.yaml").is_file()
    stored = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert stored["model"]["encoder_attention"] == {"kernel": "rbf"}
    out, err = capsys.readouterr()
    assert json.loads(out)["step"] == 8 and f"run directory: {run_dir}" in err     # stdout is the JSON alone
    assert main(["evaluate", str(run_dir), "eval.beam=2", "--split", "valid"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["split"] == "valid" and 0.0 <= out["exact_match"] <= 1.0
    src = tmp_path / "in.txt"
    src.write_text("3 4 5\n6 7\n")
    assert main(["translate", str(run_dir / "last.pt"), "--input", str(src)]) == 0
    lines = capsys.readouterr().out.split("\n")[:-1]       # a line may be empty (an immediate <eos>)
    assert len(lines) == 2 and all(t.isdigit() for t in " ".join(lines).split())
    src.write_text("3 9\n")                                    # 9 is not a symbol of this run
    assert main(["translate", str(run_dir / "last.pt"), "--input", str(src)]) == 2
    assert "symbol ids must be in [3, 7]" in capsys.readouterr().err
    src.write_bytes(b"3 4\n5 \xff 6\n")                        # not UTF-8: its line named, no traceback
    assert main(["translate", str(run_dir / "last.pt"), "--input", str(src)]) == 2
    assert f"{src}:2: cannot decode as utf-8" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:                       # beam 0 is refused, not taken as "not given"
        main(["translate", str(run_dir / "last.pt"), "--input", str(src), "--beam", "0"])
    assert e.value.code == 2 and "--beam: must be an integer >= 1 (beam width)" in capsys.readouterr().err


def test_translate_reads_stdin_as_bytes_and_names_a_line_that_is_not_utf8(tmp_path, capsys, monkeypatch):
    import io
    cfg = write(tmp_path, SYNTH)
    assert main(["train", cfg, "train.max_steps=1", "--run-dir", str(tmp_path / "run")]) == 0
    capsys.readouterr()

    class Stdin:
        buffer = io.BytesIO(b"3 4\r\n5 \xff\n")
    monkeypatch.setattr("sys.stdin", Stdin)
    assert main(["translate", str(tmp_path / "run"), "--input", "-"]) == 2
    assert "<stdin>:2: cannot decode as utf-8" in capsys.readouterr().err


def test_train_and_generate_lm(tmp_path, capsys):
    folder = tmp_path / "wikitext-2"
    folder.mkdir()
    for split in ("train", "valid", "test"):
        (folder / f"{split}.txt").write_text("the cat sat on the mat\nthe dog sat on the log\n" * 6)
    cfg = write(tmp_path, {
        "task": {"name": "lm", "batch_size": 2, "tgt_len": 6},
        "data": {"dataset": {"name": "wikitext-2", "root": str(tmp_path)}},
        "model": {"d_model": 16, "n_heads": 2, "d_ff": 16, "n_layers": 1, "mem_len": 6},
        "train": {"max_steps": 4, "progress": False}})
    assert main(["train", cfg, "--run-dir", str(tmp_path / "lm")]) == 0
    capsys.readouterr()
    assert main(["generate", str(tmp_path / "lm" / "last.pt"), "--prompt", "the cat", "--max-new", "3"]) == 0
    words = capsys.readouterr().out.split()
    assert words[:2] == ["the", "cat"] and len(words) == 5
    for bad, message in ((["--max-new", "-2"], "--max-new: must be an integer >= 1"),
                         (["--temperature", "-1"], "--temperature: must be a number >= 0 (0: greedy), got '-1'")):
        with pytest.raises(SystemExit) as e:
            main(["generate", str(tmp_path / "lm"), "--prompt", "the", *bad])
        assert e.value.code == 2 and message in capsys.readouterr().err
    assert main(["generate", str(tmp_path / "lm"), "--prompt", "the \udcff"]) == 2  # argv bytes not UTF-8
    assert "--prompt is not valid UTF-8" in capsys.readouterr().err


def test_a_warning_reads_as_one_line_of_the_cli(monkeypatch):
    import warnings

    import kernel_attention.cli.generate as generate
    shown = {}

    def run(args):
        shown["text"] = warnings.formatwarning("precision 'fp16' needs CUDA", UserWarning, "loop.py", 3)
        return 0

    monkeypatch.setattr(generate, "run", run)
    assert main(["generate", "RUN", "--prompt", "the"]) == 0
    assert shown["text"] == "kernel-attention: warning: precision 'fp16' needs CUDA\n"
    assert "loop.py" in warnings.formatwarning("x", UserWarning, "loop.py", 3)   # Python's own again afterwards


def test_generate_prints_line_ends_as_new_lines():
    from kernel_attention.cli.generate import as_text

    assert as_text(["the", "mat", "<eos>", "<eos>", "a", "<eos>x"]) == "the mat\n\na <eos>x"
    assert as_text(["the", "<eos>"]) == "the\n"


@pytest.mark.parametrize("override, message", [
    (["model.encoder_attention.kernel=gaussian"], "unknown kernel 'gaussian'; accepted"),
    (["model.decoder_attention.position=xl", "model.decoder_attention.value_position=relative"],
     "value_position='relative' is Shaw's a\\^V table and needs position='shaw'"),
    (["model.cross_attention.positon=shaw"], "unknown attention option.*positon"),
    (["model.decoder_attention.filter=padding&local:window=2"],
     "decoder_attention \\(C\\): filter 'padding&local:window=2' reads a batch's padding mask, which the model"),
    (["task.kind=palindrome"], "kind.*not one of"),
    (["train.optimiser=sgd"], "unknown train option.*optimiser"),
    (["train.schedule=warmup_linear"], "unknown schedule 'warmup_linear'"),
    (["modle.d_model=8"], "unknown config section 'modle'"),
    (["task={name: lm}", "model={}", "data.dataset.name=wikitext-2", "data.dataset.root=/nonexistent"],
     "missing dataset folder"),
])
def test_bad_configs_fail_before_training(tmp_path, capsys, override, message):
    cfg = write(tmp_path, SYNTH)
    run_dir = tmp_path / "never"
    assert main(["train", cfg, *override, "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert "bad config" in err
    import re
    assert re.search(message, err), err
    assert not run_dir.exists()                     # nothing was written: no training started


def test_missing_config_file_and_checkpoint(tmp_path, capsys):
    assert main(["train", str(tmp_path / "nope.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["evaluate", str(tmp_path / "nope.pt")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_shipped_configs_are_valid(capsys):
    """Every YAML under configs/ passes the up-front checks (names, combinations), data files aside."""
    from kernel_attention.config import load_config
    from kernel_attention.tasks import TASKS, build_task
    from kernel_attention.tasks.runner import train_config

    paths = sorted((ROOT / "configs").rglob("*.yaml"))
    assert paths, "no configs shipped"
    for path in paths:
        cfg = load_config(path)
        train_config(cfg)
        TASKS.validate(cfg["task"])
        if cfg["task"]["name"] != "synthetic":   # synthetic tasks draw their data on construction: skip
            build_task(cfg)                      # (loads no data: datasets are read lazily)
        _check_model_attention(cfg)


def _check_model_attention(cfg):
    """Validate the model section (names, attention configs) without data: sizes are placeholders."""
    from kernel_attention.models import MODELS
    ctx = {"src_vocab": 11, "tgt_vocab": 11, "vocab": 11, "n_classes": 2, "in_features": 3}
    from kernel_attention.tasks.runner import build_checked
    model = dict(cfg.get("model") or {})
    # tiny sizes: the checks concern names and combinations, not widths (keeps this test fast)
    for key, small in (("d_model", 16), ("d_ff", 16), ("n_layers", 1), ("enc_layers", 1), ("dec_layers", 1),
                       ("hidden", 2)):
        if key in model:
            model[key] = small
    if "n_heads" in model:
        model["n_heads"] = 2 if model["n_heads"] not in (4, 8) else model["n_heads"]
    model.pop("d_head", None)
    if model.get("adaptive"):  # the vocabulary past the adaptive soft-max's last cutoff
        ctx["vocab"] = model["adaptive"]["cutoffs"][-1] + 1
    name = model.pop("name", {"lm": "lm", "translation": "translation", "classification": "classifier",
                              "regression": "regressor", "node_classification": "node_classifier",
                              "synthetic": "translation"}[cfg["task"]["name"]])
    build_checked(lambda: MODELS.create({"name": name, **model}, **ctx))


def test_ika_table4_configs_drop_what_the_official_code_drops():
    """IKA's regression code (reference notes 2.2, 2.6) applies its att_dropout (0.1) to the implicit kernels'
    magnitude logits only; the dropout on the attention weights, like the residual one, is ENC_DROPOUT (0.0),
    for the dot-product Transformer too."""
    from kernel_attention.nn.attention import KernelAttention
    from kernel_attention.config import load_config
    from kernel_attention.models import MODELS

    paths = sorted((ROOT / "configs" / "implicit_kernel_attention" / "table4").glob("*.yaml"))
    paths = [p for p in paths if "_gp_" not in p.name]  # the GP rows have no attention
    assert len(paths) == 15
    for path in paths:
        model = dict(load_config(path)["model"])
        net = MODELS.create({**model, "name": model.pop("name")}, in_features=3)
        (att,) = [m for m in net.modules() if isinstance(m, KernelAttention)]
        assert att.dropout == 0.0 and model["dropout"] == 0.0, path.name
        implicit = "transformer" not in path.name
        assert getattr(att.kernel, "magnitude_dropout", 0.0) == (0.1 if implicit else 0.0), path.name


def test_an_interrupted_train_says_so_without_a_traceback_and_the_same_command_resumes(tmp_path, capsys, monkeypatch):
    """Ctrl-C (KeyboardInterrupt) in the middle of training: exit status 130, one line naming the command and how
    to go on, no traceback; the same command line then finishes the run from its last.pt."""
    from kernel_attention.training.loop import Trainer

    cfg = write(tmp_path, SYNTH)
    args = ["train", cfg, "--run-dir", str(tmp_path / "run"), "train.checkpoint_every=2"]
    update = Trainer._update

    def interrupted(self, group):
        if self.step == 5:
            raise KeyboardInterrupt
        return update(self, group)

    monkeypatch.setattr(Trainer, "_update", interrupted)
    assert main(args) == 130
    err = capsys.readouterr().err
    assert ("kernel-attention train: interrupted (the same command runs it again, from its last checkpoint if one "
            "was written)") in err
    assert "Traceback" not in err
    made = []

    def counted(self, group):
        made.append(self.step)
        return update(self, group)

    monkeypatch.setattr(Trainer, "_update", counted)
    assert main(args) == 0
    assert made == [4, 5, 6, 7]  # from last.pt at step 4, not from the start
    steps = [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == 8 and steps == sorted(steps)


@pytest.mark.parametrize("signame,status", [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_first_ctrl_c_or_sigterm_stops_at_the_next_logged_step_with_last_pt_written_there(
        tmp_path, capsys, monkeypatch, signame, status):
    """SIGINT (Ctrl-C) or SIGTERM (a scheduler's) during step 6 with train.log_every=2: the run logs step 6, writes
    last.pt there and exits 128 + the signal's number; the same command resumes at step 6 (no update lost) and
    ends where an uninterrupted run ends."""
    import signal

    import torch

    from kernel_attention.training.loop import Trainer

    signum = getattr(signal, signame)
    default = signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
    cfg = write(tmp_path, {**SYNTH, "train": {**SYNTH["train"], "max_steps": 10, "log_every": 2,
                                              "checkpoint_every": 0}})
    update = Trainer._update
    made = []

    def update_with_a_signal_at_step_5(self, group):
        made.append(self.step)
        if self.step == 5 and len(made) == 6:
            # the trainer's handler must be in place: Python's default for SIGTERM would end the test process
            assert signal.getsignal(signum) is not default, f"no handler for {signame} while training"
            signal.raise_signal(signum)  # the handler notes it; the update goes on
        return update(self, group)

    monkeypatch.setattr(Trainer, "_update", update_with_a_signal_at_step_5)
    # Python's own handler, as in a terminal (a shell starts background jobs with SIGINT ignored; so does nohup)
    before = signal.signal(signum, default)
    args = ["train", cfg, "--run-dir", str(tmp_path / "run")]
    try:
        assert main(args) == status
        assert signal.getsignal(signum) is default  # put back
    finally:
        signal.signal(signum, before)
    err = capsys.readouterr().err
    assert "training stops at its next logged step" in err and "Traceback" not in err
    assert "kernel-attention train: interrupted: stopped after step 6, last.pt written there" in err
    made.clear()
    assert main(args) == 0
    assert made == [6, 7, 8, 9]
    assert main(["train", cfg, "--run-dir", str(tmp_path / "straight")]) == 0

    def weights(run):
        return torch.load(tmp_path / run / "last.pt", weights_only=True)["model"]

    a, b = weights("run"), weights("straight")
    assert all(torch.equal(a[k], b[k]) for k in a)
