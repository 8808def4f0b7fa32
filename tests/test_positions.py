"""Positional schemes: the module against per-pair formulas, TXL's _rel_shift, Shaw's clipping, axes."""

import math

import pytest
import torch

import kernel_attention as ka
from kernel_attention.reference import filter_keep, module_loop

POSITIONS = ["none", "absolute", "absolute:encoding=learned,max_len=32", "shaw:clip=2", "shaw:clip=50",
             "xl", "xl:clamp_len=3", "product"]


def _layer(position, kernel="exp", value_position="none", filt="full", symmetric=False, d=12, H=3):
    torch.manual_seed(0)
    return ka.KernelAttention(d, H, kernel=kernel, position=position, value_position=value_position,
                              filter=filt, symmetric=symmetric).double()


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("kernel", ["exp", "rbf", "poly", "periodic"])
def test_self_attention_matches_loop(position, kernel):
    layer = _layer(position, kernel, filt="causal")
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    ref = module_loop(layer, x, keep=filter_keep("causal", 5, 5))
    torch.testing.assert_close(layer(x), ref, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("value_position", ["none", "absolute"])
def test_memory_and_value_function_match_loop(position, value_position):
    """Transformer-XL memory (queries aligned lower right) with Eq. 7 / Eq. 8 values."""
    layer = _layer(position, value_position=value_position, filt="memory")
    x, mem = torch.randn(2, 3, 12, dtype=torch.float64), torch.randn(2, 4, 12, dtype=torch.float64)
    ref = module_loop(layer, x, memory=mem, keep=filter_keep("memory", 3, 7))
    torch.testing.assert_close(layer(x, memory=mem), ref, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("position", ["none", "absolute", "shaw:clip=3", "shaw:clip=50", "xl", "product"])
def test_cross_attention_matches_loop(position):
    """Encoder-decoder: t_q is the decoder position, t_k the encoder position."""
    layer = _layer(position, symmetric=position == "product")
    dec, enc = torch.randn(2, 3, 12, dtype=torch.float64), torch.randn(2, 6, 12, dtype=torch.float64)
    torch.testing.assert_close(layer(dec, enc), module_loop(layer, dec, enc), rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("kernel", ["exp", "linear", "poly"])
def test_shaw_relative_values_match_loop(kernel):
    layer = _layer("shaw:clip=2", kernel, value_position="relative", filt="causal")
    x = torch.randn(2, 6, 12, dtype=torch.float64)
    ref = module_loop(layer, x, keep=filter_keep("causal", 6, 6))
    torch.testing.assert_close(layer(x), ref, rtol=1e-8, atol=1e-10)


def test_shaw_clipping_ties_far_distances():
    """Beyond the clip distance every key gets the same table row: the positional factor is flat."""
    layer = _layer("shaw:clip=2")
    x = torch.randn(1, 8, 12, dtype=torch.float64)
    pos = ka.positions.encodings.as_positions(torch.arange(8), 1)
    q, k, _, terms = layer.project(x, x, pos, pos)
    log_t = terms.log_factor()  # (1, H, 8, 8)
    row = log_t[0, :, 7]  # query at 7: distances 7..0
    assert torch.allclose(row[:, :6], row[:, :1].expand(-1, 6))  # distances 7..2 >= clip -> same row
    assert not torch.allclose(row[:, 6], row[:, 5])  # distance 1 has a row of its own


@pytest.mark.parametrize("clip,reach", [(50, 7), (1024, 7), (6, 6), (2, 2)])
def test_shaw_forms_the_logits_of_the_table_rows_its_distances_reach(clip, reach):
    """On the default positions (3 queries after 4 memory keys: distances -2..6) a wide table is read at its
    2c' + 1 middle rows, c' = 7 the least 2^n - 1 covering the distances (c when c is not wider): the same
    output, input and table gradients as the whole table read at positions given explicitly (not known to be
    the defaults, so not cut)."""
    layer = _layer(f"shaw:clip={clip}", value_position="relative", filt="memory")
    x, mem = torch.randn(2, 3, 12, dtype=torch.float64), torch.randn(2, 4, 12, dtype=torch.float64)
    pos = ka.positions.encodings.as_positions(torch.arange(7), 1)
    widths = [layer.project(x, torch.cat([mem, x], 1), pos[:, 4:], pos, off)[3].relative[0][0].shape[-1]
              for off in (4, None)]
    assert widths == [2 * reach + 1, 2 * clip + 1]
    grads = []
    for given in (False, True):
        layer.zero_grad()
        xi = x.clone().requires_grad_()
        out = layer(xi, memory=mem, **(dict(pos_q=torch.arange(4, 7), pos_k=torch.arange(7)) if given else {}))
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
        grads.append([out, xi.grad, layer.position.key_tables[0].grad, layer.position.value_tables[0].grad])
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-10, atol=1e-12)


def _rel_shift(x):
    """kimiyoung/transformer-xl mem_transformer.py _rel_shift, for x of shape (qlen, klen, ...)."""
    zero_pad = torch.zeros((x.size(0), 1, *x.size()[2:]), device=x.device, dtype=x.dtype)
    x_padded = torch.cat([zero_pad, x], dim=1)
    x_padded = x_padded.view(x.size(1) + 1, x.size(0), *x.size()[2:])
    return x_padded[1:].view_as(x)


def test_xl_equals_transformer_xl_rel_shift():
    """Our (q + v)·W_R R gathered by distance equals TXL's BD term after _rel_shift (kept entries)."""
    torch.manual_seed(3)
    qlen, mlen, H, d, dm = 4, 3, 2, 5, 10
    klen = qlen + mlen
    layer = ka.KernelAttention(dm, H, d_head=d, position="xl", bias=False).double()
    xl = layer.position
    w = torch.randn(klen, 1, dm, dtype=torch.float64)  # [mem; segment], TXL is time-major
    q = (w[-qlen:] @ layer.q_proj.weight.t()).view(qlen, 1, H, d)
    k = (w @ layer.k_proj.weight.t()).view(klen, 1, H, d)
    # TXL: pos_seq = klen-1 .. 0.  TXL concatenates [sin | cos] halves where we interleave them: a fixed
    # permutation of the same features that W_R absorbs, so both sides use our sinusoid here.
    pos_seq = torch.arange(klen - 1, -1, -1.0, dtype=torch.float64)
    pos_emb = ka.positions.encodings.sinusoid(pos_seq, dm, torch.float64)
    r_head_k = (pos_emb @ xl.r_net[0].weight.t().double()).view(klen, H, d)
    AC = torch.einsum("ibnd,jbnd->ijbn", q + xl.u, k)
    BD = _rel_shift(torch.einsum("ibnd,jnd->ijbn", q + xl.v, r_head_k))
    txl = (AC + BD) / math.sqrt(d)  # (qlen, klen, 1, H)
    keep = torch.triu(torch.ones(qlen, klen), 1 + mlen) == 0
    pos = ka.positions.encodings.as_positions(torch.arange(klen), 1)
    qh, kh, _, terms = layer.project(w[-qlen:].transpose(0, 1), w.transpose(0, 1), pos[:, -qlen:], pos)
    ours = (layer.kernel.log_kernel(qh, kh) + terms.log_factor())[0].permute(1, 2, 0)  # (qlen, klen, H)
    torch.testing.assert_close(ours[keep], txl[:, :, 0][keep], rtol=1e-10, atol=1e-10)


def test_xl_biases_can_be_shared():
    a, b = _layer("xl"), _layer("xl")
    a.position.share_biases(b.position.u, b.position.v)
    assert a.position.u is b.position.u
    with pytest.raises(ValueError, match="shape"):
        a.position.share_biases(torch.nn.Parameter(torch.zeros(2, 2)), b.position.v)


def test_product_kernel_is_product_of_symmetric_kernels():
    """Eq. 9: k = k_F(f) · k_T(t); both factors symmetric, the positional one PSD in t."""
    layer = _layer("product", symmetric=True)
    x = torch.randn(1, 6, 12, dtype=torch.float64)
    pos = ka.positions.encodings.as_positions(torch.arange(6), 1)
    q, k, _, terms = layer.project(x, x, pos, pos)
    log_t = terms.log_factor()[0]
    assert torch.allclose(log_t, log_t.transpose(-1, -2))
    assert torch.linalg.eigvalsh(log_t.exp()).min() > -1e-9
    assert sum(p.numel() for p in layer.parameters()) == 4 * (12 * 12 + 12) - (12 * 12 + 12) + 12 * 12


def test_product_projects_self_attention_positions_once():
    """In self-attention (with or without a memory) the queries' default positions are the keys' last
    rows, so t W_T is formed once and sliced; the same values passed as separate tensors are projected
    twice and give the same output and gradient."""
    layer = _layer("product")
    w = layer.position.w_t[0]
    rows = []
    w.register_forward_hook(lambda m, i, o: rows.append(i[0].shape[1]))
    x, mem = torch.randn(2, 5, 12, dtype=torch.float64), torch.randn(2, 3, 12, dtype=torch.float64)
    for memory, tk in ((None, 5), (mem, 8)):
        results = []
        for pos in ({}, {"pos_q": torch.arange(tk - 5, tk), "pos_k": torch.arange(tk)}):
            rows.clear()
            out = layer(x, memory=memory, **pos)
            results.append((out, torch.autograd.grad(out.square().sum(), w.weight)[0], list(rows)))
        (once, g_once, r_once), (twice, g_twice, r_twice) = results
        assert r_once == [tk] and r_twice == [tk, 5]
        torch.testing.assert_close(once, twice, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(g_once, g_twice, rtol=1e-12, atol=1e-12)


def test_two_axis_product_and_shaw_multiply_one_kernel_per_axis():
    """Image-Transformer style (H x W) positions: the log positional factor is a sum over axes."""
    torch.manual_seed(0)
    grid = torch.stack(torch.meshgrid(torch.arange(2), torch.arange(3), indexing="ij"), -1).reshape(6, 2)
    for position in ["product", "shaw:clip=1", "xl"]:
        layer = ka.KernelAttention(12, 3, position=position, axes=2).double()
        x = torch.randn(1, 6, 12, dtype=torch.float64)
        q, k, _, terms = layer.project(x, x, grid[None], grid[None])
        total = terms.log_factor()
        per_axis = []
        for a in range(2):
            single = ka.KernelAttention(12, 3, position=position, axes=1).double()
            sp = single.position
            if position == "product":
                sp.w_t[0].weight.data.copy_(layer.position.w_t[a].weight)
            elif position.startswith("shaw"):
                sp.key_tables[0].data.copy_(layer.position.key_tables[a])
            else:
                sp.r_net[0].weight.data.copy_(layer.position.r_net[a].weight)
                sp.u.data.zero_()
                if a == 0:
                    sp.u.data.copy_(layer.position.u)
                sp.v.data.copy_(layer.position.v)
            p = grid[None, :, a:a + 1]
            per_axis.append(sp.terms(q, k, p, p).log_factor())
        torch.testing.assert_close(total, per_axis[0] + per_axis[1])
        assert layer(x, pos_q=grid, pos_k=grid).shape == (1, 6, 12)


def test_absolute_adds_encoding_at_every_layer_input():
    layer = _layer("absolute")
    f = torch.zeros(1, 4, 12, dtype=torch.float64)
    t = ka.positions.encodings.SinusoidalEncoding(12)(torch.arange(4)).double()
    assert torch.allclose(layer.position.inputs(f, ka.positions.encodings.as_positions(torch.arange(4), 1)), t)


def test_sinusoid_matches_textbook_formula():
    from kernel_attention.reference import sinusoid_value
    enc = ka.positions.encodings.sinusoid(torch.tensor([0, 3, 17]), 8)
    for i, p in enumerate([0, 3, 17]):
        torch.testing.assert_close(enc[i].double(), sinusoid_value(p, 8), rtol=1e-6, atol=1e-6)


def test_sinusoid_range_is_the_sinusoid_of_the_distances_and_kept():
    """Transformer-XL's table of distances: sinusoid_range(lo, hi) is sinusoid(lo..hi) (clamped when asked),
    and a second call with the same arguments returns the same tensor instead of forming it again."""
    from kernel_attention.positions.encodings import sinusoid, sinusoid_range

    d = torch.arange(-7, 5)
    got = sinusoid_range(-7, 4, 16, torch.float32, torch.device("cpu"))
    torch.testing.assert_close(got, sinusoid(d, 16, torch.float32), rtol=0, atol=0)
    assert sinusoid_range(-7, 4, 16, torch.float32, torch.device("cpu")) is got
    clamped = sinusoid_range(-7, 4, 16, torch.float64, torch.device("cpu"), 3)
    torch.testing.assert_close(clamped, sinusoid(d.clamp(-3, 3), 16, torch.float64), rtol=0, atol=0)
    assert clamped.dtype == torch.float64 and not torch.equal(clamped.float(), got)


def test_default_positions_align_queries_to_the_last_keys():
    """Self-attention: the queries are the last Tq keys (a memory in front); more queries than keys is an error
    that says so; cross-attention numbers both from 0."""
    from kernel_attention.positions import default_positions
    pq, pk = default_positions(3, 5, "cpu", True)
    assert pq[..., 0].tolist() == [[2, 3, 4]] and pk[..., 0].tolist() == [[0, 1, 2, 3, 4]]
    assert default_positions(6, 5, "cpu", False)[0][..., 0].tolist() == [[0, 1, 2, 3, 4, 5]]
    with pytest.raises(ValueError, match="Tq=6 queries and Tk=5 keys"):
        default_positions(6, 5, "cpu", True)
    assert default_positions(2, 5, "cpu", False, query_offset=3)[0][..., 0].tolist() == [[3, 4]]


@pytest.mark.parametrize("position", ["none", "absolute", "shaw:clip=3", "shaw:clip=50", "xl", "product"])
def test_query_offset_places_the_default_query_positions(position):
    """Cross-attention from queries at o..o+Tq-1 (a decoder's tokens after its cached ones): ``query_offset=o``
    is ``pos_q = arange(o, o + Tq)``, per pair as the loop gives it; with ``pos_q`` as well it is an error."""
    layer = _layer(position, symmetric=position == "product")
    dec, enc = torch.randn(2, 3, 12, dtype=torch.float64), torch.randn(2, 6, 12, dtype=torch.float64)
    ref = module_loop(layer, dec, enc, pos_q=range(4, 7))
    torch.testing.assert_close(layer(dec, enc, query_offset=4), ref, rtol=1e-8, atol=1e-10)
    with pytest.raises(ValueError, match="query_offset"):
        layer(dec, enc, pos_q=torch.arange(4, 7), query_offset=4)


def test_a_layer_that_reads_no_positions_forms_none(monkeypatch):
    """Position ``none`` with values without positions (Eq. 8) reads no positions: a call given none forms none
    (a per-call cost on the host) and gives what a call given the defaults gives."""
    import kernel_attention.nn.attention as module

    layer = _layer("none", filt="causal")
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    want = layer(x, pos_q=torch.arange(5), pos_k=torch.arange(5))
    monkeypatch.setattr(module, "default_positions", lambda *a, **k: pytest.fail("default positions formed"))
    torch.testing.assert_close(layer(x), want, rtol=0, atol=0)
    assert not layer.reads_positions
    assert _layer("absolute").reads_positions and _layer("none", value_position="absolute").reads_positions
