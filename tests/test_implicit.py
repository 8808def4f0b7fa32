"""Implicit kernels: Propositions 3 and 5, weights, stability, gradients, sharing, regulariser."""

import math

import pytest
import torch

import kernel_attention as ka
from kernel_attention.kernels.implicit import IKASKernel, regularization, share_spectral
from kernel_attention.registry import SpecError
from kernel_attention.kernels.spectral import gaussian_kl

POSITIVE = ["rbf-only", "expsin", "ikas", "ikans", "ikan", "ikan:p=0.7", "ikan-direct", "mikan",
            "mikan:official=true"]
FILTERS = ["full", "causal", "causal&local:window=2", "strided:stride=3", "padding"]


def _qkv(b=2, h=2, t=9, d=8, scale=1.0, dtype=torch.float32):
    return (scale * torch.randn(b, h, t, d, dtype=dtype), scale * torch.randn(b, h, t, d, dtype=dtype),
            torch.randn(b, h, t, 4, dtype=dtype))


def test_names_are_registered_with_typed_params():
    for name in ["rbf-only", "expsin", "linear-magnitude", "ikas", "ikans", "ikan", "ikan-direct", "mikan"]:
        assert name in ka.KERNELS
    assert ka.KERNELS.validate("ikan:p=1.8,R=32") == ("ikan", ka.KERNELS.validate("ikan")[1] | {"p": 1.8, "R": 32})
    with pytest.raises(SpecError, match="even"):
        ka.KERNELS.validate("ikan:R=63")
    with pytest.raises(SpecError, match="no parameter p"):
        ka.KERNELS.validate("ikas:p=1.0")           # IKAS/IKANS use the L2 magnitude
    with pytest.raises(ValueError, match="needs n_heads and d_head"):
        ka.make_kernel("mikan")
    k = ka.make_kernel("ikan:R=16", n_heads=3, d_head=4)
    assert k.R == 16 and k.density.d == 4 and k.positive


def test_proposition_3_squared_random_fourier_kernel_approaches_rbf():
    # w ~ N(0, I/(2 l^2))  =>  f^2 -> exp(-||q-k||^2 / (2 l^2)) as R grows; error falls like 1/sqrt(R).
    d, l = 6, 1.5
    kern = IKASKernel(n_heads=1, d_head=d)
    q, k = torch.randn(1, 1, 20, d, dtype=torch.float64), torch.randn(1, 1, 20, d, dtype=torch.float64)
    q, k = q * 0.7, k * 0.7                                     # distances where the RBF is not ~0
    target = torch.exp(-torch.cdist(q, k).pow(2) / (2 * l * l))
    errors = []
    for R in (8, 64, 512, 4096):
        errs = []
        for seed in range(4):
            g = torch.Generator().manual_seed(seed)
            w = torch.randn(1, 1, R, d, generator=g, dtype=torch.float64) / (math.sqrt(2) * l)
            errs.append((kern.similarity(q, k, [w]).pow(2) - target).abs().mean())
        errors.append(torch.stack(errs).mean().item())
    assert all(a > b for a, b in zip(errors, errors[1:])), errors
    assert errors[-1] < 0.02 and errors[0] > 4 * errors[-1], errors


def _weights(kern, q, k, mask=None, key_mask=None):
    v = torch.zeros(*k.shape[:-1], 1, dtype=q.dtype)
    return ka.attention(q, k, v, kernel=kern, mask=mask, key_mask=key_mask, need_weights=True)[1]


def test_proposition_5_weights_tend_to_uniform_on_the_argmax_set():
    torch.manual_seed(3)
    d = 4
    kern = ka.make_kernel("ikan", n_heads=1, d_head=d).double().eval()
    q = torch.randn(1, 1, 3, d, dtype=torch.float64)
    k = torch.randn(1, 1, 7, d, dtype=torch.float64)
    # ||k||_p ~ d^(1/p) * geometric mean of |k_i| as p -> 0: the argmax is the largest geometric mean.
    best = k.abs().log().mean(-1).argmax(-1).item()
    target = torch.zeros(7, dtype=torch.float64)
    target[best] = 1.0
    dist = []
    for p in (2.0, 0.5, 0.1, 0.02):
        kern.p = p
        w = _weights(kern, q, k)[0, 0]
        dist.append((w - target).abs().max().item())
    assert dist[-1] < 1e-6 and dist[-2] < dist[0], dist
    # A tied argmax set: q = 0 and keys k, -k have equal similarity and equal Lp norms -> 1/2 each.
    q0 = torch.zeros(1, 1, 1, d, dtype=torch.float64)
    k2 = torch.cat([k, -k[:, :, best:best + 1]], dim=2)
    kern.p = 0.02
    w = _weights(kern, q0, k2)[0, 0, 0]
    target = torch.zeros(8, dtype=torch.float64)
    target[best] = target[7] = 0.5
    assert torch.allclose(w, target, atol=1e-6)


@pytest.mark.parametrize("spec", POSITIVE)
@pytest.mark.parametrize("filt", FILTERS)
def test_weights_are_nonnegative_and_rows_sum_to_one(spec, filt):
    kern = ka.make_kernel(spec, n_heads=2, d_head=8)
    q, k, _ = _qkv()
    key_mask = torch.ones(2, 9, dtype=torch.bool)
    key_mask[1, -3:] = False
    for mode in (kern.train, kern.eval):
        mode()
        w = _weights(kern, q, k, mask=filt, key_mask=key_mask)
        assert torch.isfinite(w).all() and (w >= 0).all()
        keep = ka.make_filter(filt).mask(9, 9, q.device, key_mask) & key_mask[:, None, None, :]
        has_key = keep.expand(2, 1, 9, 9).any(-1).expand(2, 2, 9)
        assert not has_key.all() or filt != "causal&local:window=2"   # the empty-row case is exercised
        assert torch.allclose(w.sum(-1)[has_key], torch.ones(()), atol=1e-5)
        assert (w.sum(-1)[~has_key] == 0).all()


@pytest.mark.parametrize("spec", ["ikas", "ikan:p=0.001", "ikan-direct:p=0.01", "mikan:p=0.05", "mikan:official=true",
                                  "expsin", "rbf-only"])
def test_no_nan_long_sequences_large_norms_small_p(spec):
    att = ka.KernelAttention(16, 2, kernel=spec)  # amortised kernels refuse a causal filter (see attention.py)
    for t, scale in ((512, 1.0), (16, 1e4)):
        x = (scale * torch.randn(1, t, 16)).requires_grad_()
        y = att(x)
        loss = y.square().mean() + regularization(att)
        loss.backward()
        assert torch.isfinite(y).all() and torch.isfinite(loss)
        assert all(torch.isfinite(p.grad).all() for p in att.parameters() if p.grad is not None)
        assert torch.isfinite(x.grad).all()
        att.zero_grad()


@pytest.mark.parametrize("spec", ["ikas", "ikans", "ikan", "mikan"])
def test_gradients_reach_generator_inference_network_and_copula(spec):
    att = ka.KernelAttention(16, 4, kernel=spec)
    y = att(torch.randn(2, 6, 16))
    (y.square().mean() + regularization(att, n_train=100)).backward()
    dens = att.kernel.density
    groups = {"generator": dens.generators, "inference": dens.posterior_net}
    if spec == "mikan":
        groups["copula"] = dens.copula
    for name, module in groups.items():
        grads = [p.grad for p in module.parameters()]
        assert all(g is not None and torch.isfinite(g).all() for g in grads), name
        assert sum(g.abs().sum() for g in grads) > 0, name
    # The task loss alone (no regulariser) reaches the generator and the inference network.
    att.zero_grad()
    att(torch.randn(2, 6, 16)).square().mean().backward()
    assert dens.generators[0].net[0].weight.grad.abs().sum() > 0
    assert dens.posterior_net.mu.weight.grad.abs().sum() > 0


def test_ikan_direct_learns_spectral_points_and_has_no_kl():
    att = ka.KernelAttention(16, 2, kernel="ikan-direct:R=8")
    assert att.kernel.density is None and att.kernel.w[0].shape == (2, 8, 8)
    att(torch.randn(1, 5, 16)).sum().backward()
    assert att.kernel.w[0].grad.abs().sum() > 0 and att.kernel.w[1].grad.abs().sum() > 0
    assert regularization(att) == 0


def test_eval_is_deterministic_and_training_samples():
    kern = ka.make_kernel("mikan:R=8", n_heads=2, d_head=8)
    q, k, _ = _qkv()
    assert not torch.equal(kern.log_kernel(q, k), kern.log_kernel(q, k))
    kern.eval()
    a, b = kern.log_kernel(q, k), kern.log_kernel(q, k)
    assert torch.equal(a, b)
    # The R points of the fixed noise: z~ = mu + std L eps (eps = eval_noise[0], the same for every example),
    # z = [z~, -z~], w = sign(z) NN(|z|); the copula's L eps standardised, as in training.
    post = kern.density.posterior(q, k)
    eps = kern.eval_noise[0].expand(q.shape[0], -1, -1, -1)                 # (B, H, R/2, d)
    sigma = post.L @ post.L.transpose(-1, -2)                              # (B, d, H, H)
    x = torch.einsum("bdhm,bmrd->bhrd", post.L, eps) / sigma.diagonal(dim1=-2, dim2=-1).sqrt().permute(0, 2, 1)[:, :, None]
    z = post.mu[:, :, None] + post.log_std.exp()[:, :, None] * x
    ws = kern.density.spectral(torch.cat([z, -z], 2))
    ref = (kern.similarity(q, k, ws).pow(2) + kern.eps).log()
    torch.testing.assert_close(kern.log_similarity(q, k), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["ikas", "ikan", "mikan"])
def test_evaluation_estimates_the_trained_kernel(name):
    """Evaluation's similarity is one R-point estimate of the expected similarity the training draws average to:
    within the Monte Carlo error of that estimate (the density's mean alone would give one frequency pair)."""
    torch.manual_seed(0)
    kern = ka.make_kernel(f"{name}:R=512", n_heads=2, d_head=8).double()
    kern.density.posterior_net.offset = 0.0  # a wide posterior (std about 1): one frequency pair is far off
    q, k, _ = _qkv()
    q, k = q.double(), k.double()
    train = torch.stack([kern.similarity(q, k, kern.prepare(q, k)) for _ in range(40)]).mean(0)
    kern.eval()
    assert (kern.similarity(q, k, kern.prepare(q, k)) - train).abs().max() < 0.15


def test_regularization_is_the_documented_weighted_kl():
    att = ka.KernelAttention(16, 2, kernel="ikan:kl_weight=0.5,prior_std=0.2")
    x = torch.randn(3, 5, 16)
    att(x)
    q, k = att.project(x, x, *[torch.arange(5)[None, :, None]] * 2)[:2]
    post = att.kernel.density.posterior(q, k)
    ref = torch.distributions.kl_divergence(torch.distributions.Normal(post.mu, post.log_std.exp()),
                                            torch.distributions.Normal(0.0, 0.2)).sum()
    assert torch.allclose(gaussian_kl(post.mu, post.log_std, 0.2), ref, rtol=1e-5)
    assert torch.allclose(regularization(att, n_train=10), 0.5 * ref / 10, rtol=1e-5)
    assert regularization(torch.nn.Linear(2, 2)) == 0
    for bad in (0, -5, float("nan"), True):
        with pytest.raises(ValueError, match="n_train is the number of training examples, a number > 0"):
            regularization(att, n_train=bad)


def test_share_spectral_uses_one_density_per_structure():
    layers = torch.nn.ModuleList([ka.KernelAttention(16, 2, kernel="ikan"), ka.KernelAttention(32, 4, kernel="ikan"),
                                  ka.KernelAttention(16, 4, kernel="ikan"), ka.KernelAttention(16, 2, kernel="mikan"),
                                  ka.KernelAttention(16, 2, kernel="mikan:share=false")])
    n_before = sum(p.numel() for p in layers.parameters())
    assert share_spectral(layers) == 1                     # only the second ikan (same d_head = 8)
    assert share_spectral(layers) == 0                     # idempotent
    ks = [layer.kernel for layer in layers]
    assert ks[0].density is ks[1].density and ks[2].density is not ks[0].density  # d_head 4
    assert ks[3].density is not ks[4].density and ks[3].density is not ks[0].density
    assert sum(p.numel() for p in layers.parameters()) < n_before
    # Layers sharing a density still record their own KL.
    x = torch.randn(1, 4, 16)
    layers[0](x)
    layers[1](torch.randn(1, 4, 32))
    assert ks[0].regularization() != ks[1].regularization()


def test_official_flags():
    q, k, _ = _qkv(dtype=torch.float64)
    paper = ka.make_kernel("ikan", n_heads=2, d_head=8).double().eval()
    code = ka.make_kernel("ikan:official=true", n_heads=2, d_head=8).double().eval()
    code.load_state_dict(paper.state_dict())
    assert code.freq_scale == 2 * math.pi and code.magnitude_dropout == 0.1
    ratio = code.log_magnitude(q, k) / paper.log_magnitude(q, k)
    assert torch.allclose(ratio, torch.full_like(ratio, math.sqrt(8) / 8 ** 0.25))
    code.train()
    torch.manual_seed(1)
    logit = code.log_kernel(q, k)
    torch.manual_seed(1)                                    # same spectral sample as inside log_kernel
    m1 = logit - code.log_similarity(q, k, code.prepare(q, k))
    kept = m1 != 0                                          # dropout on the magnitude logits, rescaled
    assert 0 < kept.float().mean() < 1
    mag = code.log_magnitude(q, k)
    assert torch.allclose(m1[kept], (mag / 0.9)[kept], atol=1e-8)


def test_padding_does_not_enter_the_pooled_density():
    """KernelAttention hands the key mask to the amortised q(z|h): padding tokens change nothing."""
    torch.manual_seed(0)
    att = ka.KernelAttention(16, 2, kernel="ikan").eval()
    x = torch.randn(1, 5, 16)
    padded = torch.cat([x, 100 * torch.randn(1, 3, 16)], dim=1)
    key_mask = torch.tensor([[True] * 5 + [False] * 3])
    torch.testing.assert_close(att(padded, key_mask=key_mask)[:, :5], att(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spec", ["ikan:official=true,p=3.0", "ikan-direct:official=true", "mikan:official=true"])
def test_blockwise_magnitude_dropout_is_per_block_and_redrawn(spec):
    """The blocked path's log k with magnitude dropout: each entry is log_sim + log_mag / (1 - p) (kept) or
    log_sim (dropped), against the kernel's own decompose; about p of the entries dropped; a block called
    again (as the backward pass does) gets the same mask, another block another."""
    torch.manual_seed(0)
    kern = ka.make_kernel(spec, n_heads=2, d_head=8).double().train()
    q, k, _ = _qkv(b=2, h=2, t=40, dtype=torch.float64)
    torch.manual_seed(3)
    state, f = kern.blockwise(q, k)
    torch.manual_seed(3)                                    # the same spectral sample as in blockwise
    log_sim, log_mag = kern.decompose(q, k)
    rows, cols = slice(8, 24), slice(0, 40)
    blk = f(rows, cols, q, k, *state)
    assert torch.equal(blk, f(rows, cols, q, k, *state))
    sim, mag = log_sim[..., rows, cols], log_mag[..., rows, cols]
    kept = torch.isclose(blk, sim + mag / 0.9, rtol=0, atol=1e-9)
    dropped = torch.isclose(blk, sim, rtol=0, atol=1e-9)
    assert bool((kept | dropped).all()) and not bool((kept & dropped).any())
    assert 0.03 < dropped.double().mean().item() < 0.2     # p = 0.1 over 2560 entries
    other = f(slice(24, 40), cols, q, k, *state) - log_sim[..., 24:40, :]
    assert not torch.equal(other == 0, dropped)
    kern.eval()                                             # no dropout outside training
    state, f = kern.blockwise(q, k)
    sim, mag = kern.decompose(q, k)
    assert torch.allclose(f(rows, cols, q, k, *state), (sim + mag)[..., rows, cols], atol=1e-9)


def test_magnitude_dropout_trains_on_squared_and_blockwise_and_auto_keeps_dense_below_the_thresholds(monkeypatch):
    """In training the official kernels run on squared, and with dropout on the weights (which squared does not
    take) on blockwise (no (Tq, Tk) mask kept), with gradients that match finite differences when the seed is
    fixed, i.e. the backward pass redraws each block's mask.  ``auto`` takes squared above the CPU policy's
    squared_dropout_dense_elements (B, H, Tq, Tk) elements and blockwise above its dropout_blocked_elements
    (both lowered here); below, they decline and dense runs the call."""
    import dataclasses

    from kernel_attention.backends.policy import POLICIES

    monkeypatch.setitem(POLICIES, "cpu", dataclasses.replace(POLICIES["cpu"], squared_dropout_dense_elements=40 * 40,
                                                              dropout_blocked_elements=48 * 48))
    kern = ka.make_kernel("ikan-direct:official=true,p=3.0", n_heads=1, d_head=4).double().train()
    q, k, v = (torch.randn(1, 1, 48, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    why = ka.explain(q, k, v, kern, "causal", backend="blockwise:block=1024", dropout_p=0.2)
    assert "3 blocks of 21 query rows, log k per block" in why.reasons["blockwise"], why
    assert "dropout acts on the soft-max" in ka.explain(q, k, v, kern, "causal", dropout_p=0.2).reasons["squared"]
    for t, dropout, name, declined, note in (
            (40, 0.0, "dense", "squared", "dense was faster up to 1600"),
            (41, 0.0, "squared", None, "summed apart"),
            (48, 0.2, "dense", "blockwise", "dense was faster up to 2304"),
            (49, 0.2, "blockwise", None, "log k per block")):
        x = torch.randn(1, 1, t, 4, dtype=torch.float64)
        why = ka.explain(x, x, x, kern, "causal", dropout_p=dropout)
        assert why.name == name, why
        if declined is None:
            assert note in why.reasons[name], why
        else:
            reason = why.reasons[declined]
            assert reason.startswith("declined: ") and "draws magnitude dropout (training)" in reason, why
            assert note in reason, why

    def f(q, k, v, dropout=0.2):
        torch.manual_seed(0)
        backend = "blockwise:block=1024" if dropout else "squared:block=1024"
        return ka.attention(q, k, v, kern, "causal", dropout_p=dropout, backend=backend)
    assert torch.equal(f(q, k, v), f(q, k, v))
    assert torch.autograd.gradcheck(f, (q, k, v))
    assert torch.autograd.gradcheck(lambda q, k, v: f(q, k, v, 0.0), (q, k, v))
    kern.eval()
    c = ka.explain(q, k, v, kern, "causal")
    assert c.name == "squared" and "k / sum k" in c.reasons["squared"] and "summed apart" not in c.reasons["squared"], c


def test_the_functional_api_pools_the_amortized_density_over_real_keys_only():
    """A call's padding mask reaches the kernel's pooled q(z|h) for that call alone, whoever calls: the values
    of padded keys change nothing, and the kernel holds no mask after the call."""
    torch.manual_seed(0)
    kern = ka.make_kernel("ikas", n_heads=2, d_head=4).eval()
    q, k, v = (torch.randn(1, 2, 6, 4) for _ in range(3))
    km = torch.tensor([[True] * 4 + [False] * 2])
    moved = k.clone()
    moved[..., 4:, :] = 100.0
    torch.testing.assert_close(ka.attention(q, k, v, kernel=kern, key_mask=km),
                               ka.attention(q, moved, v, kernel=kern, key_mask=km))
    assert kern.pool_key_mask is None
    assert not torch.allclose(ka.attention(q, k, v, kernel=kern), ka.attention(q, moved, v, kernel=kern))
    qm = torch.tensor([[True] * 3 + [False] * 3])  # the queries pooled are the call's query_mask, not its key_mask
    q_moved = q.clone()
    q_moved[..., 3:, :] = 100.0
    torch.testing.assert_close(ka.attention(q, k, v, kernel=kern, query_mask=qm)[..., :3, :],
                               ka.attention(q_moved, k, v, kernel=kern, query_mask=qm)[..., :3, :])
    assert kern.pool_query_mask is None
    with pytest.raises(ValueError, match=r"query_mask must be a bool \(B, Tq\) = \(1, 6\)"):
        ka.attention(q, k, v, kernel=kern, query_mask=km[:, :5])


@pytest.mark.parametrize("kernel", ["ikan", "ikas", "mikan"])
def test_a_cross_attention_pools_its_real_queries(kernel):
    """Cross-attention (Tq = Tk, so no length tells the queries from the keys): the context's key mask drops no
    real query from the pooled density, and padded queries named by query_mask change nothing; a TransformerBlock
    passes its segment's padding mask so."""
    torch.manual_seed(0)
    att = ka.KernelAttention(16, 4, kernel=kernel).eval()
    tgt, ctx = torch.randn(1, 5, 16), torch.randn(1, 5, 16)
    ctx_mask = torch.tensor([[True, True, False, False, False]])
    moved = tgt.clone()
    moved[:, 2:] += 10.0  # real queries: they enter the pooled density
    assert not torch.allclose(att(tgt, ctx, key_mask=ctx_mask)[:, :2], att(moved, ctx, key_mask=ctx_mask)[:, :2])
    qm = torch.tensor([[True, True, True, False, False]])
    padded = tgt.clone()
    padded[:, 3:] = 100 * torch.randn(1, 2, 16)
    torch.testing.assert_close(att(tgt, ctx, query_mask=qm)[:, :3], att(padded, ctx, query_mask=qm)[:, :3])
    torch.testing.assert_close(att(tgt, ctx, query_mask=qm)[:, :3], att(tgt[:, :3], ctx), rtol=1e-5, atol=1e-5)
    block = ka.TransformerBlock(16, 4, 32, attention={"kernel": "exp"}, cross_attention={"kernel": kernel}).eval()
    torch.testing.assert_close(block(tgt, key_mask=qm, context=ctx)[:, :3],
                               block(padded, key_mask=qm, context=ctx)[:, :3])


@pytest.mark.parametrize("kernel", ["ikan", "ikas", "mikan"])
def test_built_on_the_meta_device_then_loaded_it_evaluates_as_built_directly(kernel):
    """The fixed evaluation noise is in no checkpoint: moved off the meta device (to_empty) it is drawn again,
    instead of holding uninitialised memory (NaN outputs)."""
    torch.manual_seed(0)
    ref = ka.KernelAttention(16, 4, kernel=kernel).eval()
    with torch.device("meta"):
        lazy = ka.KernelAttention(16, 4, kernel=kernel)
    assert lazy.kernel.eval_noise.is_meta
    lazy = lazy.to_empty(device="cpu")
    lazy.load_state_dict(ref.state_dict())
    x = torch.randn(2, 6, 16)
    torch.testing.assert_close(lazy.eval()(x), ref(x))


@pytest.mark.parametrize("kernel", ["ikan", "mikan"])
def test_a_module_copies_and_pickles_after_a_call_with_gradients(kernel):
    """The last call's KL term (part of that call's graph) stays behind: deepcopy (an EMA of the weights) and
    torch.save of the whole module work between training steps, and the copy computes as the original."""
    import copy
    import io

    torch.manual_seed(0)
    layer = ka.KernelAttention(16, 4, kernel=kernel)
    layer(torch.randn(2, 6, 16)).sum().backward()
    twin = copy.deepcopy(layer)
    assert layer.kernel.regularization().requires_grad and not twin.kernel._record
    torch.save(layer, io.BytesIO())
    x = torch.randn(2, 6, 16)
    torch.testing.assert_close(twin.eval()(x), layer.eval()(x))
