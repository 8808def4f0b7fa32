"""The user's own data by path: ``text:path=...`` (language modelling) and ``parallel:path=...`` (any codes)."""

import gzip
import json

import pytest
import yaml

from kernel_attention.cli import main
from kernel_attention.cli.data import run_check
from kernel_attention.data import DATASETS, DataFormatError, MissingDataError
from kernel_attention.data.datasets import dataset_names
from kernel_attention.registry import SpecError

LINES = ["the cat sat on the mat", "the dog ate a bone", "a cat saw the dog", "the mat was red"]
EN = ["the cat sleeps", "a dog runs", "the red house", "a cat runs", "the dog sleeps", "the house is red"]
FR = ["le chat dort", "un chien court", "la maison rouge", "un chat court", "le chien dort", "la maison est rouge"]


def write_text(folder, n=24):
    folder.mkdir(parents=True, exist_ok=True)
    for split in ("train", "valid", "test"):
        (folder / f"{split}.txt").write_text("\n".join(LINES[i % 4] for i in range(n)) + "\n")
    return folder


def write_pairs(folder, n=36, gz=False):
    folder.mkdir(parents=True, exist_ok=True)
    for split, k in (("train", n), ("valid", 6), ("test", 6)):
        for code, lines in (("en", EN), ("fr", FR)):
            text = ("\n".join(lines[i % 6] for i in range(k)) + "\n").encode()
            if gz and split == "train":
                (folder / f"{split}.{code}.gz").write_bytes(gzip.compress(text))
            else:
                (folder / f"{split}.{code}").write_bytes(text)
    return folder


def test_text_folder_and_single_file(tmp_path):
    corpus = DATASETS.create(f"text:path={write_text(tmp_path / 'corpus')}")
    assert corpus.sizes()["train"] == sum(len(LINES[i % 4].split()) + 1 for i in range(24))
    assert "cat" in corpus.vocab and len(corpus.vocab) == 2 + 12  # <unk>, <eos> and the 12 words
    one = tmp_path / "all.txt"
    one.write_text("\n".join(LINES * 10) + "\n")
    a = DATASETS.create(f"text:path={one},valid=0.2,test=0.1,seed=3")
    b = DATASETS.create(f"text:path={one},valid=0.2,test=0.1,seed=3")
    assert all(a.splits[s].tolist() == b.splits[s].tolist() for s in ("train", "valid", "test"))
    assert 0 < a.sizes()["test"] < a.sizes()["valid"] < a.sizes()["train"]
    assert sum(a.sizes().values()) == sum(len(l.split()) + 1 for l in LINES * 10)


def test_text_errors_and_listing(tmp_path):
    with pytest.raises(MissingDataError, match="does not exist"):
        DATASETS.create(f"text:path={tmp_path / 'nowhere'}")
    (tmp_path / "two.txt").write_text("a b\nc d\n")
    with pytest.raises(DataFormatError, match="too few"):
        DATASETS.create(f"text:path={tmp_path / 'two.txt'}")
    with pytest.raises(SpecError, match="path"):
        DATASETS.create("text")
    assert "text" not in dataset_names() and "parallel" not in dataset_names()
    lines = []
    assert run_check(str(tmp_path), ["parallel"], out=lines.append) == 2 and "parallel:path=DIR" in lines[0]


def test_parallel_any_codes_plain_and_gz(tmp_path):
    pairs = DATASETS.create(f"parallel:path={write_pairs(tmp_path / 'p', gz=True)},src=en,tgt=fr")
    assert pairs.src_lang == "en" and pairs.sizes() == {"train": 36, "valid": 6, "test": 6}
    assert pairs.splits["train"][1][0] == "le chat dort"
    with pytest.raises(MissingDataError, match="train.de"):
        DATASETS.create(f"parallel:path={tmp_path / 'p'},src=de,tgt=fr")


def lm_config(tmp_path, path):
    cfg = {"task": {"name": "lm", "batch_size": 2, "tgt_len": 6},
           "data": {"dataset": f"text:path={path}"},
           "model": {"d_model": 16, "n_heads": 2, "d_ff": 16, "n_layers": 1, "mem_len": 6},
           "train": {"max_steps": 4, "progress": False}}
    (tmp_path / "lm.yaml").write_text(yaml.safe_dump(cfg))
    return str(tmp_path / "lm.yaml")


def test_lm_on_text_by_path_trains_and_evaluates(tmp_path, capsys):
    corpus = write_text(tmp_path / "corpus")
    run = tmp_path / "run"
    assert main(["train", lm_config(tmp_path, corpus), "--run-dir", str(run)]) == 0
    capsys.readouterr()
    assert main(["evaluate", str(run), "--split", "valid"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["split"] == "valid" and out["ppl"] > 1


def test_translation_by_path_en_fr_trains(tmp_path, capsys):
    pairs = write_pairs(tmp_path / "pairs")
    cfg = {"task": {"name": "translation", "max_tokens": 200, "bpe_vocab_size": 60},
           "data": {"dataset": f"parallel:path={pairs},src=en,tgt=fr"},
           "model": {"d_model": 16, "n_heads": 2, "d_ff": 32, "enc_layers": 1, "dec_layers": 1, "dropout": 0.0,
                     "share_embeddings": True},
           "eval": {"beam": 1, "max_len_b": 4},
           "train": {"max_steps": 2, "progress": False}}
    (tmp_path / "mt.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["train", str(tmp_path / "mt.yaml"), "--run-dir", str(tmp_path / "run")]) == 0
    capsys.readouterr()
    assert main(["evaluate", str(tmp_path / "run"), "--split", "valid"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert 0.0 <= out["bleu"] <= 100.0


def test_inputs_at_inference_are_tokenised_as_the_training_data_was(tmp_path):
    """With ``tokenize=true`` the training text is lower-cased and its punctuation split off; a raw sentence
    given to ``classify``, ``translate_lines`` or ``evaluate --test-src/--test-tgt`` goes through the same, so
    "The cat sleeps." is read as the training data's "the cat sleeps ." (not as unknown words)."""
    import torch

    from kernel_attention.tasks import build_task

    raw = ["The cat sleeps.", "A dog runs!", "The red house?"]
    folder = tmp_path / "tsv"
    folder.mkdir()
    for split in ("train", "valid", "test"):
        (folder / f"{split}.tsv").write_text("".join(f"{s}\t{'pos' if i % 2 else 'neg'}\n"
                                                     for i, s in enumerate(raw * 4)))
    task = build_task({"task": {"name": "classification"},
                       "data": {"dataset": f"tsv:path={folder},text=0,label=1,tokenize=true"}})
    task.prepare_data()

    class Seen(torch.nn.Module):
        def forward(self, tokens):
            self.tokens = tokens
            return torch.zeros(tokens.shape[0], 2)

    seen = Seen()
    task.classify(seen, raw)
    assert seen.tokens.tolist() == [task.vocab.encode(s.split()).tolist()
                                    for s in ("the cat sleeps .", "a dog runs !", "the red house ?")]
    assert task.vocab.unk_id not in seen.tokens.flatten().tolist()

    pairs = write_pairs(tmp_path / "pairs")
    (pairs / "raw.en").write_text("The cat sleeps.\nA dog runs!\n")
    (pairs / "tok.en").write_text("the cat sleeps .\na dog runs !\n")
    (pairs / "raw.fr").write_text("Le chat dort.\nUn chien court!\n")
    mt = build_task({"task": {"name": "translation", "max_tokens": 200, "bpe_vocab_size": 60},
                     "data": {"dataset": f"parallel:path={pairs},src=en,tgt=fr,tokenize=true"}})
    mt.prepare_data()
    sources = []
    mt.translate_ids = lambda model, src: sources.append(src) or [[] for _ in range(src.shape[0])]
    mt.translate_lines(None, ["The cat sleeps.", "A dog runs!"])
    mt.translate_lines(None, ["the cat sleeps .", "a dog runs !"])
    assert sources[0].tolist() == sources[1].tolist()
    mt.set_test_pair(pairs / "raw.en", pairs / "raw.fr")
    raw_test = [t.tolist() for t in mt.prepared.splits["test"].src]
    mt.set_test_pair(pairs / "tok.en", pairs / "raw.fr")
    assert raw_test == [t.tolist() for t in mt.prepared.splits["test"].src]
    assert mt.prepared.splits["test"].ref == ["le chat dort .", "un chien court !"]
