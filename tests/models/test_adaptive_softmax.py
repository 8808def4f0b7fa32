"""Transformer-XL's adaptive input embedding and tied adaptive soft-max against a plain per-word reference (float64,
exponentials summed by hand), with gradients; the distribution sums to one; the soft-max reads the embedding's
own tables (one set of weights, trained by both ends, kept tied through a checkpoint)."""

import math

import pytest
import torch

from kernel_attention.models import LanguageModel
from kernel_attention.models.adaptive_softmax import AdaptiveEmbedding, TiedAdaptiveLogSoftmax

V, D, CUTOFFS = 23, 8, [5, 12, 17]


def pair(div):
    torch.manual_seed(0)
    emb = AdaptiveEmbedding(V, D, CUTOFFS, div).double()
    soft = TiedAdaptiveLogSoftmax(emb).double()
    with torch.no_grad():  # biases away from their zero start, so that a misplaced one shows
        for p in [*soft.biases, soft.cluster_bias]:
            p.normal_()
    return emb, soft


def reference_log_prob(emb, soft, h, w):
    """log p(w | h) for one hidden state h (D,): the head's soft-max over its words and one entry per tail
    cluster (cluster k at head column |C_0| + n - k), times the cluster's own soft-max."""
    bounds, n = [0, *CUTOFFS, V], len(CUTOFFS)
    div = emb.div_value

    def table(k):
        return emb.tables[0][bounds[k]:bounds[k + 1]] if div == 1 else emb.tables[k]

    def bias(k):
        return soft.biases[0][bounds[k]:bounds[k + 1]] if div == 1 else soft.biases[k]

    def project(x, k):
        proj = (soft.head_proj if k == 0 else emb.projs[k]) if div != 1 else None
        return x if proj is None else torch.stack([sum(proj[i, j] * x[i] for i in range(D))
                                                   for j in range(proj.shape[1])])

    def softmax_entry(scores, i):
        e = [torch.exp(s - max(scores)) for s in scores]
        return torch.log(e[i] / sum(e))

    h0 = project(h, 0)
    head = [table(0)[i] @ h0 + bias(0)[i] for i in range(bounds[1])]
    head += [soft.cluster_weight[c] @ h0 + soft.cluster_bias[c] for c in range(n)]
    k = max(i for i in range(n + 1) if w >= bounds[i])
    if k == 0:
        return softmax_entry(head, w)
    hk = project(h, k)
    tail = [table(k)[i] @ hk + bias(k)[i] for i in range(bounds[k + 1] - bounds[k])]
    return softmax_entry(head, bounds[1] + n - k) + softmax_entry(tail, w - bounds[k])


@pytest.mark.parametrize("div", [1.0, 2.0])
def test_log_probabilities_and_their_gradients_equal_the_per_word_reference(div):
    emb, soft = pair(div)
    h = torch.randn(4, D, dtype=torch.double)
    targets = torch.tensor([0, 7, 13, 22])       # the head and each tail cluster
    got = soft(h, targets)
    want = torch.stack([-reference_log_prob(emb, soft, h[i], int(targets[i])) for i in range(4)])
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(soft.log_prob(h)[torch.arange(4), targets], -want)
    params = [*emb.parameters(), *soft.parameters()]
    g_got = torch.autograd.grad(got.sum(), params, allow_unused=True)
    g_want = torch.autograd.grad(want.sum(), params, allow_unused=True)
    for name, a, b in zip([n for n, _ in [*emb.named_parameters(), *soft.named_parameters()]], g_got, g_want):
        torch.testing.assert_close(a, b, msg=name)


@pytest.mark.parametrize("div", [1.0, 2.0])
def test_every_word_has_a_probability_and_they_sum_to_one(div):
    emb, soft = pair(div)
    h = torch.randn(6, D, dtype=torch.double)
    logp = soft.log_prob(h)
    assert logp.shape == (6, V)
    torch.testing.assert_close(logp.logsumexp(-1), torch.zeros(6, dtype=torch.double))
    every = torch.arange(V).repeat(6, 1)
    torch.testing.assert_close(soft(h.repeat_interleave(V, 0), every.reshape(-1)).view(6, V), -logp)


@pytest.mark.parametrize("div", [1.0, 2.0])
def test_the_embedding_is_each_clusters_projected_row_scaled(div):
    emb, _ = pair(div)
    tokens = torch.tensor([[0, 4, 5, 11], [12, 16, 17, 22]])
    got = emb(tokens)
    bounds = [0, *CUTOFFS, V]
    for w, x in zip(tokens.reshape(-1).tolist(), got.reshape(-1, D)):
        k = max(i for i in range(len(bounds) - 1) if w >= bounds[i])
        row = emb.tables[0][w] if div == 1 else emb.projs[k] @ emb.tables[k][w - bounds[k]]
        torch.testing.assert_close(x, math.sqrt(D) * row)
    if div == 2.0:
        assert [t.shape[1] for t in emb.tables] == [8, 4, 2, 1]   # d / div^k


@pytest.mark.parametrize("div", [1, 2])
def test_the_language_models_output_layer_is_its_input_embedding(div, tmp_path):
    """tie_output with adaptive: the soft-max scores words with the embedding's tables (no second copy in the
    state dict), a word seen only as a target trains its embedding row, and a reloaded model stays tied."""
    torch.manual_seed(0)
    kw = dict(d_model=D, n_heads=2, d_ff=16, n_layers=1, dropout=0.0, adaptive={"cutoffs": CUTOFFS, "div_value": div})
    model = LanguageModel(V, **kw)
    assert isinstance(model.adaptive, TiedAdaptiveLogSoftmax) and model.adaptive.embedding[0] is model.embed
    names = set(model.state_dict())
    assert not any(n.startswith("adaptive.embedding") for n in names)
    tokens = torch.randint(0, 5, (2, 6))                     # inputs from the head only
    targets = torch.full((2, 6), 20)                          # a target in the last cluster
    nll, _ = model(tokens, targets=targets)
    nll.sum().backward()
    table = model.embed.tables[0] if div == 1 else model.embed.tables[3]
    row = 20 if div == 1 else 20 - CUTOFFS[2]
    assert table.grad[row].abs().sum() > 0                    # the output end trained the word's input row
    torch.save(model.state_dict(), tmp_path / "m.pt")
    again = LanguageModel(V, **kw)
    again.load_state_dict(torch.load(tmp_path / "m.pt"))
    assert again.adaptive.embedding[0] is again.embed
    with torch.no_grad():
        torch.testing.assert_close(again(tokens, targets=targets)[0], model(tokens, targets=targets)[0])
        again.embed.tables[-1][row].mul_(2.0)                  # an edit of the embedding moves the soft-max
        assert not torch.allclose(again(tokens, targets=targets)[0], model(tokens, targets=targets)[0])


def test_the_paper_config_builds_transformer_xls_output_layer():
    """TD's SP configs (Transformer-XL's WikiText-103 base): adaptive input and soft-max, tied, cutoffs 20k / 40k /
    200k of a 267,735-word vocabulary, div 1 (one table, no projections); here at d_model 8."""
    from kernel_attention.models import MODELS
    from kernel_attention.study.dissection import load_paper_config

    model_cfg = dict(load_paper_config("transformer_dissection/table1/sp_xl.yaml")["model"])
    model_cfg.update(d_model=8, n_heads=2, d_head=4, d_ff=16, n_layers=1)
    model = MODELS.create(model_cfg, vocab=267735)
    assert isinstance(model.adaptive, TiedAdaptiveLogSoftmax) and model.embed.bounds == [0, 20000, 40000, 200000,
                                                                                          267735]
    assert [tuple(t.shape) for t in model.embed.tables] == [(267735, 8)] and len(model.embed.projs) == 0
    assert model.adaptive.cluster_weight.shape == (3, 8) and model.adaptive.head_proj is None
