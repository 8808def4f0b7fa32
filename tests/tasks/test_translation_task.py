"""Translation task end to end on a tiny parallel corpus (fairseq layout) the test writes."""

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
