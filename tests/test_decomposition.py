"""Propositions 1 and 2 of Implicit Kernel Attention, and the Lp magnitude."""

import math

import pytest
import torch
import torch.nn.functional as F

import kernel_attention as ka
from kernel_attention.kernels.decomposition import exp_decompose, gat_decompose, lp_norm_sq, magnitude
from kernel_attention.kernels.implicit import SimilarityMagnitudeKernel

IKA = ["rbf-only", "expsin", "ikas", "ikans", "ikan", "ikan:p=1.3", "ikan-direct", "mikan", "mikan:official=true"]


def test_proposition_1_to_float_precision():
    q = torch.randn(2, 3, 5, 16, dtype=torch.float64) * 2
    k = torch.randn(2, 3, 7, 16, dtype=torch.float64) * 2
    log_sim, log_mag = exp_decompose(q, k)
    assert torch.allclose(log_sim + log_mag, q @ k.transpose(-1, -2) / 4.0, atol=1e-12, rtol=0)
    # Each factor against its own independent formula: RBF of lengthscale d^(1/4) and the L2 magnitude.
    ref_sim = -torch.cdist(q, k).pow(2) / (2 * math.sqrt(16))
    ref_mag = (q.norm(dim=-1).pow(2).unsqueeze(-1) + k.norm(dim=-1).pow(2).unsqueeze(-2)) / (2 * math.sqrt(16))
    assert torch.allclose(log_sim, ref_sim, atol=1e-10)
    assert torch.allclose(log_mag, ref_mag, atol=1e-12)
    # The public entry point, by name and with an explicit scale; float32 too.
    s1, m1 = ka.decompose("exp:scale=0.3", q, k)
    assert torch.allclose(s1 + m1, 0.3 * q @ k.transpose(-1, -2), atol=1e-12)
    q32, k32 = q.float(), k.float()
    s2, m2 = ka.decompose(ka.make_kernel("exp"), q32, k32)
    assert torch.allclose(s2 + m2, ka.make_kernel("exp").log_kernel(q32, k32), atol=2e-5, rtol=1e-6)


def test_proposition_2_matches_gat_logit_and_paper_form():
    e, h, d, slope = 50, 3, 6, 0.2
    x_i, x_j = torch.randn(e, h, d, dtype=torch.float64), torch.randn(e, h, d, dtype=torch.float64)
    a_i, a_j = torch.randn(h, d, dtype=torch.float64), torch.randn(h, d, dtype=torch.float64)
    log_sim, log_mag = gat_decompose(x_i, x_j, a_i, a_j, slope)
    a = torch.cat([a_i, a_j], -1)
    pre = (torch.cat([x_i, x_j], -1) * a).sum(-1)
    assert (pre > 0).any() and (pre < 0).any()          # both LeakyReLU branches are exercised
    assert torch.allclose(log_sim + log_mag, F.leaky_relu(pre, slope), atol=1e-12)
    # The paper's form with explicit concatenated vectors q = [x_i||0], k = [0||x_j].
    zero = torch.zeros_like(x_i)
    q, k = torch.cat([x_i, zero], -1), torch.cat([zero, x_j], -1)
    c = torch.where(pre >= 0, 1.0, slope).unsqueeze(-1)
    ca = c * a
    ref_sim = -((q - ca).norm(dim=-1) ** 2) / 2 - ((ca - k).norm(dim=-1) ** 2) / 2
    ref_mag = (2 * ca.norm(dim=-1) ** 2 + q.norm(dim=-1) ** 2 + k.norm(dim=-1) ** 2) / 2
    assert torch.allclose(log_sim, ref_sim, atol=1e-12) and torch.allclose(log_mag, ref_mag, atol=1e-12)


@pytest.mark.parametrize("p", [0.5, 1.0, 1.5, 2.0, 3.0])
def test_lp_norm_squared_matches_torch(p):
    x = torch.randn(4, 9, dtype=torch.float64)
    x[0, :3] = 0.0
    assert torch.allclose(lp_norm_sq(x, p), torch.linalg.vector_norm(x, ord=p, dim=-1) ** 2, rtol=1e-10)


def test_lp_norm_small_p_and_zeros_stay_finite():
    x = torch.randn(3, 8, requires_grad=True)
    with torch.no_grad():
        x[1] = 0.0                      # an all-zero vector
        x[2, :4] = 0.0                  # zeros must contribute nothing, even for small p
    for p in (1e-3, 0.05, 0.5):
        out = lp_norm_sq(x, p)
        assert torch.isfinite(out).all() and out[1] == 0
        out.sum().backward()
        assert torch.isfinite(x.grad).all()
        x.grad = None
    half = torch.cat([x[2, 4:].detach(), torch.zeros(4)])
    assert torch.allclose(lp_norm_sq(half, 0.5), lp_norm_sq(x[2, 4:].detach(), 0.5), rtol=1e-5)


@pytest.mark.parametrize("spec", IKA)
def test_every_kernel_is_similarity_plus_magnitude(spec):
    kern = ka.make_kernel(spec, n_heads=2, d_head=8).double().eval()
    assert isinstance(kern, SimilarityMagnitudeKernel)
    q, k = torch.randn(2, 2, 5, 8, dtype=torch.float64), torch.randn(2, 2, 6, 8, dtype=torch.float64)
    log_sim, log_mag = ka.decompose(kern, q, k)
    assert torch.allclose(log_sim + log_mag, kern.log_kernel(q, k), atol=1e-12)
    assert log_sim.shape == log_mag.shape == (2, 2, 5, 6)
    if kern.use_magnitude:
        d = 8
        denom = 2 * d ** 0.25 if getattr(kern, "official_scale", False) else 2 * math.sqrt(d)
        ref = (torch.linalg.vector_norm(q, ord=kern.p, dim=-1).pow(2).unsqueeze(-1)
               + torch.linalg.vector_norm(k, ord=kern.p, dim=-1).pow(2).unsqueeze(-2)) / denom
        assert torch.allclose(log_mag, ref, atol=1e-10)
    else:
        assert (log_mag == 0).all()
    # Similarities are bounded by 1 (log <= 0, up to eps for the implicit ones).
    assert (log_sim <= math.log(1 + 1e-5) + 1e-12).all()


@pytest.mark.parametrize("spec", IKA)
def test_each_similarity_is_its_formula_pair_by_pair(spec):
    """log_similarity against IKA's scalar formulas (reference.log_similarity_value), one (query, key) pair and
    head at a time, with the call's spectral points: the random-feature products of the vectorised code against
    the sums of cosines of Eqs. 12-16."""
    from kernel_attention.reference import log_similarity_value

    kern = ka.make_kernel(spec, n_heads=2, d_head=8).double().eval()
    q, k = torch.randn(1, 2, 3, 8, dtype=torch.float64), torch.randn(1, 2, 4, 8, dtype=torch.float64)
    log_sim, _ = ka.decompose(kern, q, k)
    name = kern.name if kern.name in ("rbf-only", "expsin") else "implicit"
    ws = kern.prepare(q, k) if name == "implicit" else None
    params = ({"ws": None, "lengthscale": kern.lengthscale, "period": getattr(kern, "period", None)}
              if ws is None else {"freq_scale": kern.freq_scale, "eps": kern.eps})
    for h in range(2):
        for i in range(3):
            for j in range(4):
                if ws is not None:
                    params["ws"] = [w[0, h] for w in ws]
                want = log_similarity_value(name, q[0, h, i], k[0, h, j], **params)
                torch.testing.assert_close(log_sim[0, h, i, j], want, rtol=1e-10, atol=1e-10)


def test_similarities_agree_with_the_dot_product_near_the_diagonal():
    # rbf-only is exactly Prop. 1's similarity; expsin matches it to second order for small q - k.
    q = torch.randn(1, 1, 4, 8, dtype=torch.float64)
    k = q + 1e-3 * torch.randn_like(q)
    ref, _ = exp_decompose(q, k)
    rbf = ka.make_kernel("rbf-only").log_similarity(q, k)
    assert torch.allclose(rbf, ref, atol=1e-10)
    diag = torch.diagonal(ka.make_kernel("expsin").log_similarity(q, k), dim1=-2, dim2=-1)
    ref_diag = torch.diagonal(ref, dim1=-2, dim2=-1)
    assert torch.allclose(diag, ref_diag, rtol=1e-3, atol=1e-12)


def test_linear_magnitude_is_linear_times_magnitude_up_to_a_row_constant():
    q, k = torch.randn(1, 2, 4, 8, dtype=torch.float64), torch.randn(1, 2, 5, 8, dtype=torch.float64)
    kern = ka.make_kernel("linear-magnitude")
    exact = (q @ k.transpose(-1, -2) / math.sqrt(8)) * magnitude(q, k).exp()
    got = kern.kernel(q, k)
    ratio = got / exact
    assert torch.allclose(ratio, ratio[..., :1].expand_as(ratio), rtol=1e-10)
    w = ka.attention(q, k, torch.randn(1, 2, 5, 3, dtype=torch.float64), kernel=kern, need_weights=True)[1]
    assert torch.allclose(w, exact / exact.sum(-1, keepdim=True), atol=1e-10)


def test_decompose_rejects_kernels_without_a_decomposition():
    with pytest.raises(ValueError, match="no similarity x magnitude decomposition"):
        ka.decompose("poly", torch.randn(1, 1, 2, 4), torch.randn(1, 1, 2, 4))


def test_decompose_by_name_takes_kernels_without_weights_only():
    """By name, ikan would be a new random kernel at each call: its module is asked for instead."""
    q, k = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 5, 4)
    with pytest.raises(ValueError, match="kernel 'ikan' has learned weights: pass the kernel module itself"):
        ka.decompose("ikan", q, k)
    kern = ka.make_kernel("ikan", n_heads=2, d_head=4).eval()
    first = ka.decompose(kern, q, k)
    assert all(torch.equal(a, b) for a, b in zip(first, ka.decompose(kern, q, k)))
    assert ka.decompose("rbf-only", q, k)[0].shape == (1, 2, 3, 5)
