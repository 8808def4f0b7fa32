"""SentenceClassifier and SequenceRegressor."""

import torch

from kernel_attention.models import MODELS, SentenceClassifier, SequenceRegressor


def test_classifier_ignores_padding():
    torch.manual_seed(0)
    m = SentenceClassifier(30, 3, d_model=16, n_heads=2, d_ff=32, dropout=0.0,
                           attention={"position": "shaw", "kernel": "rbf"}).double().eval()
    x = torch.randint(4, 30, (2, 5))
    padded = torch.cat([x, torch.zeros(2, 4, dtype=torch.long)], 1)
    torch.testing.assert_close(m(padded), m(x))
    assert m(x).shape == (2, 3)
    w = m.attention_maps(padded)
    assert w[0].shape == (2, 2, 9, 9) and torch.all(w[0][..., 5:] == 0)


def test_regressor_is_permutation_equivariant_and_has_relu_after_both_ffn_layers():
    torch.manual_seed(1)
    m = SequenceRegressor(5, d_model=16, n_heads=8).double().eval()
    assert isinstance(m.layers[0].ffn[-1], torch.nn.ReLU) and isinstance(m.layers[0].ffn[1], torch.nn.ReLU)
    assert m.layers[0].self_attn.n_heads == 8 and m.layers[0].norm == "post"
    x = torch.randn(1, 20, 5, dtype=torch.double)
    perm = torch.randperm(20)
    y = m(x)
    assert y.shape == (1, 20)
    torch.testing.assert_close(m(x[:, perm]), y[:, perm])     # no PE: the rows are a set
    # every row's prediction depends on the other rows (attention over the whole dataset)
    x2 = x.clone()
    x2[0, 0] += 1.0
    assert not torch.allclose(m(x2)[:, 1:], y[:, 1:])


def test_registry_builds_with_context():
    m = MODELS.create({"name": "regressor", "d_model": 16}, in_features=3)
    assert m.inp.in_features == 3


def test_implicit_kernels_share_one_density_and_give_a_regularizer():
    torch.manual_seed(2)
    m = SentenceClassifier(30, 2, d_model=16, n_heads=2, d_ff=32, n_layers=2, attention={"kernel": "ikan"})
    dens = {id(layer.self_attn.kernel.density) for layer in m.layers}
    assert len(dens) == 1                                      # the paper's shared spectral estimator
    m.n_train = 10.0
    m(torch.randint(4, 30, (3, 5)))
    from kernel_attention.kernels.implicit import regularization
    r = m.regularization()
    assert r.item() > 0
    torch.testing.assert_close(r, regularization(m, 10.0))
    plain = SentenceClassifier(30, 2, d_model=16, n_heads=2, d_ff=32)
    assert plain.regularization().item() == 0.0
