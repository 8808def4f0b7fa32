"""The blockwise smoother (backends/chunked.py) under autocast, where its additive term comes in float32 beside
low-precision features and values: CUDA's autocast gives the implicit kernels' log k that way (its float32 ops,
exp and pow among them), and the backward runs outside autocast, so its products meet both dtypes."""

import pytest
import torch

from kernel_attention.backends.chunked import ChunkSpec, chunked_smoother, plan_blocks

B, H, T, D = 2, 3, 13, 8


def _reference(qf, kf, v, b, scale):
    """softmax(scale · q'k'^T + b) v in float32, the O(T²) formula."""
    s = b if qf is None else scale * qf @ kf.transpose(-1, -2) + b
    return torch.softmax(s, -1) @ v


CASES = {"bias-only": (False, False), "features-and-bias": (True, False), "bias-and-value-term": (False, True)}


@pytest.mark.parametrize("case", list(CASES))
def test_a_float32_term_beside_bf16_values_trains_as_the_float32_formula(case):
    """The term b and a value term P U (as Shaw's a^V enters) in float32, q', k' and v in bf16 under autocast:
    the output and every gradient are the float32 formula's within bf16 rounding."""
    features, value_term = CASES[case]
    g = torch.Generator().manual_seed(0)
    qf, kf = ((torch.randn(B, H, T, D, generator=g) if features else None) for _ in range(2))
    v = torch.randn(B, H, T, D, generator=g)
    src = torch.randn(B, H, T, T, generator=g)  # the term's input, read whole by the callback
    u = torch.randn(B, H, T, D, generator=g)     # the value term's table, one row per key
    keep = torch.ones(T, T, dtype=torch.bool).tril()
    keep4, blocks = plan_blocks(keep, T, T, rows=4)
    spec = ChunkSpec(scale=D ** -0.5, blocks=blocks, keep=keep4,
                     bias_fn=lambda rows, cols, ex: ex[0][..., rows, cols],
                     value_fn=(lambda p, rows, cols, ex: p @ ex[1][..., cols, :]) if value_term else None)
    leaves = [x.clone().requires_grad_(True) for x in (qf, kf, v, src, u) if x is not None]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        *feats, vv, bias, table = leaves
        out = chunked_smoother(spec, *(feats or (None, None)), vv, bias.float(), table.float())
    assert out.dtype == torch.bfloat16
    gout = torch.randn(out.shape, generator=g)
    out.float().backward(gout)
    ref_leaves = [x.detach().clone().requires_grad_(True) for x in leaves]
    *rfeats, rv, rsrc, ru = ref_leaves
    masked = rsrc.masked_fill(~keep, float("-inf"))
    ref = _reference(*(rfeats or (None, None)), rv + ru if value_term else rv, masked, D ** -0.5)
    ref.backward(gout)
    assert float((out.float() - ref).detach().norm() / ref.detach().norm()) < 2e-2
    for a, b in zip(leaves, ref_leaves):
        if b.grad is None:  # the table where no value term reads it: a zero gradient
            assert not value_term and not a.grad.any()
            continue
        assert a.grad is not None and a.grad.dtype == a.dtype
        assert float((a.grad - b.grad).norm() / b.grad.norm()) < 5e-2
