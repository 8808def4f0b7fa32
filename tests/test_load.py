"""``kernel_attention.load(RUN)`` and ``RUN/model.safetensors``: a trained run back in Python without its
training data, from a checkpoint or from the safetensors file alone."""

import shutil

import torch

import kernel_attention as ka
from kernel_attention.cli import main
from tests.test_travel import train_lm, train_mt


def test_load_lm_run_from_checkpoint_and_safetensors(tmp_path):
    corpus, run = train_lm(tmp_path)
    assert (run / "model.safetensors").is_file()            # written when the run finished
    shutil.rmtree(corpus)
    model, vocab = ka.load(run)
    assert not model.training and next(model.parameters()).device.type == "cpu"
    assert vocab.itos[:2] == ["<unk>", "<eos>"]
    loaded = ka.load(run)
    assert loaded.path.name in ("best.pt", "last.pt") and loaded.config["task"]["name"] == "lm"
    assert loaded.task.generate(loaded.model, ["the", "cat"], 2)
    for name in ("best.pt", "last.pt"):
        (run / name).unlink(missing_ok=True)
    from_st = ka.load(run)                                  # only model.safetensors is left
    assert from_st.path.name == "model.safetensors"
    a, b = loaded.model.state_dict(), from_st.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    x = torch.tensor([[vocab["the"], vocab["cat"]]])
    assert torch.equal(loaded.model(x)[0], from_st.model(x)[0])


def test_load_translation_and_export_command(tmp_path, capsys):
    pairs, run = train_mt(tmp_path, steps=2)
    shutil.rmtree(pairs)
    (run / "model.safetensors").unlink()
    capsys.readouterr()
    assert main(["export", str(run)]) == 0
    assert capsys.readouterr().out.strip().endswith("model.safetensors")
    full = ka.load(run)
    st = ka.load(run / "model.safetensors", overrides={"eval": {"beam": 1}})
    assert full.bpe is not None and full.vocab is full.tokenizer.tgt_vocab
    lines = ["it is the cat"]
    assert st.task.translate_lines(st.model, lines) == full.task.translate_lines(full.model, lines)
    a, b = full.model.state_dict(), st.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert main(["export", str(tmp_path / "nothing")]) == 2
    assert "cannot export" in capsys.readouterr().err

    alone = tmp_path / "alone"   # the safetensors file copied alone: its vocabulary and BPE from its metadata
    alone.mkdir()
    shutil.copy(run / "model.safetensors", alone)
    moved = ka.load(alone / "model.safetensors")
    assert sorted(p.name for p in alone.iterdir()) == ["model.safetensors"]
    assert moved.task.translate_lines(moved.model, lines) == full.task.translate_lines(full.model, lines)


def test_overrides_change_the_key_they_name_and_no_other(tmp_path, capsys):
    from kernel_attention.tasks.runner import merge_overrides

    stored = {"model": {"d_model": 16, "encoder_attention": {"kernel": "rbf", "position": "shaw"}}, "eval": {"beam": 4}}
    assert merge_overrides(stored, {"model": {"encoder_attention": {"position": "xl"}}, "eval": {"beam": 1}}) == {
        "model": {"d_model": 16, "encoder_attention": {"kernel": "rbf", "position": "xl"}}, "eval": {"beam": 1}}
    _, run = train_mt(tmp_path, steps=1)
    capsys.readouterr()
    assert main(["evaluate", str(run), "foo.bar=3"]) == 2
    assert "unknown config section 'foo'" in capsys.readouterr().err
    assert main(["evaluate", str(run), "--split", "valid", "--test-src", "a", "--test-tgt", "b"]) == 2
    assert "--split valid reads the dataset's split" in capsys.readouterr().err


def test_an_export_or_average_written_to_another_folder_loads_there(tmp_path, capsys):
    """--out outside the run directory: the vocabulary and BPE files go with the file, which then loads, evaluates
    and translates there (the run directory and the data removed); the export's mode follows the umask."""
    import os
    import stat

    pairs, run = train_mt(tmp_path, steps=2)
    shutil.rmtree(pairs)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert main(["export", str(run), "--out", str(elsewhere / "mt.safetensors")]) == 0
    assert main(["average", str(run / "last.pt"), "--out", str(elsewhere / "average.pt")]) == 0
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE((elsewhere / "mt.safetensors").stat().st_mode) == 0o666 & ~umask
    other = tmp_path / "other"
    other.mkdir()
    (other / "bpe.json").write_text("{}")                 # another run's file of the same name: refused, unwritten
    assert main(["export", str(run), "--out", str(other / "mt.safetensors")]) == 2
    assert "is another run's" in capsys.readouterr().err and not (other / "mt.safetensors").exists()
    before = ka.load(run)
    shutil.rmtree(run)
    (tmp_path / "in.en").write_text("it is the cat\n")
    for name in ("mt.safetensors", "average.pt"):
        loaded = ka.load(elsewhere / name)
        a, b = before.model.state_dict(), loaded.model.state_dict()   # one checkpoint averaged: its weights
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
        assert loaded.tokenizer.src_bpe.encode_batch(["it is the cat"]) == before.tokenizer.src_bpe.encode_batch(
            ["it is the cat"])
        capsys.readouterr()
        assert main(["translate", str(elsewhere / name), "--input", str(tmp_path / "in.en")]) == 0
        assert capsys.readouterr().out.strip()
