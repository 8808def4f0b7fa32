"""Dropout masks (kernel_attention.dropout): reproducible, with the asked-for keep rate; the models' dropout
layer against its definition."""

import math

import pytest
import torch

from kernel_attention.dropout import Dropout, block_seed, keep_mask


def test_same_seed_same_mask_other_seed_other_mask():
    a, b, c = keep_mask((3, 5, 7), 0.3, 11), keep_mask((3, 5, 7), 0.3, 11), keep_mask((3, 5, 7), 0.3, 12)
    assert a.shape == (3, 5, 7) and a.dtype == torch.bool
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_keep_rate_is_one_minus_p_in_every_word():
    # 4 x 2^17 draws: the rate within 5 standard deviations, overall and in each of the four 16-bit
    # words taken from one 64-bit draw (a word with a missing bit would keep at another rate).
    n = 4 * 2 ** 17
    for p in (0.1, 0.5, 0.9):
        keep = keep_mask((n,), p, 7).float()
        for part in (keep, *(keep[j::4] for j in range(4))):
            tol = 5 * math.sqrt(p * (1 - p) / len(part))
            assert abs(part.mean().item() - (1 - p)) < tol, (p, part.mean().item())
    assert bool(keep_mask((1000,), 0.0, 3).all())


def test_block_seeds_are_distinct():
    seeds = {block_seed(5, r, c) for r in range(0, 4096, 64) for c in range(0, 4096, 512)}
    assert len(seeds) == 64 * 8


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layer_scales_what_it_keeps_and_passes_the_gradient_through_it(dtype):
    """y = x keep / (1 - p'), p' = p rounded to 2^-16; dy/dx = keep / (1 - p'); the keep rate 1 - p."""
    p, n = 0.2, 3 * 2 ** 16 + 5  # a length that is not a multiple of four words
    x = (torch.rand(n) + 1).to(dtype).requires_grad_(True)
    y = Dropout(p).train()(x)
    y.backward(torch.ones_like(y))
    keep = y != 0
    scale = torch.tensor(65536 / (65536 - round(p * 65536)), dtype=dtype)
    assert y.dtype == dtype and torch.equal(y[keep], x.detach()[keep] * scale) and not y[~keep].any()
    assert torch.equal(x.grad, keep.to(dtype) * scale)
    assert abs(keep.float().mean().item() - (1 - p)) < 5 * math.sqrt(p * (1 - p) / n)


def test_layer_is_the_identity_in_eval_and_at_p_0_and_zero_at_p_1():
    x = torch.randn(4, 7)
    assert torch.equal(Dropout(0.5).eval()(x), x) and torch.equal(Dropout(0.0).train()(x), x)
    assert not Dropout(1.0).train()(x).any()


def test_layer_draws_from_the_default_generator():
    """torch.manual_seed (and a checkpoint's restored RNG state) reproduces the masks; calls differ."""
    layer, x = Dropout(0.5).train(), torch.ones(64, 33)
    torch.manual_seed(3)
    a, b = layer(x), layer(x)
    torch.manual_seed(3)
    assert torch.equal(layer(x), a) and not torch.equal(a, b)


def test_layer_compiles_whole_as_torch_dropout():
    layer = Dropout(0.5).train()
    compiled = torch.compile(layer, fullgraph=True, backend="eager")
    y = compiled(torch.ones(8, 16))
    assert set(y.unique().tolist()) <= {0.0, 2.0}
