"""Run directories that travel: the vocabulary / BPE are written into the run directory when a run starts,
and ``evaluate``, ``translate``, ``generate`` need no training data afterwards."""

import json
import shutil

import yaml

from kernel_attention.cli import main
from kernel_attention.data.bpe import detokenize
from kernel_attention.training.checkpoint import load_checkpoint, save_checkpoint

EN = ["the man is here", "it is the cat", "the dog is here", "it is a man", "the cat is here", "it is the dog"]
FR = ["l&apos; homme est ici", "c&apos; est le chat", "le chien est ici", "c&apos; est un homme",
      "le chat est ici", "c&apos; est le chien"]


def write_pairs(folder, n=36):
    folder.mkdir(parents=True)
    for split, k in (("train", n), ("valid", 6), ("test", 6)):
        (folder / f"{split}.en").write_text("\n".join(EN[i % 6] for i in range(k)) + "\n")
        (folder / f"{split}.fr").write_text("\n".join(FR[i % 6] for i in range(k)) + "\n")
    return folder


def train_mt(tmp_path, steps=8):
    pairs = write_pairs(tmp_path / "pairs")
    cfg = {"task": {"name": "translation", "max_tokens": 400, "bpe_vocab_size": 60, "label_smoothing": 0.0},
           "data": {"dataset": f"parallel:path={pairs},src=en,tgt=fr"},
           "model": {"d_model": 16, "n_heads": 2, "d_ff": 32, "enc_layers": 1, "dec_layers": 1, "dropout": 0.0,
                     "share_embeddings": True},
           "eval": {"beam": 1, "max_len_b": 4, "max_sentences": 2},
           "train": {"max_steps": steps, "lr": 0.02, "schedule": "constant", "progress": False, "test_best": False}}
    (tmp_path / "mt.yaml").write_text(yaml.safe_dump(cfg))
    run = tmp_path / "run"
    assert main(["train", str(tmp_path / "mt.yaml"), "--run-dir", str(run)]) == 0
    return pairs, run


def last_json(capsys):
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_translation_run_travels_without_its_data(tmp_path, capsys):
    pairs, run = train_mt(tmp_path)
    assert (run / "bpe.json").is_file() and (run / "vocab.json").is_file() and (run / "config.yaml").is_file()
    assert load_checkpoint(run / "last.pt")["extra"]["artifacts"]["files"] == {"bpe": "bpe.json", "vocab": "vocab.json"}
    new = tmp_path / "new"
    new.mkdir()
    (new / "test.en").write_text("the cat is here\nit is a man\n")
    (new / "test.fr").write_text("le chat est ici\nc&apos; est un homme\n")
    capsys.readouterr()
    assert main(["evaluate", str(run), "--test-src", str(new / "test.en"), "--test-tgt", str(new / "test.fr")]) == 0
    before = last_json(capsys)
    moved = tmp_path / "elsewhere"
    shutil.move(run, moved)                     # the run directory moves, the training data is deleted
    shutil.rmtree(pairs)
    assert main(["evaluate", str(moved), "--test-src", str(new / "test.en"), "--test-tgt", str(new / "test.fr")]) == 0
    out = last_json(capsys)
    assert out["split"] == "test" and out == before   # the same weights, BPE and vocabulary: the same numbers
    assert main(["evaluate", str(moved), "--split", "valid"]) == 2     # no data, no test files: a clear message
    assert "--test-src" in capsys.readouterr().err

    src = tmp_path / "in.en"
    src.write_text("it is the cat\nit is a man\n")
    assert main(["translate", str(moved), "--input", str(src)]) == 0
    raw = capsys.readouterr().out.splitlines()
    assert main(["translate", str(moved), "--input", str(src), "--detokenize"]) == 0
    plain = capsys.readouterr().out.splitlines()
    assert len(raw) == len(plain) == 2 and plain == [detokenize(r, "fr") for r in raw]
    assert "&apos;" in " ".join(raw) and "&apos;" not in " ".join(plain) and "c'est" in " ".join(plain)
    src.write_text("it is the cat\n\n  \nit is a man\n")    # a blank line is translated as an empty one
    assert main(["translate", str(moved), "--input", str(src)]) == 0
    assert capsys.readouterr().out.splitlines() == [raw[0], "", "", raw[1]]
    assert main(["translate", str(moved), "--input", str(tmp_path)]) == 2
    assert f"--input {tmp_path} is a folder" in capsys.readouterr().err


def test_old_run_falls_back_to_the_training_data(tmp_path, capsys):
    pairs, run = train_mt(tmp_path, steps=2)
    for name in ("last.pt", "best.pt"):
        if (run / name).is_file():
            ck = load_checkpoint(run / name)
            ck["extra"].pop("artifacts")
            save_checkpoint(run / name, ck)
    (run / "bpe.json").unlink()
    capsys.readouterr()
    assert main(["evaluate", str(run), "--split", "valid"]) == 0    # rebuilt from the training split
    shutil.rmtree(pairs)
    assert main(["evaluate", str(run), "--split", "valid"]) == 2
    err = capsys.readouterr().err
    assert "written before runs kept their vocabulary" in err and "train.en" in err


def train_lm(tmp_path):
    """A 3-step word-level LM on a tiny corpus by path: (the corpus folder, the run directory)."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for split in ("train", "valid", "test"):
        (corpus / f"{split}.txt").write_text("the cat sat on the mat\nthe dog sat on the log\n" * 6)
    cfg = {"task": {"name": "lm", "batch_size": 2, "tgt_len": 6},
           "data": {"dataset": f"text:path={corpus}"},
           "model": {"d_model": 16, "n_heads": 2, "d_ff": 16, "n_layers": 1, "mem_len": 6},
           "train": {"max_steps": 3, "progress": False, "test_best": False}}
    (tmp_path / "lm.yaml").write_text(yaml.safe_dump(cfg))
    run = tmp_path / "run"
    assert main(["train", str(tmp_path / "lm.yaml"), "--run-dir", str(run)]) == 0
    return corpus, run


def test_lm_run_travels_and_unknown_prompt_words_warn(tmp_path, capsys):
    corpus, run = train_lm(tmp_path)
    assert json.loads((run / "vocab.json").read_text())["itos"][:2] == ["<unk>", "<eos>"]
    new = tmp_path / "new.txt"
    new.write_text("the cat sat on the log\nthe zebra sat\n")
    capsys.readouterr()
    assert main(["evaluate", str(run), "--test-file", str(new), "eval.batch_size=2"]) == 0
    before = last_json(capsys)
    shutil.rmtree(corpus)
    assert main(["evaluate", str(run), "--test-file", str(new), "eval.batch_size=2"]) == 0
    assert last_json(capsys) == before and before["ppl"] > 1     # without its corpus: the run's own vocabulary
    assert main(["evaluate", str(run), "--test-src", str(new), "--test-tgt", str(new)]) == 2
    assert "with a translation run (a language-model run: --test-file)" in capsys.readouterr().err
    assert main(["generate", str(run), "--prompt", "the zebra cat", "--max-new", "2"]) == 0
    cap = capsys.readouterr()
    assert cap.out.split()[:3] == ["the", "zebra", "cat"] and len(cap.out.split()) == 5
    assert cap.err.count("\n") == 1 and "zebra" in cap.err and "<unk>" in cap.err
