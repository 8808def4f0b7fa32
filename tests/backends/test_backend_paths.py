"""The special backends and forms: ``squared`` (the implicit kernels), ``banded`` (Shaw's clipped table),
``blockwise``'s slice loops (Transformer-XL's relative term, product's shared positions) and FlexAttention's
score_mod and block masks (forward on the CPU), each against ``dense`` and with the backend and form
``explain`` names."""

import pytest
import torch
from _common import NEVER, DT, D, H, capable, close, inputs, padding_mask, problem, run, sliced_from

import kernel_attention as ka
from kernel_attention.backends import BackendError
from kernel_attention.backends.dispatch import resolve_backend
from kernel_attention.functional import attention, explain
from kernel_attention.positions import default_positions, make_position

IMPLICIT = ["ikas", "ikans", "ikan", "mikan", "ikan-direct"]


@pytest.mark.parametrize("kernel", IMPLICIT)
def test_squared_matches_dense(kernel):
    """The implicit kernels run as k / sum k per block (backends/squared.py), which auto takes: values and
    gradients (the spectral density's or ikan-direct's points included) equal dense's -- and blockwise's
    soft-max of log k too, where the kernel is positive -- under a full, causal, sparse, padding (one
    sequence keeping no key) and causal & padding filter, and for Tq != Tk."""
    cases = ((None, None, 23), ("causal", None, 23), ("local:window=4", None, 23),
             (None, padding_mask(23, empty=True), 23), ("causal", padding_mask(23), 23), (None, None, 11))
    for filt, km, tq in cases:
        q, k, v = inputs(tq, 23)
        kern = ka.make_kernel(kernel, n_heads=H, d_head=D).to(DT).eval()
        c = explain(q, k, v, kern, filt, key_mask=km)
        assert c.name == "squared" and "k / sum k" in c.reasons["squared"], (filt, c)
        ref = run("dense", kernel, "none", filt, key_mask=km, tq=tq)
        names = capable(problem(kernel, "none", filt, key_mask=km, tq=tq))
        assert names[0] == "squared", names
        for name in names:
            close(run(f"{name}:block=1024", kernel, "none", filt, key_mask=km, tq=tq), ref)


def test_squared_in_training_draws_the_spectral_points_once():
    """In training the R spectral points are sampled per call (in eval mode they are all the posterior
    mean): squared draws them once, as dense does -- same output, gradients (the density's
    parameters included) and KL for the same seed."""
    q, k, v = inputs(23, 23)
    kern = ka.make_kernel("mikan", n_heads=H, d_head=D).to(DT).train()
    params = [q, k, v] + [w for w in kern.parameters() if w.requires_grad]
    res = []
    for backend in ("dense", "squared"):
        torch.manual_seed(5)
        out = attention(q, k, v, kern, "causal", backend=backend)
        grads = torch.autograd.grad(out, params, torch.ones_like(out) + out.detach(), allow_unused=True)
        res.append(((out, grads), kern.regularization()))
    close(res[1][0], res[0][0])
    torch.testing.assert_close(res[0][1], res[1][1], atol=0, rtol=0)


def _dropped_magnitude_reference(kern, q, k, v, filt, key_mask, seed):
    """Magnitude dropout written out densely: log k = log_sim + D ⊙ log_mag / (1 - p) over the whole
    (Tq, Tk) grid, soft-max over the kept keys (0 for a query that keeps none), with D assembled from
    the masks :class:`SquaredForm` documents (per block of squared's plan with 1024-element blocks, drawn in the
    block's (B, H, keys, rows) layout from ``block_seed(form.seed, r0, c0)``)."""
    from kernel_attention.backends.chunked import plan_blocks
    from kernel_attention.backends.squared import SquaredBackend
    from kernel_attention.dropout import block_seed, keep_mask
    from kernel_attention.functional import build_problem

    p = build_problem(q, k, v, kern, filt, key_mask=key_mask)
    b, h, tq, tk = p.shape
    keep, blocks = plan_blocks(p.keep, tq, tk, SquaredBackend(block=1024).rows(p))
    kern.pool_key_mask = key_mask                  # an amortized density pools over the call's real keys
    try:
        torch.manual_seed(seed)
        form = kern.squared_form(q, k)             # the call's dropout seed, after its spectral points
        torch.manual_seed(seed)
        log_sim, log_mag = kern.decompose(q, k)    # the same spectral points
    finally:
        kern.pool_key_mask = None
    dropped = torch.zeros(b, h, tq, tk, dtype=torch.bool)
    for r0, r1, lo, hi in blocks:
        if hi > lo:
            kd = keep_mask((b, h, hi - lo, r1 - r0), form.drop, block_seed(form.seed, r0, lo))
            dropped[..., r0:r1, lo:hi] = ~kd.transpose(-1, -2)
    logits = log_sim + torch.where(dropped, 0.0, log_mag / (1 - form.drop))
    if keep is not None:
        logits = logits.masked_fill(~keep, float("-inf"))
    w = torch.softmax(logits, -1).nan_to_num(0.0)  # a query with no key: 0
    return w @ v


@pytest.mark.parametrize("spec", ["ikan-direct:official=true,p=3.0", "mikan:official=true",
                                  "ikas:magnitude_dropout=0.1", "ikan-direct:official=true,magnitude_dropout=0.5"])
def test_squared_with_magnitude_dropout_matches_a_dense_reference(spec):
    """In training the official kernels drop each pair's magnitude; squared sums the kept and the
    dropped pairs apart (backends/squared.py).  Values and gradients (q, k, v and the kernel's parameters)
    equal the dense formula with the same masks under a full, causal, sparse, padding (one sequence keeping
    no key) and causal & padding filter and for Tq != Tk, over several blocks; with p = 0.5 the first causal
    rows keep no magnitude at all.  The backward draws the same masks again."""
    cases = ((None, None, 40), ("causal", None, 40), ("local:window=4", None, 40),
             (None, padding_mask(40, empty=True), 40), ("causal", padding_mask(40), 40), (None, None, 23))
    kern = ka.make_kernel(spec, n_heads=H, d_head=D).to(DT).train()
    params = [w for w in kern.parameters() if w.requires_grad]
    for filt, km, tq in cases:
        q, k, v = inputs(tq, 40)
        why = explain(q, k, v, kern, filt, key_mask=km, backend="squared:block=1024").reasons["squared"]
        assert "k / sum k" in why and "blocks of 16" in why, (filt, why)
        res = []
        for f in (lambda: (torch.manual_seed(7), attention(q, k, v, kern, filt, key_mask=km,
                                                           backend="squared:block=1024"))[1],
                  lambda: _dropped_magnitude_reference(kern, q, k, v, filt, km, 7)):
            out = f()
            grads = torch.autograd.grad(out, [q, k, v] + params, torch.ones_like(out) + out.detach())
            res.append((out, grads))
        close(res[0], res[1])


def test_squared_with_magnitude_dropout_in_float32_and_gradcheck():
    """float32 with queries whose magnitude puts the kept pairs' factor exp(c_i) beyond float32's range
    (c_i > 88): finite and equal to float64 dense's formula; and ``gradcheck`` of squared with a fixed seed
    (fails if the backward pass drew other masks)."""
    kern = ka.make_kernel("ikan-direct:official=true,p=3.0", n_heads=H, d_head=D).to(DT).train()
    q, k, v = inputs(40, 40)
    q32 = (q.detach() * torch.linspace(0.1, 10.0, 40, dtype=DT)[:, None]).requires_grad_()
    form = kern.squared_form(q32, k)
    assert float((form.query_log + form.key_log.amax(-1, keepdim=True)).max().detach()) > 88
    ref = _dropped_magnitude_reference(kern, q32, k, v, "causal", None, 3)
    torch.manual_seed(3)
    out = attention(q32.float(), k.float(), v.float(), kern.float(), "causal", backend="squared:block=1024")
    kern.double()
    assert bool(torch.isfinite(out).all())
    torch.testing.assert_close(out.double(), ref, atol=1e-4, rtol=1e-4)

    small = ka.make_kernel("ikan-direct:official=true,magnitude_dropout=0.3", n_heads=1, d_head=4).to(DT).train()
    q, k, v = (torch.randn(1, 1, 48, 4, dtype=DT, requires_grad=True) for _ in range(3))
    why = explain(q, k, v, small, "causal", backend="squared:block=1024").reasons["squared"]
    assert "3 blocks of 21 query rows" in why and "summed apart" in why, why

    def f(q, k, v):
        torch.manual_seed(0)
        return attention(q, k, v, small, "causal", backend="squared:block=1024")
    assert torch.equal(f(q, k, v), f(q, k, v))
    # fast mode: one random projection of the Jacobian rather than all 576 columns; a backward that drew other
    # masks fails it as the full check does
    assert torch.autograd.gradcheck(f, (q, k, v), fast_mode=True)


@pytest.mark.parametrize("spec", ["ikan-direct:official=true,p=3.0",
                                  "ikan-direct:official=true,magnitude_dropout=0.5"])
def test_squared_with_magnitude_dropout_in_bfloat16(spec):
    """bfloat16 inputs and parameters in training, magnitude dropout on squared: values and
    gradients (q, k, v, the kernel's points) within bfloat16's precision of the float64 formula computed from
    the same rounded inputs and parameters, causal and with padding (one sequence keeping no key).  ikan-direct
    only: the spectral kernels draw their points in the parameters' dtype, so a float64 reference would draw
    others."""
    for filt, km in (("causal", None), (None, padding_mask(40, empty=True))):
        kern = ka.make_kernel(spec, n_heads=H, d_head=D).to(torch.bfloat16).train()
        q, k, v = (x.detach().to(torch.bfloat16).requires_grad_() for x in inputs(40, 40))
        why = explain(q, k, v, kern, filt, key_mask=km, backend="squared:block=1024").reasons["squared"]
        assert "summed apart" in why, why
        torch.manual_seed(7)
        out = attention(q, k, v, kern, filt, key_mask=km, backend="squared:block=1024")
        assert out.dtype == torch.bfloat16
        grads = torch.autograd.grad(out, [q, k, v] + list(kern.parameters()), torch.ones_like(out))
        kern.double()                              # the rounded parameters, in float64
        q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
        ref = _dropped_magnitude_reference(kern, q64, k64, v64, filt, km, 7)
        refs = torch.autograd.grad(ref, [q64, k64, v64] + list(kern.parameters()), torch.ones_like(ref))
        torch.testing.assert_close(out.double(), ref, atol=6e-2, rtol=0)
        for g, r in zip(grads, refs):              # relative to each gradient's largest entry
            assert float((g.double() - r).abs().max() / r.abs().max()) < 8e-2


def test_squared_range_and_fallbacks():
    """The per-key factor exp(m_j) is taken relative to the largest m of the keys some query keeps:
    a huge key that every query drops does not underflow the others (float32 checked against float64
    dense); a kept key 40+ log-units above the rest makes squared refuse the call, which auto then runs on
    blockwise's soft-max of log k, and explain says so; blockwise on request and bfloat16 as documented."""
    q, k, v = inputs(23, 23)
    km = padding_mask(23)
    k_big = k.detach().clone()
    k_big[1, :, -1] *= 10.0   # sequence 1's last key is padding: ||k||^2 / (2 sqrt(d)) about 140 above the rest
    kern = ka.make_kernel("ikas", n_heads=H, d_head=D).eval()
    ref = attention(q, k_big, v, kern.to(DT), None, key_mask=km, backend="dense")
    kern = kern.float()
    args = (q.detach().float(), k_big.float(), v.detach().float())
    c = explain(*args, kern, None, key_mask=km)
    assert c.name == "squared" and "k / sum k" in c.reasons["squared"], c
    for backend in ("auto", "squared"):
        out = attention(*args, kern, None, key_mask=km, backend=backend)
        torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-4)
    # the same key kept: squared refuses, auto runs blockwise, still equal to dense
    c = explain(*args, kern, None)
    assert c.name == "blockwise" and "log k per block" in c.reasons["blockwise"], c
    assert "the per-key log factor spans" in c.reasons["squared"], c
    with pytest.raises(BackendError, match="the per-key log factor spans"):
        attention(*args, kern, None, backend="squared")
    ref = attention(q, k_big, v, kern.to(DT), None, backend="dense")
    kern = kern.float()
    for backend in ("auto", "blockwise"):
        torch.testing.assert_close(attention(*args, kern, None, backend=backend).double(), ref, atol=1e-5, rtol=1e-4)
    # blockwise on request for a kernel squared runs (the soft-max of log k per block)
    why = explain(*args, kern, "causal", backend="blockwise").reasons["blockwise"]
    assert "log k per block" in why and "k / sum k" not in why, why
    # a kernel without the form: squared says so, blockwise runs it
    c = explain(*args, ka.make_kernel("rbf-only", n_heads=H, d_head=D), "causal")
    assert c.name == "blockwise" and "has no squared form" in c.reasons["squared"], c
    # bfloat16 inputs: squared again, within bfloat16's precision of float64 dense
    qb, kb, vb = (x.detach().to(torch.bfloat16) for x in (q, k, v))
    c = explain(qb, kb, vb, kern.to(torch.bfloat16), "causal")
    assert c.name == "squared" and "k / sum k" in c.reasons["squared"], c
    out = attention(qb, kb, vb, kern.to(torch.bfloat16), "causal", backend="squared")
    ref = attention(qb.double(), kb.double(), vb.double(), kern.to(DT), "causal", backend="dense")
    torch.testing.assert_close(out.double(), ref, atol=3e-2, rtol=3e-2)


def test_flex_score_mod_forward_matches_dense_on_cpu():
    # FlexAttention has no backward on CPU, so the backend never picks it there; its score_mod and
    # block mask are still checked here, forward only, in eager mode, on the features the backend
    # passes it (positional features concatenated): Shaw's clipped index computed in the kernel
    # (self-attention), read from the index's two vectors or, given as a tensor, gathered from it (a memory in
    # front of the segment), product, key bias.
    from kernel_attention.backends.flex import flex_smoother, flex_why_not
    from kernel_attention.backends.base import sdpa_features
    from kernel_attention.functional import build_problem
    from kernel_attention.smoother import dense_smoother

    for kernel, position, filt, tq, tk, as_tensor in (
            ("rbf", "shaw", "causal", 32, 32, False), ("exp", "shaw:clip=3", None, 32, 32, False),
            ("exp", "shaw", "memory", 16, 32, False), ("exp", "shaw", "memory", 16, 32, True),
            ("periodic", "product", "local:window=5", 32, 32, False)):
        q, k, v = (x.detach().float() for x in inputs(tq, tk))
        pos = make_position(position, d_model=H * D, n_heads=H, d_head=D)
        pq, pk = default_positions(tq, tk, "cpu", True)
        terms = pos.terms(q, k, pq, pk)
        if as_tensor:
            terms.relative = [(lg, ix.materialize()) for lg, ix in terms.relative]
        with torch.no_grad():
            p = build_problem(q, k, v, kernel, filt, terms=terms)
            assert flex_why_not(p) is not None and flex_why_not(p, allow_cpu=True) is None
            out = flex_smoother(p, *sdpa_features(p, key_bias="mask"))
            ref, _ = dense_smoother(q, k, v, p.kernel, p.keep, p.terms)
        torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


def test_flex_grouped_key_value_heads_forward_on_cpu(monkeypatch):
    """Grouped-query attention on flex (forward, as above): FlexAttention gets the key/value heads as held with its
    ``enable_gqa`` (a key bias and Shaw's table per query head), except under ``product``'s per-head key features,
    which repeat them; equal to dense on the heads repeated by hand.  Grouped heads under a block mask ask for
    FlexAttention's main kernel (Inductor's decoding kernel, its choice for short queries, finds no configuration
    for them on CUDA)."""
    from kernel_attention.backends import flex
    from kernel_attention.backends.dispatch import resolve_backend
    from kernel_attention.functional import build_problem
    from kernel_attention.smoother import dense_smoother

    seen = []
    real = flex._flex

    def spy():
        attend, create_block_mask = real()
        def attend_seen(q, k, v, **kw):
            main = kw.get("kernel_options", {}).get("FORCE_USE_FLEX_ATTENTION", False)
            seen.append((k.shape[1], kw.get("enable_gqa", False), main))
            return attend(q, k, v, **kw)
        return attend_seen, create_block_mask

    monkeypatch.setattr(flex, "_flex", spy)
    g = torch.Generator().manual_seed(0)
    for kernel, position, filt, held in (("rbf", "shaw", "causal", True), ("exp", "none", "local:window=5", True),
                                         ("exp", "product", None, False)):
        q = torch.randn(2, 4, 32, D, generator=g)
        k, v = (torch.randn(2, 2, 32, D, generator=g) for _ in range(2))
        pos = make_position(position, d_model=4 * D, n_heads=4, d_head=D)
        pq, pk = default_positions(32, 32, "cpu", True)
        kr, vr = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
        with torch.no_grad():
            p = build_problem(q, k, v, kernel, filt, terms=pos.terms(q, k, pq, pk), enable_gqa=True)
            assert ("grouped" in resolve_backend("flex").describe(p)) == held
            out, _ = resolve_backend("flex").run(p)
            ref_p = build_problem(q, kr, vr, kernel, filt, terms=pos.terms(q, kr, pq, pk))
            ref, _ = dense_smoother(q, kr, vr, ref_p.kernel, ref_p.keep, ref_p.terms)
        torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
        assert seen[-1] == ((2, True, filt is not None) if held else (4, False, False)), (kernel, position, seen[-1])


@pytest.mark.parametrize("kernel", ["exp", "rbf", "periodic"])
@pytest.mark.parametrize("filt", [None, "causal"])
@pytest.mark.parametrize("clip", [1, 3])
def test_banded_matches_dense(kernel, filt, clip):
    """Shaw's clipped table as shifted causal SDPA calls plus a band (backends/banded.py): values and
    gradients (q, k, v, the table) equal dense and blockwise; auto takes banded and explain names it."""
    position = f"shaw:clip={clip}"
    ref = run("dense", kernel, position, filt, tq=29, tk=29)
    close(run("banded", kernel, position, filt, tq=29, tk=29), ref)
    close(run("blockwise:block=1024", kernel, position, filt, tq=29, tk=29), ref)
    q, k, v = inputs(29, 29)
    pos = make_position(position, d_model=H * D, n_heads=H, d_head=D).to(DT)
    terms = pos.terms(q, k, *default_positions(29, 29, "cpu", True))
    c = explain(q, k, v, kernel=kernel, mask=filt, terms=terms)
    assert c.name == "banded" and f"shaw clipped at {clip}" in c.reasons["banded"], c
    assert "shaw clipped" not in str(explain(q, k, v, kernel=kernel, mask=filt, terms=terms, backend="blockwise"))


@pytest.mark.parametrize("filt", [None, "causal"])
def test_banded_in_several_row_blocks_matches_dense(filt, monkeypatch):
    """banded's rows per block come from the device policy (banded_rows_full / banded_rows_causal): with 8 rows
    the 29 queries run in 4 blocks, each with its near band and far key ranges, and still equal dense."""
    import dataclasses

    from kernel_attention.backends.policy import POLICIES

    monkeypatch.setitem(POLICIES, "cpu", dataclasses.replace(POLICIES["cpu"], banded_rows_full=8, banded_rows_causal=8))
    close(run("banded", "exp", "shaw:clip=3", filt, tq=29, tk=29), run("dense", "exp", "shaw:clip=3", filt, tq=29, tk=29))


def test_banded_not_taken_where_it_does_not_apply():
    """Padding, a short sequence (T <= 4 clip), a memory in front of the segment or a relative value table
    are not banded's (it says why, auto takes blockwise, and blockwise agrees with dense)."""
    q, k, v = inputs(29, 29)
    pos = make_position("shaw:clip=3", d_model=H * D, n_heads=H, d_head=D).to(DT)
    terms = pos.terms(q, k, *default_positions(29, 29, "cpu", True))
    km = padding_mask(29)
    short = pos.terms(q[..., :12, :], k[..., :12, :], *default_positions(12, 12, "cpu", True))
    mem = pos.terms(q[..., 9:, :], k, *default_positions(20, 29, "cpu", True))
    for c, why in ((explain(q, k, v, kernel="exp", key_mask=km, terms=terms), "neither full nor causal"),
                   (explain(q[..., :12, :], k[..., :12, :], v[..., :12, :], kernel="exp", terms=short),
                    "is not above 4 x clip"),
                   (explain(q[..., 9:, :], k, v, kernel="exp", terms=mem), "the default self-attention positions")):
        assert c.name == "blockwise" and why in c.reasons["banded"], c
    with pytest.raises(BackendError, match="neither full nor causal"):
        attention(q, k, v, "exp", key_mask=km, terms=terms, backend="banded")
    assert "value table" in resolve_backend("banded").supports(
        problem("exp", "shaw:clip=3", "causal", tq=29, tk=29, value_position="relative"))
    for kw in (dict(filt="padding", key_mask=km), dict(filt="causal", value_position="relative")):
        assert capable(problem("exp", "shaw:clip=3", tq=29, tk=29, **kw)) == ["blockwise"]
        close(run("blockwise", "exp", "shaw:clip=3", tq=29, tk=29, **kw),
              run("dense", "exp", "shaw:clip=3", tq=29, tk=29, **kw))


def test_flex_block_masks_are_kept_for_spec_filters_only():
    """A BlockMask is built once per (filter spec, Tq, Tk, device); masks that depend on the batch's
    padding or on a user's tensor are built per call."""
    from kernel_attention.backends.flex import _BLOCK_MASKS, _block_mask
    from kernel_attention.filters import MaskFilter, Padding, make_filter
    from kernel_attention.functional import build_problem
    from torch.nn.attention.flex_attention import create_block_mask

    q, k, v = (x.detach().float() for x in inputs(32, 32))
    _BLOCK_MASKS.clear()
    first = _block_mask(build_problem(q, k, v, "exp", "local:window=5"), create_block_mask)
    assert _block_mask(build_problem(q, k, v, "exp", "local:window=5"), create_block_mask) is first
    assert _block_mask(build_problem(q, k, v, "exp", "local:window=6"), create_block_mask) is not first
    assert len(_BLOCK_MASKS) == 2
    _block_mask(build_problem(q, k, v, "exp", "causal", key_mask=padding_mask(32)), create_block_mask)
    _block_mask(build_problem(q, k, v, "exp", torch.ones(32, 32, dtype=torch.bool).tril()), create_block_mask)
    assert len(_BLOCK_MASKS) == 2
    assert make_filter("causal&local:window=3").by_spec and make_filter("cross").by_spec
    assert not make_filter("padding").by_spec and not make_filter("causal&padding").by_spec
    assert not Padding(padding_mask(32)).by_spec and not MaskFilter(torch.ones(32, 32, dtype=torch.bool)).by_spec
    assert not (make_filter("causal") | MaskFilter(torch.ones(32, 32, dtype=torch.bool))).by_spec


@pytest.mark.parametrize("kernel", ["exp", "rbf", "periodic"])
@pytest.mark.parametrize("filt", [None, "causal", "padding"])
def test_xl_slice_loops_match_dense(kernel, filt):
    """Transformer-XL's relative term on blockwise's slice loops, the backward per (head, block, batch element)
    slice (backends/sliced.py): values and gradients (q, k, v, W_R, u, v) equal dense and blockwise's per-block
    form (the loops off in the policy), in one block or several, rbf's key bias entering the slices' term;
    auto takes blockwise and explain names the form."""
    km = padding_mask(29) if filt == "padding" else None
    ref = run("dense", kernel, "xl", filt, tq=29, tk=29, key_mask=km)
    for backend in ("blockwise", "blockwise:block=1024"):
        close(run(backend, kernel, "xl", filt, tq=29, tk=29, key_mask=km), ref)
    with sliced_from(NEVER):
        close(run("blockwise:block=1024", kernel, "xl", filt, tq=29, tk=29, key_mask=km), ref)
    q, k, v = inputs(29, 29)
    terms = make_position("xl", d_model=H * D, n_heads=H, d_head=D).to(DT).terms(
        q, k, *default_positions(29, 29, "cpu", True))
    c = explain(q, k, v, kernel, filt, key_mask=km, terms=terms)
    assert c.name == "blockwise" and "per (head, block, batch element) slice" in c.reasons["blockwise"], c
    with sliced_from(NEVER):
        why = explain(q, k, v, kernel, filt, key_mask=km, terms=terms, backend="blockwise").reasons["blockwise"]
    assert "SDPA features per block" in why and "slice" not in why, why


def test_xl_slice_loops_memory_empty_rows_and_shared_factors():
    """The slice loops with a memory in front of the segment (Tq < Tk, lower-right causal), with queries whose
    filtered set is empty (zero output, finite gradients), and with a relative factor shared by the batch and
    the heads (q side (1, H, Tq, d), table (1, S, d)); an index that is not base + i - j, or dropout, leaves
    blockwise's per-block form."""
    for filt in ("memory", "causal"):
        close(run("blockwise:block=1024", "exp", "xl", filt, tq=11, tk=29),
              run("dense", "exp", "xl", filt, tq=11, tk=29))
    km = padding_mask(23, empty=True)
    out, grads = run("blockwise:block=1024", "exp", "xl", None, key_mask=km)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert all(torch.isfinite(g).all() for g in grads if g is not None)
    close((out, grads), run("dense", "exp", "xl", None, key_mask=km))

    q, k, v = inputs(19, 19)
    g = torch.Generator().manual_seed(3)
    q_side = torch.randn(1, H, 19, 4, generator=g, dtype=DT).requires_grad_()
    table = torch.randn(1, 37, 4, generator=g, dtype=DT).requires_grad_()
    toeplitz = (torch.arange(19)[:, None] - torch.arange(19)[None, :] + 18)[None]
    results = []
    for backend, loops in (("dense", 1), ("blockwise:block=1024", 1), ("blockwise", NEVER)):
        with sliced_from(loops):
            terms = ka.PositionalTerms(relative_factors=[(q_side, table, toeplitz)])
            out = attention(q, k, v, "exp", "causal", terms=terms, backend=backend)
            results.append((out, torch.autograd.grad(out, [q, k, v, q_side, table],
                                                     torch.ones_like(out) + out.detach())))
            if backend != "dense":
                why = explain(q, k, v, "exp", "causal", terms=terms, backend=backend).reasons["blockwise"]
                assert ("slice" in why) == (loops == 1), why
    close(results[1], results[0])
    close(results[2], results[0])
    other = toeplitz.clone()
    other[0, 0, 0] = 3  # not base + i - j at one pair
    for terms, dropout in ((ka.PositionalTerms(relative_factors=[(q_side, table, other)]), 0.0),
                           (ka.PositionalTerms(relative_factors=[(q_side, table, toeplitz)]), 0.1)):
        c = explain(q, k, v, "exp", "causal", terms=terms, dropout_p=dropout)
        why = c.reasons["blockwise"]
        assert c.name == "blockwise" and "SDPA features per block" in why and "slice" not in why, c
    torch.manual_seed(0)
    out = attention(q, k, v, "exp", "causal", terms=ka.PositionalTerms(relative_factors=[(q_side, table, other)]),
                    backend="blockwise")
    close((out, torch.autograd.grad(out, [q, k, v, q_side, table], torch.ones_like(out) + out.detach())),
          (lambda o: (o, torch.autograd.grad(o, [q, k, v, q_side, table], torch.ones_like(o) + o.detach())))(
              attention(q, k, v, "exp", "causal", terms=ka.PositionalTerms(relative_factors=[(q_side, table, other)]),
                        backend="dense")))


@pytest.mark.parametrize("kernel", ["exp", "rbf"])
def test_product_slice_loops_match_dense(kernel):
    """product's positions shared by the batch on blockwise's slice loops (one (rows, Tk) term per head and block
    for the whole batch, the backward per slice): values and gradients (W_T's summed over the batch) equal dense,
    blockwise's per-block form (the loops off in the policy) and sdpa's concatenated features, in one block or
    several, under full, causal, local and padding filters (queries with an empty set included)."""
    for filt, km in ((None, None), ("causal", None), ("local:window=4", None), (None, padding_mask(23, empty=True))):
        ref = run("dense", kernel, "product", filt, key_mask=km)
        names = capable(problem(kernel, "product", filt, key_mask=km))
        assert names == (["blockwise"] if filt == "local:window=4" else ["sdpa", "blockwise"]), names
        for backend in names + ["blockwise:block=1024"]:
            close(run(backend, kernel, "product", filt, key_mask=km), ref)
        with sliced_from(NEVER):
            close(run("blockwise:block=1024", kernel, "product", filt, key_mask=km), ref)
    q, k, v = inputs(23, 23)
    terms = make_position("product", d_model=H * D, n_heads=H, d_head=D).to(DT).terms(
        q, k, *default_positions(23, 23, "cpu", True))
    why = explain(q, k, v, kernel, "causal", terms=terms, backend="blockwise:block=1024").reasons["blockwise"]
    assert "shared by the batch" in why and "2 blocks of 16 query rows, " in why and "element) slice" in why, why
    with sliced_from(NEVER):
        why = explain(q, k, v, kernel, "causal", terms=terms, backend="blockwise").reasons["blockwise"]
    assert "SDPA features per block" in why and "slice" not in why, why
