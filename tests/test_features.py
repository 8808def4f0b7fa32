"""The symmetric tensor square (poly degree 2's feature map) against the gather form and autograd."""

import math

import torch

from kernel_attention.kernels.features import symmetric_square, symmetric_square_size


def _gather_form(x):
    d = x.shape[-1]
    ia, ib = torch.triu_indices(d, d)
    w = torch.where(ia == ib, 1.0, math.sqrt(2.0)).to(x.dtype)
    return x[..., ia] * x[..., ib] * w


def test_equals_gather_form_and_inner_product_identity():
    x, y = torch.randn(2, 3, 5, 7, dtype=torch.float64), torch.randn(2, 3, 4, 7, dtype=torch.float64)
    phi = symmetric_square(x)
    assert phi.shape == (2, 3, 5, symmetric_square_size(7))
    torch.testing.assert_close(phi, _gather_form(x))
    torch.testing.assert_close(phi @ symmetric_square(y).transpose(-1, -2), (x @ y.transpose(-1, -2)) ** 2)


def test_gradient_matches_autograd_of_gather_form_and_gradcheck():
    x = torch.randn(3, 6, 9, dtype=torch.float64, requires_grad=True)
    g = torch.randn(3, 6, symmetric_square_size(9), dtype=torch.float64)
    (ours,) = torch.autograd.grad(symmetric_square(x), x, g)
    (ref,) = torch.autograd.grad(_gather_form(x), x, g)
    torch.testing.assert_close(ours, ref)
    assert torch.autograd.gradcheck(symmetric_square, (x[:1, :2].detach().requires_grad_(),))
