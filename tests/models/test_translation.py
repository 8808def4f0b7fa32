"""TranslationModel: causality, padding, per-place attention configs and the decoding entry points."""

import pytest
import torch

from kernel_attention.filters import make_filter
from kernel_attention.models import MODELS, TranslationModel
from kernel_attention.registry import SpecError


def tiny(**kw):
    cfg = dict(d_model=32, n_heads=4, d_ff=64, enc_layers=2, dec_layers=2, dropout=0.0)
    cfg.update(kw)
    return TranslationModel(17, 19, **cfg).double().eval()


TD_TABLE3 = dict(pe_at_input=False,
                 encoder_attention={"position": "product", "symmetric": True},
                 cross_attention={"position": "product", "symmetric": True},
                 decoder_attention={"position": "none", "symmetric": True})

# IKA Table 3's MIKAN: the density pools the source in A, the encoder's keys only in B, nothing in C
MIKAN = dict(encoder_attention={"kernel": "mikan:R=8"}, cross_attention={"kernel": "mikan:R=8,amortized=keys"},
             decoder_attention={"kernel": "mikan:R=8,amortized=false"})


@pytest.mark.parametrize("kw", [{}, TD_TABLE3, {"pe_at_input": False, "encoder_attention": {"position": "shaw"},
                                                "decoder_attention": {"position": "xl"},
                                                "cross_attention": {"position": "product"}}])
def test_decoder_is_causal_and_source_padding_is_ignored(kw):
    torch.manual_seed(0)
    model = tiny(**kw)
    src = torch.randint(4, 17, (2, 6))
    tgt = torch.randint(4, 19, (2, 5))
    out = model(src, tgt)
    assert out.shape == (2, 5, 19)
    tgt2 = tgt.clone()
    tgt2[:, 3:] = 4
    torch.testing.assert_close(model(src, tgt2)[:, :3], out[:, :3])
    # appending padding to the source changes nothing
    src_pad = torch.cat([src, torch.zeros(2, 3, dtype=torch.long)], 1)
    torch.testing.assert_close(model(src_pad, tgt), out)
    # decode_step is the last position of the full decoder
    enc = model.encode(src)
    torch.testing.assert_close(model.decode_step(tgt, enc), torch.log_softmax(out[:, -1], -1))


def test_decoder_filter_stays_causal_when_user_asks_full():
    model = tiny(decoder_attention={"filter": "full"})
    m = model.decoder[0].self_attn.filter.mask(4, 4)
    assert torch.equal(m, make_filter("causal").mask(4, 4))
    model = tiny(decoder_attention={"filter": "local:window=1"})
    m = model.decoder[0].self_attn.filter.mask(4, 4)
    assert torch.equal(m, make_filter("causal").mask(4, 4) & make_filter("local:window=1").mask(4, 4))


@pytest.mark.parametrize("spec", ["full|causal", "causal|local:window=1", "memory|full", "causal|strided:stride=2",
                                  "causal&local:window=2", "memory"])
def test_a_decoder_filter_that_names_causal_keeps_no_future_key(spec):
    """A union with causal keeps future keys; the decoder's filter is the user's within causal all the same."""
    for tq, tk in ((4, 4), (3, 6)):
        m = tiny(decoder_attention={"filter": spec}).decoder[0].self_attn.filter.mask(tq, tk)
        causal = make_filter("causal").mask(tq, tk)
        assert torch.equal(m, make_filter(spec).mask(tq, tk) & causal)


def test_attention_maps_and_places():
    model = tiny(**TD_TABLE3)
    assert model.encoder[0].self_attn.position.name == "product"
    assert model.decoder[0].self_attn.position.name == "none"
    assert model.decoder[0].cross_attn.position.name == "product"
    src, tgt = torch.randint(4, 17, (1, 6)), torch.randint(4, 19, (1, 5))
    w = model.attention_maps(src, tgt)
    assert len(w["encoder"]) == 2 and w["encoder"][0].shape == (1, 4, 6, 6)
    assert w["decoder"][1]["self"].shape == (1, 4, 5, 5) and w["decoder"][1]["cross"].shape == (1, 4, 5, 6)
    torch.testing.assert_close(w["decoder"][0]["self"].sum(-1), torch.ones(1, 4, 5, dtype=torch.double))
    assert torch.all(w["decoder"][0]["self"][0, :, 0, 1:] == 0)


def test_sharing_and_tying():
    shared = TranslationModel(20, 20, d_model=16, n_heads=2, d_ff=32, enc_layers=1, dec_layers=1,
                              share_embeddings=True)
    assert shared.src_embed is shared.tgt_embed and shared.output is None
    untied = TranslationModel(20, 21, d_model=16, n_heads=2, d_ff=32, enc_layers=1, dec_layers=1, tie_output=False)
    assert untied.output.weight.shape == (21, 16)
    with pytest.raises(ValueError, match="joint vocabulary"):
        TranslationModel(20, 21, share_embeddings=True)


def test_default_sizes_are_transformer_iwslt_de_en():
    m = MODELS.create("translation", src_vocab=100, tgt_vocab=100)
    assert len(m.encoder) == 6 and len(m.decoder) == 6
    blk = m.encoder[0]
    assert blk.self_attn.n_heads == 4 and blk.self_attn.d_model == 512 and blk.ffn[0].out_features == 1024
    assert blk.norm == "post" and blk.drop.p == 0.3 and m.src_embed.scale == pytest.approx(512 ** 0.5)


def test_bad_configs_fail_naming_the_place():
    with pytest.raises(SpecError, match=r"cross_attention \(B\).*needs position='shaw'"):
        tiny(cross_attention={"value_position": "relative", "position": "product"})
    with pytest.raises(SpecError, match=r"decoder_attention \(C\).*unknown position 'rotary'"):
        tiny(decoder_attention={"position": "rotary"})
    with pytest.raises(SpecError, match="unknown model"):
        MODELS.create("seq2seq")


def test_similarity_and_magnitude_decomposition_recovers_the_weights():
    """exp(q.k/sqrt d) = similarity x magnitude (IKA Prop. 1): the recorded terms give the layer's weights."""
    from kernel_attention.models.common import collect_decompositions
    model = tiny(pe_at_input=True)
    src, tgt = torch.randint(4, 17, (2, 6)), torch.randint(4, 19, (2, 5))
    parts = collect_decompositions(model, lambda: model(src, tgt))
    assert [p["module"] for p in parts][:2] == ["encoder.0.self_attn", "encoder.1.self_attn"]
    w = model.attention_maps(src, tgt)["encoder"][0]
    p = parts[0]
    torch.testing.assert_close(torch.softmax(p["log_similarity"] + p["log_magnitude"], -1), w)
    assert torch.all(p["log_similarity"] <= 1e-12)          # an RBF similarity is at most 1
    assert not hasattr(model.encoder[0].self_attn, "__dict__") or "project" not in model.encoder[0].self_attn.__dict__


def test_xl_biases_shared_within_each_place():
    model = tiny(pe_at_input=False, encoder_attention={"position": "xl"}, decoder_attention={"position": "xl"})
    enc = {id(b.self_attn.position.u) for b in model.encoder}
    dec = {id(b.self_attn.position.v) for b in model.decoder}
    assert len(enc) == 1 and len(dec) == 1 and enc != dec
    assert set(model.xl_biases.keys()) == {"encoder", "decoder"}
    names = [n for n, _ in model.named_parameters() if n.endswith((".u", ".v")) or "xl_biases" in n]
    assert len(names) == 4                          # two pairs, each registered once


@pytest.mark.parametrize("kw", [{}, TD_TABLE3, {"norm": "pre", "pe_at_input": False,
                                                "decoder_attention": {"position": "xl"},
                                                "cross_attention": {"position": "shaw"}},
                                {"decoder_attention": {"position": "shaw", "value_position": "relative",
                                                       "filter": "local:window=2"}}, MIKAN])
def test_incremental_step_equals_recomputing_the_prefix(kw):
    torch.manual_seed(3)
    model = tiny(**kw)
    src = torch.randint(4, 17, (3, 6))
    src[2, 4:] = 0                                            # a padded source
    tgt = torch.randint(4, 19, (3, 5))
    enc = model.encode(src)
    state = {"enc": enc, "cache": None}
    for t in range(1, 6):
        lp, state = model.step(tgt[:, :t], state)
        torch.testing.assert_close(lp, model.decode_step(tgt[:, :t], enc))
    assert state["cache"][0].shape == (3, 5, 32)
    # beam search reorders the cache with the hypotheses
    idx = torch.tensor([2, 2, 0])
    re = model.reorder_state(state, idx)
    torch.testing.assert_close(re["cache"][1], state["cache"][1][idx])
    torch.testing.assert_close(re["enc"]["out"], enc["out"][idx])


@pytest.mark.parametrize("kw", [{}, MIKAN])
def test_no_target_position_sees_a_later_one(kw):
    """Teacher forcing gives position t what decoding the prefix up to t gives it."""
    torch.manual_seed(3)
    model = tiny(**kw)
    src, tgt = torch.randint(4, 17, (2, 6)), torch.randint(4, 19, (2, 5))
    enc = model.encode(src)
    full = torch.log_softmax(model(src, tgt), -1)
    for t in range(1, 6):
        torch.testing.assert_close(full[:, t - 1], model.decode_step(tgt[:, :t], enc))


@pytest.mark.parametrize("kernel", ["mikan", "ikan", "ikas"])
def test_a_cross_attention_pooling_the_target_positions_is_refused(kernel):
    """An amortised density in the cross-attention of a causal decoder would pool later target positions."""
    with pytest.raises(SpecError, match=f"use '{kernel}:amortized=keys'"):
        tiny(cross_attention={"kernel": kernel})
    tiny(cross_attention={"kernel": f"{kernel}:amortized=keys"})
    tiny(cross_attention={"kernel": f"{kernel}:amortized=false"})


@pytest.mark.parametrize("place, where", [("decoder_attention", r"decoder_attention \(C\)"),
                                          ("encoder_attention", r"encoder_attention \(A\)")])
def test_a_pooling_kernel_under_a_hiding_filter_names_its_place(place, where):
    """The refusal says which of the model's attentions it concerns, as the config's other errors do."""
    with pytest.raises(SpecError, match=f"^{where}.*'ikan:amortized=false'"):
        tiny(**{place: {"kernel": "ikan", "filter": "causal"}})
