"""Inputs and comparisons shared by the backend tests: small float64 problems, one call's output and
gradients on a named backend, and their comparison with ``dense``."""

import torch

import kernel_attention as ka
from kernel_attention.functional import attention
from kernel_attention.positions import default_positions, make_position

B, H, D = 2, 2, 8
DT = torch.float64

def inputs(tq, tk, d=D, seed=0, dtype=DT, b=B):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, H, tq, d, generator=g, dtype=dtype).requires_grad_()
    k = torch.randn(b, H, tk, d, generator=g, dtype=dtype).requires_grad_()
    v = torch.randn(b, H, tk, d, generator=g, dtype=dtype).requires_grad_()
    return q, k, v


def run(backend, kernel, position="none", filt=None, tq=23, tk=23, key_mask=None, value_position="none",
         self_attention=True, dropout_p=0.0, dtype=DT, b=B):
    """Output and gradients (q, k, v, positional and kernel parameters) for one combination."""
    torch.manual_seed(1)
    pos = make_position(position, d_model=H * D, n_heads=H, d_head=D, value_position=value_position).to(dtype)
    kern = ka.make_kernel(kernel, n_heads=H, d_head=D).to(dtype).eval()
    q, k, v = inputs(tq, tk, dtype=dtype, b=b)
    pq, pk = default_positions(tq, tk, "cpu", self_attention)
    terms = pos.terms(q, k, pq, pk)
    torch.manual_seed(2)
    out = attention(q, k, v, kern, filt, terms=terms, key_mask=key_mask, backend=backend, dropout_p=dropout_p)
    params = [q, k, v] + [p for p in pos.parameters()] + [p for p in kern.parameters() if p.requires_grad]
    grads = torch.autograd.grad(out, params, torch.ones_like(out) + out.detach(), allow_unused=True)
    return out, grads


def close(a, b, atol=1e-10):
    out_a, ga = a
    out_b, gb = b
    torch.testing.assert_close(out_a, out_b, atol=atol, rtol=atol)
    for x, y in zip(ga, gb):
        if x is None or y is None:
            assert (x is None or not x.any()) and (y is None or not y.any())
        else:
            torch.testing.assert_close(x, y, atol=atol, rtol=atol)


def padding_mask(tk, empty=False):
    km = torch.ones(B, tk, dtype=torch.bool)
    km[1, tk // 2:] = False
    if empty:
        km[0] = False  # every key of sequence 0 is padding: all its queries have an empty set
    return km



# small blocks so that the blocked path runs several blocks (and skips keys) even on tiny inputs
FUSED = ["fused:block=1024", "fused:key_bias=mask,block=1024", "fused"]
POSITIVE = ["exp", "rbf", "periodic", "ikas"]
POSITIONS = ["none", "shaw", "xl", "product"]
FILTERS = [None, "causal", "local:window=4", "padding"]
