"""MIKAN's Gaussian copula: identity copula = IKAN, real correlation across heads, the copula term."""

import torch

import kernel_attention as ka


def _pair(h=4, d=6):
    ikan = ka.make_kernel("ikan:R=8", n_heads=h, d_head=d)
    mikan = ka.make_kernel("mikan:R=8", n_heads=h, d_head=d)
    mikan.density.load_state_dict(ikan.density.state_dict() | {k: v for k, v in mikan.density.state_dict().items()
                                                                 if k.startswith("copula.")})
    return ikan, mikan


def test_identity_copula_samples_exactly_as_ikan():
    ikan, mikan = _pair()
    torch.nn.init.zeros_(mikan.density.copula.weight)
    torch.nn.init.zeros_(mikan.density.copula.bias)           # u = tanh(0) = 0  ->  L = I
    q, k = torch.randn(2, 4, 5, 6), torch.randn(2, 4, 5, 6)
    p_i, p_m = ikan.density.posterior(q, k), mikan.density.posterior(q, k)
    assert torch.equal(p_m.L, torch.eye(4).expand(2, 6, 4, 4))
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    z_i, _ = ikan.density.sample(p_i, 2000, generator=g1)
    z_m, _ = mikan.density.sample(p_m, 2000, generator=g2)
    assert torch.allclose(z_i, z_m, atol=1e-6)
    # Same kernel values for the same draw, and no copula term.
    torch.manual_seed(0)
    a = ikan.log_kernel(q, k)
    torch.manual_seed(0)
    b = mikan.log_kernel(q, k)
    assert torch.allclose(a, b, atol=1e-5)
    assert mikan._record["copula"] == 0 and torch.allclose(mikan._record["kl"], ikan._record["kl"])
    # Marginals N(mu, std^2) per head and dimension.
    half = z_m[:, :, :1000]
    assert torch.allclose(half.mean(2), p_m.mu, atol=4 * p_m.log_std.exp().max().item() / 1000 ** 0.5)
    assert torch.allclose(half.std(2), p_m.log_std.exp(), rtol=0.15)


def _correlated_mikan(h=4, d=3, spec="mikan"):
    kern = ka.make_kernel(spec, n_heads=h, d_head=d)
    with torch.no_grad():
        kern.density.copula.weight.mul_(20.0)                  # strong, clearly non-identity copula
        kern.density.copula.bias.fill_(0.8)
    q, k = torch.randn(1, h, 7, d), torch.randn(1, h, 7, d)
    return kern, kern.density.posterior(q, k)


def _sample_corr(x):
    """x (1, H, n, d) -> empirical correlation across heads per dimension (d, H, H)."""
    x = x[0].permute(2, 0, 1)                                   # (d, H, n)
    x = x - x.mean(-1, keepdim=True)
    cov = x @ x.transpose(-1, -2) / x.shape[-1]
    s = cov.diagonal(dim1=-2, dim2=-1).rsqrt()
    return cov * s.unsqueeze(-1) * s.unsqueeze(-2)


def test_copula_correlates_heads_as_sigma():
    kern, post = _correlated_mikan()
    L = post.L[0]                                               # (d, H, H)
    sigma = L @ L.transpose(-1, -2)
    s = sigma.diagonal(dim1=-2, dim2=-1).rsqrt()
    corr = sigma * s.unsqueeze(-1) * s.unsqueeze(-2)            # independent reference from L
    off = ~torch.eye(4, dtype=torch.bool)
    assert corr[:, off].abs().max() > 0.3                       # the test copula is far from identity
    g = torch.Generator().manual_seed(0)
    z, x = kern.density.sample(post, 2 * 40000, generator=g)
    emp = _sample_corr(x.detach())
    assert torch.allclose(emp, corr.detach(), atol=0.03)
    assert torch.allclose(kern.density.correlation(post)[0], corr, atol=1e-6)
    # Also in z itself (z~ = mu + std X, an affine map per head keeps correlations).
    assert torch.allclose(_sample_corr(z[:, :, :40000].detach()), corr.detach(), atol=0.03)
    # Unit-variance marginals after standardisation.
    assert torch.allclose(x.std(2), torch.ones(()), atol=0.03)


def test_official_rowsum_does_not_mix_heads():
    kern, post = _correlated_mikan(spec="mikan:official_rowsum=true")
    x = kern.density.noise(post, 40000, rowsum=True, generator=torch.Generator().manual_seed(0))
    emp = _sample_corr(x.detach())
    assert torch.allclose(emp, torch.eye(4).expand_as(emp), atol=0.03)


def test_copula_term_is_minus_half_log_det_correlation():
    kern, post = _correlated_mikan()
    _, term = kern.density.regularizer(post, None)
    corr = kern.density.correlation(post)
    ref = -0.5 * torch.linalg.slogdet(corr.double())[1].sum()
    assert term > 0 and torch.allclose(term.double(), ref, rtol=1e-4)


def test_official_sampling_flags():
    kern, post = _correlated_mikan(spec="mikan:official=true")
    g = torch.Generator().manual_seed(0)
    z, x = kern.density.sample(post, 200, rowsum=True, clamp=True, negatives=True, generator=g)
    assert x.abs().max() <= 2.0
    # Independent negative half (not exactly -z~), centred on -mu.
    assert not torch.allclose(z[:, :, 100:], -z[:, :, :100])
    paper, _ = kern.density.sample(post, 200, generator=g)
    assert torch.equal(paper[:, :, 100:], -paper[:, :, :100])
    # The heuristic copula loss -sum U log(U + 1e-5).
    _, term = kern.density.regularizer(post, x, copula_loss=True)
    u = torch.distributions.Normal(0.0, 1.0).cdf(x)
    assert torch.allclose(term, -(u * (u + 1e-5).log()).sum(), rtol=1e-5)
