"""The ``triton`` backend against ``dense`` in float32: values and the gradients of q, k, v and of the positional
parameters, over every kernel x position x filter it runs, with Transformer-XL's memory (Tq < Tk), empty rows and
tiles that the filter skips; the sparse filters (strided, fixed, Transformer-XL's memory filter, intersections)
computed per tile, checked pair by pair against their dense masks; Shaw's value table and a float mask or bias;
the implicit kernels' squared form (k / sum k) with the gradients of their parameters, and with magnitude dropout
against dense given the same mask.

Without CUDA the kernels run under Triton's interpreter on CPU tensors: TRITON_INTERPRET=1 is set while
tests/backends/conftest.py loads them (Triton reads it when a kernel is defined) and during each of this module's
tests, and restored after, so that no other test sees ``triton`` as able to run on the CPU.  With CUDA (a lent
GPU, ``python -m pytest -q -m "gpu or triton"``) the same tests run the compiled kernels on the device.  Skipped
where triton is not installed.
"""

import os
import subprocess
import sys

import pytest
import torch

from _common import TRITON_ON_CUDA as ON_CUDA

DEVICE = torch.device("cuda" if ON_CUDA else "cpu")

pytest.importorskip("triton", reason="triton is not installed (pip install -e '.[gpu]')")

import kernel_attention as ka  # noqa: E402
from kernel_attention.backends import ORDER, choose  # noqa: E402
from kernel_attention.backends.dispatch import BackendError, resolve_backend  # noqa: E402
from kernel_attention.functional import attention, build_problem, validation  # noqa: E402
from kernel_attention.positions import default_positions, make_position  # noqa: E402

pytestmark = pytest.mark.triton

B, H, D = 2, 2, 8
DT = torch.float32
KERNELS = ["exp", "rbf", "periodic"]
POSITIONS = ["none", "shaw", "xl", "product"]
FILTERS = [None, "causal", "local:window=4", "padding"]


@pytest.fixture(autouse=True)
def _interpreter(monkeypatch):
    """The interpreter for this module's tests only (on CPU tensors)."""
    if not ON_CUDA:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


def _key_mask(tk, b=B, empty=True):
    """Sequence 1 padded from Tk // 2; with ``empty`` every key of sequence 0 is padding (empty rows)."""
    km = torch.ones(b, tk, dtype=torch.bool)
    km[-1, tk // 2:] = False
    if empty:
        km[0] = False
    return km.to(DEVICE)


def _setup(kernel, position, tq, tk, d=D, b=B, self_attention=True, seed=0, train=False, value="none"):
    torch.manual_seed(1)
    pos = make_position(position, d_model=H * d, n_heads=H, d_head=d, value_position=value).to(DEVICE, DT)
    kern = ka.make_kernel(kernel, n_heads=H, d_head=d).to(DEVICE, DT).train(train)
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, H, t, d, generator=g, dtype=DT).to(DEVICE).requires_grad_() for t in (tq, tk, tk))
    return pos, kern, q, k, v, default_positions(tq, tk, DEVICE, self_attention)


def _run(backend, kernel, position="none", filt=None, tq=33, tk=33, key_mask=None, d=D, b=B,
         self_attention=True, edit=None, train=False, value="none", bias=None):
    """Output and gradients (q, k, v, positional and kernel parameters, ``bias``) of one call; ``edit(q, k, v)``
    changes the inputs in place before it."""
    pos, kern, q, k, v, (pq, pk) = _setup(kernel, position, tq, tk, d, b, self_attention, train=train, value=value)
    if edit is not None:
        with torch.no_grad():
            edit(q, k, v)
    out = attention(q, k, v, kern, filt, terms=pos.terms(q, k, pq, pk), key_mask=key_mask, bias=bias,
                    backend=backend)
    params = [q, k, v] + list(pos.parameters()) + [p for p in kern.parameters() if p.requires_grad]
    params += [bias] if bias is not None and bias.requires_grad else []
    gout = torch.cos(torch.arange(out.numel(), device=DEVICE, dtype=DT)).reshape(out.shape)
    return out, torch.autograd.grad(out, params, gout, allow_unused=True)


def _close(got, ref, atol=2e-5):
    (out, grads), (out_ref, grads_ref) = got, ref
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, out_ref, atol=atol, rtol=atol)
    for i, (x, y) in enumerate(zip(grads, grads_ref)):
        if x is None or y is None:
            assert (x is None or not x.any()) and (y is None or not y.any()), i
        else:
            assert torch.isfinite(x).all(), i
            torch.testing.assert_close(x, y, atol=atol, rtol=atol, msg=lambda m: f"gradient {i}: {m}")


def _problem(kernel, position="none", filt=None, tq=33, tk=33, key_mask=None, kv_heads=None, **kw):
    pos, kern, q, k, v, (pq, pk) = _setup(kernel, position, tq, tk)
    if kv_heads is not None:  # grouped-query attention: the first kv_heads key/value heads
        k, v, kw["enable_gqa"] = k[:, :kv_heads], v[:, :kv_heads], True
    return build_problem(q, k, v, kern, filt, terms=pos.terms(q, k, pq, pk), key_mask=key_mask, **kw)


@pytest.mark.parametrize("filt", FILTERS, ids=lambda f: str(f))
@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("kernel", KERNELS)
def test_triton_matches_dense(kernel, position, filt):
    """Every kernel x position x filter the backend accepts, T = 33 in tiles of 16 (a partial last tile)."""
    km = _key_mask(33) if filt == "padding" else None
    assert resolve_backend("triton").supports(_problem(kernel, position, filt, key_mask=km)) is None
    _close(_run("triton", kernel, position, filt, key_mask=km), _run("dense", kernel, position, filt, key_mask=km))


@pytest.mark.parametrize("position,filt", [("xl", "causal"), ("shaw", "local:window=4"), ("none", "causal")])
def test_sequence_filter_with_padding(position, filt):
    """A causal or local filter and a key mask together (sequence 0 all padding: empty rows)."""
    km = _key_mask(33)
    p = _problem("rbf", position, filt, key_mask=km)
    assert resolve_backend("triton").supports(p) is None
    assert "with padding" in resolve_backend("triton").describe(p)
    _close(_run("triton", "rbf", position, filt, key_mask=km), _run("dense", "rbf", position, filt, key_mask=km))


@pytest.mark.parametrize("tq,tk,filt", [(7, 40, "causal"), (7, 40, None), (16, 40, "local:window=5"),
                                        (1, 33, "causal")])
@pytest.mark.parametrize("position", ["xl", "shaw"])
def test_memory_keys(position, tq, tk, filt):
    """Tq < Tk (a memory in front of the segment): Transformer-XL's base + i - j and Shaw's offset o."""
    _close(_run("triton", "exp", position, filt, tq, tk), _run("dense", "exp", position, filt, tq, tk))


@pytest.mark.parametrize("t", [1, 7, 40])
@pytest.mark.parametrize("position,filt", [("none", None), ("xl", "causal"), ("shaw", "local:window=4"),
                                           ("none", "padding")])
def test_lengths(t, position, filt):
    km = _key_mask(t) if filt == "padding" else None
    _close(_run("triton", "exp", position, filt, t, t, key_mask=km), _run("dense", "exp", position, filt, t, t,
                                                                          key_mask=km))


@pytest.mark.parametrize("backend", ["triton:key_bias=features", "triton:block=32"])
@pytest.mark.parametrize("position,filt", [("xl", "causal"), ("shaw", None)])
def test_head_size_batch_and_options(backend, position, filt):
    """D = 16, B = 1; rbf's key term as a feature, tiles of 32."""
    _close(_run(backend, "rbf", position, filt, 40, 40, d=16, b=1), _run("dense", "rbf", position, filt, 40, 40,
                                                                         d=16, b=1))


@pytest.mark.parametrize("kernel,position,filt", [("exp", "none", "causal"), ("rbf", "xl", "causal"),
                                                  ("exp", "shaw", None), ("rbf", "product", "local:window=4")])
def test_grouped_key_value_heads(kernel, position, filt):
    """Grouped-query attention (``enable_gqa``, H = 2 query heads on one key/value head): the kernels read the
    shared head and sum its dk, dv over the group; equal to dense on the heads repeated by hand, the gradients of the
    grouped k and v included (``product``'s per-head key features repeat the heads instead)."""
    pos, kern, q, k, v, (pq, pk) = _setup(kernel, position, 33, 33)
    kg, vg = (x.detach()[:, :1].clone().requires_grad_() for x in (k, v))
    gout = torch.cos(torch.arange(B * H * 33 * D, device=DEVICE, dtype=DT)).reshape(B, H, 33, D)
    runs = []
    for backend, kk, vv in (("triton", kg, vg), ("dense", kg.repeat_interleave(H, 1), vg.repeat_interleave(H, 1))):
        grouped = backend == "triton"
        out = attention(q, kk, vv, kern, filt, terms=pos.terms(q, kk, pq, pk), backend=backend, enable_gqa=grouped)
        runs.append((out, torch.autograd.grad(out, [q, kg, vg] + list(pos.parameters()), gout, allow_unused=True)))
    if position != "product":
        from kernel_attention.backends.triton_aot import record_launches

        assert "grouped" in resolve_backend("triton").describe(_problem(kernel, position, filt, kv_heads=1))
        launches = record_launches(lambda: attention(q, kg, vg, kern, filt, terms=pos.terms(q, kg, pq, pk),
                                                     backend="triton", enable_gqa=True))
        assert [x.args[1].shape[1] for x in launches] == [1]  # the kernel reads the key head as it is held
    _close(*runs)


def test_causal_rows_before_every_key_are_empty():
    """Tq > Tk under the lower-right causal filter: the first Tq - Tk queries see no key (zeros, zero gradient)."""
    got = _run("triton", "exp", "none", "causal", 40, 7, self_attention=False)
    _close(got, _run("dense", "exp", "none", "causal", 40, 7, self_attention=False))
    assert not got[0][:, :, :33].any()


def test_padding_without_any_real_key_gives_zeros():
    km = _key_mask(33)
    out, grads = _run("triton", "rbf", "xl", "padding", key_mask=km)
    assert not out[0].any() and not grads[0][0].any() and not grads[1][0].any()


@pytest.fixture
def tiles_of_16(monkeypatch):
    """Tiles of 16 rows and keys on every device (CUDA's default is 64): the poisoned keys [0, 16) of the tests
    below fill one key tile, which the filter skips."""
    from kernel_attention.backends import triton_flash

    monkeypatch.setattr(triton_flash, "_block", lambda p, block: block or 16)


def _poison(keys):
    """Set q, k, v at keys ``keys`` to NaN: a tile that reads them would spread NaN into what it touches."""
    def edit(q, k, v):
        k[:, :, keys] = float("nan")
        v[:, :, keys] = float("nan")
    return edit


def test_tiles_outside_the_filter_are_not_read(tiles_of_16):
    """A local window of the last 7 of 40 keys never reaches keys [0, 16) (one tile); padded key tiles are
    skipped too.  Their NaN would show in the output if a tile were read and masked instead of skipped."""
    with validation(False):
        got = _run("triton", "exp", "shaw", "local:window=4", 7, 40, edit=_poison(slice(0, 16)))
        ref = _run("dense", "exp", "shaw", "local:window=4", 7, 40)
        _close(got, ref)
        km = torch.ones(B, 40, dtype=torch.bool)
        km[:, :16] = False
        km = km.to(DEVICE)
        got = _run("triton", "rbf", "shaw", "padding", 40, 40, key_mask=km, edit=_poison(slice(0, 16)))
    ref = _run("dense", "rbf", "shaw", "padding", 40, 40, key_mask=km)
    (out, grads), (out_ref, grads_ref) = got, ref
    torch.testing.assert_close(out, out_ref, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(grads[0], grads_ref[0], atol=2e-5, rtol=2e-5)  # q's gradient
    assert torch.isfinite(grads[1][:, :, 16:]).all() and torch.isfinite(grads[2][:, :, 16:]).all()


SPARSE = ["strided:stride=4", "fixed:stride=8,c=2", "fixed:stride=5", "memory:same_length=true",
          "memory:same_length=true,mem_len=12", "causal&local:window=5", "strided:stride=3&local:window=9",
          "fixed:stride=6&padding", "memory"]


@pytest.mark.parametrize("filt", SPARSE)
def test_filter_predicates_equal_dense_masks(filt):
    """The pairs the kernels keep, walked per query tile (forward, dq) and per key tile (dk, dv), equal the filter's
    dense mask (False in every tile they skip), with memory keys (Tq < Tk), rows before every key (Tq > Tk) and
    padding; and the keys some query keeps (the squared form's key-factor range) are the mask's."""
    from kernel_attention.backends.triton_filters import kept_keys, tile_filter
    from kernel_attention.backends.triton_flash import filter_mask

    for tq, tk in [(33, 33), (7, 40), (40, 7), (20, 37)]:
        if filt == "memory:same_length=true" and tk <= tq:  # its window, the memory present, is empty
            continue
        q, k, v = (torch.randn(B, H, t, D, device=DEVICE) for t in (tq, tk, tk))
        p = build_problem(q, k, v, "exp", filt, key_mask=_key_mask(tk, empty=False))
        assert resolve_backend("triton").supports(p) is None, filt
        keep = p.keep.expand(B, H, tq, tk)
        for by_keys in (False, True):
            assert torch.equal(filter_mask(p, by_keys=by_keys), keep), (filt, tq, tk, by_keys)
        tf, km = tile_filter(p)
        kept = kept_keys(tf, tq, tk, DEVICE) & km.expand(B, H, 1, tk)[:, :, 0]
        assert torch.equal(kept, keep.any(-2)), (filt, tq, tk)


@pytest.mark.parametrize("kernel,position,filt,tq,tk", [
    ("exp", "none", "strided:stride=4", 33, 33),
    ("rbf", "shaw", "fixed:stride=8,c=2", 33, 33),
    ("exp", "xl", "memory:same_length=true", 16, 40),
    ("periodic", "product", "strided:stride=3&local:window=9", 33, 33),
    ("exp", "xl", "fixed:stride=5", 7, 40),
    ("rbf", "xl", "memory:same_length=true,mem_len=20", 16, 40),
])
def test_sparse_filters_match_dense(kernel, position, filt, tq, tk):
    """Strided, fixed and Transformer-XL's memory filter with the kernels and positions the backend runs; the last
    two with memory keys."""
    _close(_run("triton", kernel, position, filt, tq, tk), _run("dense", kernel, position, filt, tq, tk))


def test_sparse_filter_with_padding():
    km = _key_mask(33)
    _close(_run("triton", "rbf", "shaw", "strided:stride=5", key_mask=km),
           _run("dense", "rbf", "shaw", "strided:stride=5", key_mask=km))


def test_tiles_the_pattern_never_keeps_are_not_read(tiles_of_16):
    """fixed:stride=32 keeps of keys [0, 16) only the first block's queries (no summary key there): the query tile
    [32, 40) skips that key tile, so its NaN reach neither those rows nor their gradients."""
    with validation(False):
        out, grads = _run("triton", "exp", "none", "fixed:stride=32", 40, 40, edit=_poison(slice(0, 16)))
    out_ref, grads_ref = _run("dense", "exp", "none", "fixed:stride=32", 40, 40)
    torch.testing.assert_close(out[:, :, 32:], out_ref[:, :, 32:], atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(grads[0][:, :, 32:], grads_ref[0][:, :, 32:], atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("kernel,position,value", [("rbf", "shaw:clip=3", "relative"), ("exp", "xl", "none"),
                                                   ("ikan-direct:magnitude_dropout=0.1", "none", "none")])
def test_compile_check_compiles_each_specialisation_once(kernel, position, value, monkeypatch):
    """The first call of a specialisation compiles its kernels (forward, and the backward's where it
    differentiates) before the forward runs: on CUDA, compiled and loaded for the device with the installed Triton
    (none fails), and the call then matches dense (magnitude dropout draws its own mask:
    test_magnitude_dropout_matches_dense_with_its_mask); a second call with other lengths of the same
    specialisation is not checked again (tests/backends/test_triton_compile_check.py has what it compiles and what
    a failure does)."""
    from kernel_attention.backends import triton_support

    monkeypatch.setattr(triton_support, "_checked", {})
    train = "dropout" in kernel
    got = _run("triton", kernel, position, "causal", value=value, train=train)
    if not train:
        _close(got, _run("dense", kernel, position, "causal", value=value))
    assert list(triton_support._checked.values()) == [None]
    _run("triton", kernel, position, "causal", tq=20, tk=20, value=value, train=train)
    assert len(triton_support._checked) == 1


@pytest.mark.parametrize("position,filt,tq,tk", [("shaw:clip=3", None, 33, 33), ("shaw:clip=3", "causal", 7, 40),
                                                 ("shaw:clip=20", "strided:stride=4", 33, 33)])
def test_shaw_value_table(position, filt, tq, tk):
    """Shaw's a^V (positions in the value): sum_j P_ij a^V[clip(i - j)] from each row's weights summed per table
    row, with the gradients of both tables; a clip narrower than the tiles, memory keys, a sparse filter."""
    _close(_run("triton", "rbf", position, filt, tq, tk, value="relative"),
           _run("dense", "rbf", position, filt, tq, tk, value="relative"))


@pytest.mark.parametrize("value", ["none", "relative"])
@pytest.mark.parametrize("filt,tq,tk", [(None, 70, 70), ("causal", 70, 70), ("causal", 20, 70),
                                        ("local:window=24", 70, 70)])
def test_shaw_far_tiles(filt, tq, tk, value):
    """A clip of 2 in tiles of 16 over 70 keys: the key loop of each query tile and the query loop of each key tile
    meet far tiles on both sides of the diagonal (all their pairs on table row 0 or 2c: one column per row for the
    logits and dHv, one row sum for Hv and dL) beside the near ones; with memory keys (Tq < Tk) the diagonal is
    offset."""
    _close(_run("triton", "exp", "shaw:clip=2", filt, tq, tk, value=value),
           _run("dense", "exp", "shaw:clip=2", filt, tq, tk, value=value))


@pytest.mark.parametrize("shape", [(1, H, 33, 33), (B, 1, 1, 33)])
def test_float_mask_and_bias(shape):
    """A float mask (-inf drops a pair; sequence 0's query 3 loses every key: an empty row) and a bias with a
    gradient, read per tile through their broadcast strides."""
    g = torch.Generator().manual_seed(3)
    bias = torch.randn(*shape, generator=g).to(DEVICE).requires_grad_()
    mask = torch.zeros(B, 1, 33, 33)
    mask[0, 0, 3] = float("-inf")
    mask[1, 0, :, 5:9] = float("-inf")
    mask = mask.to(DEVICE)
    got = _run("triton", "exp", "xl", mask, bias=bias)
    ref = _run("dense", "exp", "xl", mask, bias=bias)
    _close(got, ref)
    assert not got[0][0, :, 3].any()


@pytest.mark.parametrize("case,why", [
    (dict(kernel="poly"), "SDPA features"),
    (dict(kernel="exp", dropout_p=0.1), "dropout"),
    (dict(kernel="exp", need_weights=True), "need_weights"),
    (dict(kernel="exp", filt="causal|local:window=4"), "filter"),
    (dict(kernel="exp", filt="strided:stride=4&fixed:stride=8"), "two sparse patterns"),
])
def test_reasons(case, why):
    case = dict(case)
    kernel, filt = case.pop("kernel"), case.pop("filt", None)
    p = _problem(kernel, "none", filt, **case)
    reason = resolve_backend("triton").supports(p)
    assert reason is not None and why in reason
    with pytest.raises(BackendError, match="triton"):
        choose(p, "triton")


def test_bool_mask_tensor_and_two_value_tables_are_refused():
    q, k, v = (torch.randn(B, H, 9, D, device=DEVICE) for _ in range(3))
    p = build_problem(q, k, v, "exp", torch.rand(9, 9, device=DEVICE) > 0.5)
    assert "boolean mask tensor" in resolve_backend("triton").supports(p)
    pos = make_position("shaw", d_model=H * D, n_heads=H, d_head=D, axes=2, value_position="relative").to(DEVICE)
    pq, pk = (torch.stack([x[..., 0], x[..., 0]], -1) for x in default_positions(9, 9, DEVICE, True))
    p = build_problem(q, k, v, "exp", terms=pos.terms(q, k, pq, pk))
    assert "more than one relative table" in resolve_backend("triton").supports(p)


@pytest.mark.skipif(ON_CUDA, reason="the interpreter's rules are for CPU tensors")
def test_cpu_needs_the_interpreter_and_auto_never_takes_it(monkeypatch):
    """On the CPU: ``auto`` passes over ``triton`` (its interpreter is for tests), and without TRITON_INTERPRET
    (every other test module) it does not even support the call."""
    assert ORDER.index("triton") == ORDER.index("sdpa") + 1
    p = _problem("exp", "shaw", "causal")
    c = choose(p)
    assert c.name != "triton" and "interpreter is for tests" in c.reasons["triton"]
    monkeypatch.delenv("TRITON_INTERPRET")
    assert "TRITON_INTERPRET" in resolve_backend("triton").supports(p)
    assert "TRITON_INTERPRET" in choose(p).reasons["triton"]


@pytest.mark.skipif(ON_CUDA, reason="the interpreter's rules are for CPU tensors")
def test_interpreter_runs_after_a_module_that_imported_triton_first():
    """A test module that imports triton without TRITON_INTERPRET (test_triton_host.py), run before this one in
    the same process, leaves the interpreter able to run the kernels: Triton's own library (``tl.zeros``) was
    loaded for it by tests/backends/conftest.py."""
    here = os.path.dirname(os.path.abspath(__file__))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          os.path.join(here, "test_triton_host.py") + "::test_host_table_has_every_variant",
                          os.path.join(here, "test_triton.py") + "::test_triton_matches_dense[exp-none-causal]"],
                         capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:]
    assert "2 passed" in run.stdout


def test_explain_describes_the_tiles():
    text = resolve_backend("triton").describe(_problem("rbf", "xl", "causal"))
    assert "Transformer-XL" in text and "key bias" in text and "tiles past the diagonal skipped" in text


@pytest.mark.parametrize("position,filt,value", [("xl", "causal", "none"), ("shaw", "local:window=4", "none"),
                                                 ("shaw", "strided:stride=4", "relative")])
def test_layer_compiles_whole_graph(position, filt, value):
    """The kernels are operators with fake implementations: a KernelAttention layer on ``triton`` compiles with
    fullgraph=True and agrees with the eager layer on ``dense``, gradients included (Shaw's value table too)."""
    torch.manual_seed(0)
    layer = ka.KernelAttention(16, 2, kernel="rbf", position=position, value_position=value, filter=filt,
                               backend="triton").to(DEVICE)
    x = torch.randn(2, 20, 16, device=DEVICE)
    got = torch.compile(layer, fullgraph=True)(x)
    grads = torch.autograd.grad(got.pow(2).sum(), list(layer.parameters()), allow_unused=True)
    layer.backend = "dense"
    ref = layer(x)
    grads_ref = torch.autograd.grad(ref.pow(2).sum(), list(layer.parameters()), allow_unused=True)
    _close((got, grads), (ref, grads_ref), atol=1e-4)


@pytest.mark.parametrize("kernel,position,filt,value", [("rbf", "xl", "causal", "none"),
                                                       ("exp", "shaw", "local:window=4", "relative"),
                                                       ("ikan-direct", "none", "causal", "none")])
def test_eager_calls_run_the_operators_implementation_directly(kernel, position, filt, value, monkeypatch):
    """An eager call of plain tensors runs the kernels' operators' implementation and autograd formula as an
    autograd Function, without the operator machinery (the operators themselves are not called); through the
    operators the call gives the same values and gradients."""
    from kernel_attention.backends import triton_flash, triton_squared

    def refuse(*args):
        raise AssertionError("an eager call went through the operator")

    with monkeypatch.context() as m:
        for module, op in ((triton_flash, "flash_forward"), (triton_flash, "flash_backward"),
                           (triton_squared, "squared_forward"), (triton_squared, "squared_backward")):
            m.setattr(module, op, refuse)
        direct = _run("triton", kernel, position, filt, value=value, train=True)
    for module in (triton_flash, triton_squared):
        monkeypatch.setattr(module, "direct", lambda *args: False)
    _close(direct, _run("triton", kernel, position, filt, value=value, train=True), atol=1e-6)


def test_fake_tensors_go_through_the_operators():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from kernel_attention.backends.triton_support import direct

    x = torch.ones(2)
    assert direct(x, None, [1], 2.0) and direct(torch.nn.Parameter(x))
    with FakeTensorMode():
        assert not direct(torch.ones(2), x)


def test_without_triton_the_reason_says_how_to_install(monkeypatch):
    from kernel_attention.backends import triton_support

    monkeypatch.setattr(triton_support, "INSTALLED", False)
    assert "pip install 'kernel-attention[gpu]'" in resolve_backend("triton").supports(_problem("exp"))


IMPLICIT = ["ikas", "ikans", "ikan", "ikan-direct", "mikan"]


@pytest.mark.parametrize("filt", FILTERS, ids=lambda f: str(f))
@pytest.mark.parametrize("kernel", IMPLICIT)
def test_implicit_kernels_match_dense(kernel, filt):
    """The squared form k / sum k in eval mode, T = 33 in tiles of 16: values, q, k, v and the kernel's
    parameters (spectral densities, spectral points) against dense's soft-max of log k."""
    km = _key_mask(33) if filt == "padding" else None
    p = _problem(kernel, "none", filt, key_mask=km)
    assert resolve_backend("triton").supports(p) is None
    assert "squared form" in resolve_backend("triton").describe(p)
    _close(_run("triton", kernel, "none", filt, key_mask=km), _run("dense", kernel, "none", filt, key_mask=km),
           atol=5e-5)


@pytest.mark.parametrize("filt", FILTERS, ids=lambda f: str(f))
@pytest.mark.parametrize("kernel,t,train", [("ikas", 7, False), ("ikan-direct", 33, True), ("ikans", 33, True)])
def test_implicit_kernels_short_and_in_training(kernel, t, train, filt):
    """A single partial tile (T = 7), and in training (no magnitude dropout by default): ikan-direct, and ikans
    with its R spectral points drawn from the density (the same draws for both backends: one seed, one draw per
    call), where eval mode's posterior mean makes them coincide."""
    km = _key_mask(t) if filt == "padding" else None
    _close(_run("triton", kernel, "none", filt, t, t, key_mask=km, train=train),
           _run("dense", kernel, "none", filt, t, t, key_mask=km, train=train), atol=5e-5)


@pytest.mark.parametrize("tq,tk,filt", [(7, 40, "local:window=5"), (40, 7, "causal"), (7, 40, "fixed:stride=8,c=2"),
                                        (16, 40, "memory:same_length=true")])
def test_implicit_kernels_memory_and_empty_rows(tq, tk, filt):
    """Tq < Tk with a local window, the fixed pattern or Transformer-XL's memory filter (keys no query keeps leave the
    key factor's range) and Tq > Tk under the causal filter (the first rows see no key: zeros)."""
    got = _run("triton", "ikan", "none", filt, tq, tk, self_attention=False)
    _close(got, _run("dense", "ikan", "none", filt, tq, tk, self_attention=False), atol=5e-5)


def test_implicit_tiles_outside_the_filter_are_not_read(tiles_of_16):
    """As test_tiles_outside_the_filter_are_not_read, on ikan-direct (no density pooled over every key)."""
    with validation(False):
        out, grads = _run("triton", "ikan-direct", "none", "local:window=4", 7, 40, edit=_poison(slice(0, 16)))
    out_ref, grads_ref = _run("dense", "ikan-direct", "none", "local:window=4", 7, 40)
    torch.testing.assert_close(out, out_ref, atol=5e-5, rtol=5e-5)
    torch.testing.assert_close(grads[0], grads_ref[0], atol=5e-5, rtol=5e-5)  # q's gradient


def test_implicit_reasons():
    triton = resolve_backend("triton")
    assert "positional terms" in triton.supports(_problem("ikas", "shaw"))
    assert "dropout" in triton.supports(_problem("ikas", dropout_p=0.1))
    kern = ka.make_kernel("ikan-direct:magnitude_dropout=0.1", n_heads=H, d_head=D).to(DEVICE).train()
    q, k, v = (torch.randn(B, H, 9, D, device=DEVICE) for _ in range(3))
    assert triton.supports(build_problem(q, k, v, kern)) is None
    assert "magnitude dropout drawn per pair" in triton.describe(build_problem(q, k, v, kern))
    kern = ka.make_kernel("ikas", n_heads=H, d_head=D).to(DEVICE).eval()
    assert "dtype" in triton.supports(build_problem(q.half(), k.half(), v.half(), kern.half()))
    k = k.clone()
    k[:, :, 0] *= 30.0  # a key whose log factor ||k||^2 / denom lies far above the others'
    assert "spans" in triton.supports(build_problem(q, k, v, kern.float()))


def _dropout_run(backend, kernel, filt, seed, monkeypatch, tq=33, tk=33, key_mask=None, drop=0.3):
    """Output and gradients of the squared form in training with magnitude dropout ``drop`` and the call's dropout
    seed fixed to ``seed``; on ``dense`` the magnitude logits are dropped with the mask the Triton kernels draw for
    that seed (:func:`~kernel_attention.backends.triton_squared.magnitude_keep_mask`)."""
    from types import SimpleNamespace

    from kernel_attention.backends.triton_squared import magnitude_keep_mask
    from kernel_attention.kernels import similarity_magnitude

    _, kern, q, k, v, _ = _setup(f"{kernel}:magnitude_dropout={drop}", "none", tq, tk, train=True)
    with monkeypatch.context() as m:
        m.setattr(kern, "dropout_seed", lambda p: seed)
        if backend == "dense":
            keep = magnitude_keep_mask(seed, drop, (B, H, tq, tk), DEVICE)
            m.setattr(similarity_magnitude, "F", SimpleNamespace(
                dropout=lambda x, p: torch.where(keep, x / (1 - p), 0.0)))
        torch.manual_seed(5)  # the spectral points a training call draws
        out = attention(q, k, v, kern, filt, key_mask=key_mask, backend=backend)
    params = [q, k, v] + [p for p in kern.parameters() if p.requires_grad]
    gout = torch.cos(torch.arange(out.numel(), device=DEVICE, dtype=DT)).reshape(out.shape)
    return out, torch.autograd.grad(out, params, gout, allow_unused=True)


@pytest.mark.parametrize("kernel,filt,tq,tk", [("ikan-direct", None, 33, 33), ("ikas", "causal", 33, 33),
                                               ("ikan-direct", "strided:stride=4", 20, 33),
                                               ("ikans", "padding", 33, 33)])
def test_magnitude_dropout_matches_dense_with_its_mask(kernel, filt, tq, tk, monkeypatch):
    """Magnitude dropout drawn per tile in the squared-form kernels equals dense given the same mask, values and
    the gradients of q, k, v and the kernel's parameters (ikas, ikans: their spectral points drawn in training)."""
    km = _key_mask(tk) if filt == "padding" else None
    _close(_dropout_run("triton", kernel, filt, 1234, monkeypatch, tq, tk, km),
           _dropout_run("dense", kernel, filt, 1234, monkeypatch, tq, tk, km), atol=5e-5)


def test_magnitude_dropout_is_seeded(monkeypatch):
    """One seed, one mask: two calls agree, values and gradients (the backward redraws the forward's mask); another
    seed gives another mask, which keeps about 1 - drop of the pairs."""
    from kernel_attention.backends.triton_squared import magnitude_keep_mask

    a = _dropout_run("triton", "ikan-direct", "causal", 77, monkeypatch)
    b = _dropout_run("triton", "ikan-direct", "causal", 77, monkeypatch)
    c = _dropout_run("triton", "ikan-direct", "causal", 78, monkeypatch)
    assert torch.equal(a[0], b[0]) and all(torch.equal(x, y) for x, y in zip(a[1], b[1]))
    assert not torch.allclose(a[0], c[0])
    keep = magnitude_keep_mask(77, 0.3, (B, H, 33, 33), DEVICE)
    assert torch.equal(keep, magnitude_keep_mask(77, 0.3, (B, H, 33, 33), DEVICE))
    assert abs(keep.float().mean().item() - 0.7) < 0.03


@pytest.mark.skipif(not ON_CUDA, reason="Triton's interpreter gets bfloat16 products wrong (the exp-family "
                    "kernels' as well): compiled kernels only")
@pytest.mark.parametrize("filt", [None, "causal"], ids=lambda f: str(f))
@pytest.mark.parametrize("kernel", ["ikas", "ikan-direct"])
def test_implicit_kernels_in_bfloat16(kernel, filt, dtype=torch.bfloat16):
    """bfloat16 inputs (float32 sums in the kernels) against dense in float32 on the same rounded inputs and
    kernel parameters."""
    pos, kern, q, k, v, _ = _setup(kernel, "none", 33, 33)
    kern = kern.to(dtype).float()
    q, k, v = (x.detach().to(dtype).float().requires_grad_() for x in (q, k, v))
    ref = attention(q, k, v, kern, filt, backend="dense")
    gref = torch.autograd.grad(ref.sum(), [q, k, v])
    low = [x.detach().to(dtype).requires_grad_() for x in (q, k, v)]
    out = attention(*low, kern.to(dtype), filt, backend="triton")
    grads = torch.autograd.grad(out.float().sum(), low)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), ref, atol=6e-2, rtol=6e-2)
    for g, r in zip(grads, gref):
        torch.testing.assert_close(g.float(), r, atol=1.5e-1, rtol=1.5e-1)
