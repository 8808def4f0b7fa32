import math

import pytest
import sacrebleu
import torch

from kernel_attention.training.metrics import accuracy, perplexity, rmse, sacrebleu_score, tokenized_bleu

HYPS = ["The cat sat on the mat .", "a quick brown fox jumps", "hello there , world"]
REFS = ["The cat sat on a mat .", "the quick brown fox jumped", "hello , world"]


def test_bleu_matches_sacrebleu():
    assert sacrebleu_score(HYPS, REFS) == pytest.approx(sacrebleu.corpus_bleu(HYPS, [REFS]).score)
    want = sacrebleu.corpus_bleu(HYPS, [REFS], tokenize="none", smooth_method="none", force=True).score
    assert tokenized_bleu(HYPS, REFS) == pytest.approx(want)


def test_tokenized_bleu_by_hand():
    # hyp n-gram matches: 1-grams 5/6 (one "the" clipped), 2-grams 3/5, 3-grams 2/4, 4-grams 1/3; c == r
    hyp, ref = ["the cat sat on the mat"], ["the cat sat on a mat"]
    assert tokenized_bleu(hyp, ref) == pytest.approx(100 * (5 / 6 * 3 / 5 * 2 / 4 * 1 / 3) ** 0.25, rel=1e-9)
    # brevity penalty: hyp of 4 tokens, all n-grams match, reference of 6 -> exp(1 - 6/4)
    assert tokenized_bleu(["the cat sat on"], ["the cat sat on a mat"]) == pytest.approx(100 * math.exp(1 - 6 / 4))
    # no smoothing: no matching 4-gram gives 0, as multi-bleu.perl does
    assert tokenized_bleu(["a b c x d"], ["a b c y d"]) == 0.0
    # tokenised BLEU does not split punctuation; detokenised sacreBLEU (13a) does
    hyp, ref = ["the cat sat on the mat."], ["the cat sat on the mat ."]
    assert sacrebleu_score(hyp, ref) == pytest.approx(100.0)
    assert tokenized_bleu(hyp, ref) < 90.0
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        tokenized_bleu(["a", "b"], ["a"])


def test_perplexity_accuracy_rmse():
    logits = torch.log_softmax(torch.randn(10, 7, generator=torch.Generator().manual_seed(0)), -1)
    target = torch.arange(10) % 7
    nll = torch.nn.functional.nll_loss(logits, target, reduction="sum")
    assert perplexity(nll, 10) == pytest.approx(math.exp(float(nll) / 10))
    assert perplexity(10 * math.log(7), 10) == pytest.approx(7.0)  # uniform over 7 tokens
    pred = torch.tensor([1, 2, 3, 4])
    tgt = torch.tensor([1, 0, 3, -100])
    assert accuracy(pred, tgt) == 0.5
    assert accuracy(pred, tgt, ignore_index=-100) == pytest.approx(2 / 3)
    assert accuracy(torch.nn.functional.one_hot(pred, 5).float(), tgt) == 0.5
    assert rmse(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 0.0, 3.0])) == pytest.approx(math.sqrt(4 / 3))
