"""Translation task end to end on a tiny parallel corpus (fairseq layout) the test writes."""

import re

import pytest
import torch

from kernel_attention.registry import SpecError
from kernel_attention.tasks import build_task

SRC = "ein zwei drei vier fünf sechs".split()
TGT = "one two three four five six".split()


def write_parallel(root):
    folder = root / "iwslt14.tokenized.de-en"
    folder.mkdir(parents=True)
    g = torch.Generator().manual_seed(0)
    for split, n in (("train", 80), ("valid", 8), ("test", 8)):
        idx = [torch.randint(0, 6, (int(torch.randint(2, 5, (1,), generator=g)),), generator=g).tolist()
               for _ in range(n)]
        (folder / f"{split}.de").write_text("\n".join(" ".join(SRC[i] for i in s) for s in idx) + "\n")
        (folder / f"{split}.en").write_text("\n".join(" ".join(TGT[i] for i in s) for s in idx) + "\n")
    return {"name": "iwslt14", "root": str(root)}


def test_translation_trains_scores_bleu_and_translates(tmp_path, train):
    task = build_task({
        "task": {"name": "translation", "max_tokens": 200, "bpe_vocab_size": 60, "label_smoothing": 0.1},
        "data": {"dataset": write_parallel(tmp_path)},
        "model": {"d_model": 16, "n_heads": 2, "d_ff": 32, "enc_layers": 1, "dec_layers": 1, "dropout": 0.0,
                  "share_embeddings": True, "pe_at_input": False,
                  "encoder_attention": {"position": "product"}, "cross_attention": {"position": "product"},
                  "decoder_attention": {"position": "none"}},
        "eval": {"beam": 2, "max_len_b": 4}})
    trainer, _ = train(task, 15, lr=1e-2)
    m = trainer.evaluate("valid")
    assert set(m) == {"bleu", "loss"} and 0.0 <= m["bleu"] <= 100.0
    out = task.translate_lines(trainer.model.eval(), ["ein zwei", "drei"])
    assert len(out) == 2 and all(isinstance(s, str) for s in out)
    assert "@@" not in " ".join(out)


def test_translation_bad_configs(tmp_path):
    with pytest.raises(SpecError, match="share_embeddings needs one joint vocabulary"):
        build_task({"task": {"name": "translation", "joint_bpe": False}, "data": {"dataset": "iwslt14"},
                    "model": {"share_embeddings": True}})
    with pytest.raises(SpecError, match="is a lm dataset"):
        build_task({"task": "translation", "data": {"dataset": "wikitext-2"}})
    with pytest.raises(SpecError, match="eval.bleu"):
        build_task({"task": "translation", "data": {"dataset": "iwslt14"}, "eval": {"bleu": "chrf"}})


@pytest.mark.parametrize("damage, task_keys, message", [
    (lambda f: [(f / f"train.{l}").write_text("") for l in ("de", "en")], {},
     r"the train split holds no sentence pair$"),
    (lambda f: [(f / f"test.{l}").write_text("") for l in ("de", "en")], {}, r"the test split holds no sentence pair"),
    (lambda f: None, {"max_len": 1}, r"the train split holds no sentence pair \(\d+ dropped by the length filter, "
                                     r"task\.max_len=1\)"),
    (lambda f: None, {"max_tokens": 3}, r"task\.max_tokens=3 is less than the longest pair of the train split \(\d+ "
                                        r"tokens with <bos>/<eos>\); raise task\.max_tokens or lower task\.max_len"),
])
def test_an_empty_split_or_a_pair_beyond_max_tokens_is_refused_before_training(tmp_path, capsys, damage, task_keys,
                                                                              message):
    """Each would have trained and then failed (an empty train split: epochs without a batch, forever; an empty
    test split: sacreBLEU on no sentence after the last update; a long pair: the first batch)."""
    import yaml

    from kernel_attention.cli import main

    spec = write_parallel(tmp_path)
    damage(tmp_path / "iwslt14.tokenized.de-en")
    cfg = {"task": {"name": "translation", "max_tokens": 200, "bpe_vocab_size": 60, **task_keys},
           "data": {"dataset": spec}, "model": {"d_model": 16, "n_heads": 2, "d_ff": 32, "enc_layers": 1,
                                                "dec_layers": 1}}
    with pytest.raises(SpecError, match=message):
        build_task(cfg).prepare_data()
    (tmp_path / "t.yaml").write_text(yaml.safe_dump({**cfg, "train": {"max_steps": 2}}))
    assert main(["train", str(tmp_path / "t.yaml"), "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and re.search(message.rstrip("$"), err)
