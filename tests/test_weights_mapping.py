"""Weights of peer implementations loaded into our modules: Transformer-XL's RelPartialLearnableMultiHeadAttn
into ``KernelAttention(position="xl")`` and PyG's ``GATConv`` into ``GraphAttention``.  The peers' state dicts
are made here with their parameter names and shapes (no download), and the outputs are checked against the
peers' forward passes written out directly.  The two mapping functions are the ones docs/api/weights.rst shows.
"""

import math

import torch
import torch.nn.functional as F

import kernel_attention as ka


def txl_to_kernel_attention(sd, r_w_bias, r_r_bias):
    """A state dict for ``ka.KernelAttention(d_model, n_head, d_head=d_head, position="xl", bias=False)`` from
    a Transformer-XL ``RelPartialLearnableMultiHeadAttn`` state dict (``qkv_net``, ``o_net``, ``r_net``) and
    the model's ``r_w_bias`` / ``r_r_bias`` (n_head, d_head).  TXL's sinusoid is [sin | cos] in two halves,
    ours interleaves them, so the columns of ``r_net.weight`` are interleaved to match."""
    q, k, v = sd["qkv_net.weight"].chunk(3, dim=0)
    r = sd["r_net.weight"]
    half = r.shape[1] // 2
    r = torch.stack([r[:, :half], r[:, half:]], dim=-1).flatten(1)   # columns sin0, cos0, sin1, cos1, ...
    return {"q_proj.weight": q, "k_proj.weight": k, "v_proj.weight": v, "out_proj.weight": sd["o_net.weight"],
            "position.r_net.0.weight": r, "position.u": r_w_bias, "position.v": r_r_bias}


def gatconv_to_graph_attention(sd):
    """A state dict for ``ka.GraphAttention(in_channels, out_channels, heads, kernel="gat")`` from a PyG
    ``GATConv`` state dict: ``lin.weight`` (``lin_src.weight`` before PyG 2.5), ``att_src`` -> ``att_j`` (the
    neighbour, edge_index[0]), ``att_dst`` -> ``att_i`` (the centre node, edge_index[1]), ``bias``."""
    lin = sd["lin.weight"] if "lin.weight" in sd else sd["lin_src.weight"]
    out = {"lin.weight": lin, "att_i": sd["att_dst"][0], "att_j": sd["att_src"][0]}
    if "bias" in sd:
        out["bias"] = sd["bias"]
    return out


def _rel_shift(x):
    """kimiyoung/transformer-xl mem_transformer.py _rel_shift, for x of shape (qlen, klen, ...)."""
    zero_pad = torch.zeros((x.size(0), 1, *x.size()[2:]), dtype=x.dtype)
    x_padded = torch.cat([zero_pad, x], dim=1).view(x.size(1) + 1, x.size(0), *x.size()[2:])
    return x_padded[1:].view_as(x)


def _txl_attention(sd, r_w_bias, r_r_bias, w, mems, n_head, d_head):
    """RelPartialLearnableMultiHeadAttn's attention output o_net(attn_vec), time-major, written out."""
    qlen, klen = w.size(0), w.size(0) + mems.size(0)
    d_model = w.size(-1)
    pos_seq = torch.arange(klen - 1, -1, -1.0, dtype=w.dtype)
    inv_freq = 1 / (10000 ** (torch.arange(0.0, d_model, 2.0, dtype=w.dtype) / d_model))
    angle = torch.outer(pos_seq, inv_freq)
    r = torch.cat([angle.sin(), angle.cos()], dim=-1)                            # TXL's PositionalEmbedding
    w_heads = torch.cat([mems, w], 0) @ sd["qkv_net.weight"].t()
    r_head_k = (r @ sd["r_net.weight"].t()).view(klen, n_head, d_head)
    q, k, v = w_heads.chunk(3, dim=-1)
    q = q[-qlen:].view(qlen, -1, n_head, d_head)
    k, v = k.view(klen, -1, n_head, d_head), v.view(klen, -1, n_head, d_head)
    ac = torch.einsum("ibnd,jbnd->ijbn", q + r_w_bias, k)
    bd = _rel_shift(torch.einsum("ibnd,jnd->ijbn", q + r_r_bias, r_head_k))
    score = (ac + bd) / math.sqrt(d_head)
    mask = torch.triu(torch.ones(qlen, klen), diagonal=1 + mems.size(0)).bool()
    prob = torch.softmax(score.masked_fill(mask[:, :, None, None], float("-inf")), dim=1)
    vec = torch.einsum("ijbn,jbnd->ibnd", prob, v).reshape(qlen, -1, n_head * d_head)
    return vec @ sd["o_net.weight"].t()


def test_transformer_xl_weights_give_transformer_xl_attention():
    torch.manual_seed(0)
    n_head, d_head, d_model, qlen, mlen, bsz = 3, 4, 10, 5, 3, 2
    g = lambda *s: torch.randn(*s, dtype=torch.float64) * 0.3  # noqa: E731
    sd = {"qkv_net.weight": g(3 * n_head * d_head, d_model), "o_net.weight": g(d_model, n_head * d_head),
          "r_net.weight": g(n_head * d_head, d_model), "layer_norm.weight": g(d_model),
          "layer_norm.bias": g(d_model)}
    r_w_bias, r_r_bias = g(n_head, d_head), g(n_head, d_head)
    layer = ka.KernelAttention(d_model, n_head, d_head=d_head, position="xl", bias=False, filter="memory").double()
    layer.load_state_dict(txl_to_kernel_attention(sd, r_w_bias, r_r_bias))
    w, mems = g(qlen, bsz, d_model), g(mlen, bsz, d_model)                     # TXL is time-major
    ours = layer(w.transpose(0, 1), memory=mems.transpose(0, 1)).transpose(0, 1)
    ref = _txl_attention(sd, r_w_bias, r_r_bias, w, mems, n_head, d_head)
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-12)


def _gatconv(sd, x, edge_index, heads, out_channels, concat=True, negative_slope=0.2):
    """GATConv's forward written out with an N x N adjacency (self loops removed, then one per node)."""
    n = x.shape[0]
    lin = sd["lin.weight"] if "lin.weight" in sd else sd["lin_src.weight"]
    h = (x @ lin.t()).view(n, heads, out_channels)
    a_src = (h * sd["att_src"]).sum(-1)                                       # (N, H), for x_j
    a_dst = (h * sd["att_dst"]).sum(-1)                                       # (N, H), for x_i
    adj = torch.zeros(n, n, dtype=torch.bool)
    adj[edge_index[1], edge_index[0]] = True                                  # adj[i, j]: edge j -> i
    adj.fill_diagonal_(True)
    e = F.leaky_relu(a_dst[:, None, :] + a_src[None, :, :], negative_slope)  # (N_i, N_j, H)
    alpha = torch.softmax(e.masked_fill(~adj[..., None], float("-inf")), dim=1)
    out = torch.einsum("ijh,jhc->ihc", alpha, h)
    out = out.reshape(n, heads * out_channels) if concat else out.mean(1)
    return out + sd["bias"]


def test_pyg_gatconv_weights_give_gatconv_output():
    torch.manual_seed(0)
    n, e, in_channels, out_channels, heads = 9, 30, 6, 4, 3
    g = lambda *s: torch.randn(*s, dtype=torch.float64)  # noqa: E731
    idx = torch.randperm(n * n)[:e]
    edge_index = torch.stack([idx // n, idx % n])                             # some self loops among them
    x = g(n, in_channels)
    for concat, lin_key in [(True, "lin.weight"), (False, "lin_src.weight")]:
        sd = {lin_key: g(heads * out_channels, in_channels), "att_src": g(1, heads, out_channels),
              "att_dst": g(1, heads, out_channels), "bias": g(heads * out_channels if concat else out_channels)}
        if lin_key == "lin_src.weight":
            sd["lin_dst.weight"] = sd["lin_src.weight"]                      # PyG < 2.5: one Linear, two names
        layer = ka.GraphAttention(in_channels, out_channels, heads, kernel="gat", concat=concat).double()
        layer.load_state_dict(gatconv_to_graph_attention(sd))
        torch.testing.assert_close(layer(x, edge_index), _gatconv(sd, x, edge_index, heads, out_channels, concat),
                                   rtol=1e-10, atol=1e-12)
