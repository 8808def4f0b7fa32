"""Graph attention over edge lists: GAT equivalence (Prop. 2), IKA kernels, 100k edges without N x N."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from kernel_attention.nn.graph import GraphAttention, segment_softmax, with_self_loops
from kernel_attention.kernels.implicit import regularization


def _graph(n=12, e=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randperm(n * n, generator=g)[:e]
    return torch.stack([idx // n, idx % n]), torch.randn(n, 5, generator=g, dtype=torch.float64)


def dense_gat(layer, h, edge_index):
    """Eq. 2 written out with an N x N adjacency: alpha_ij = softmax_{j in N_i} LeakyReLU(a^T [Wh_i || Wh_j])."""
    n = h.shape[0]
    x = layer.lin(h).view(n, layer.heads, layer.out_dim)                     # (N, H, d)
    a = torch.cat([layer.att_i, layer.att_j], -1)                            # (H, 2d)
    pair = torch.cat([x.unsqueeze(1).expand(n, n, *x.shape[1:]),             # [Wh_i || Wh_j] at (i, j)
                      x.unsqueeze(0).expand(n, n, *x.shape[1:])], -1)
    e = F.leaky_relu((pair * a).sum(-1), layer.negative_slope)               # (N_i, N_j, H)
    adj = torch.zeros(n, n, dtype=torch.bool)
    adj[edge_index[1], edge_index[0]] = True
    adj |= torch.eye(n, dtype=torch.bool)
    alpha = torch.softmax(e.masked_fill(~adj.unsqueeze(-1), float("-inf")), dim=1)
    out = torch.einsum("ijh,jhd->ihd", alpha, x)
    return out, alpha


@pytest.mark.parametrize("kernel", ["gat", "gat-kernel"])
def test_gat_and_proposition_2_reproduce_dense_gat(kernel):
    edge_index, h = _graph()
    layer = GraphAttention(5, 4, heads=3, kernel=kernel).double()
    out, (used, alpha) = layer(h, edge_index, need_weights=True)
    ref_out, ref_alpha = dense_gat(layer, h, edge_index)
    assert torch.allclose(alpha, ref_alpha[used[1], used[0]], atol=1e-12)
    assert torch.allclose(out, ref_out.reshape(12, 12) + layer.bias, atol=1e-12)
    mean = GraphAttention(5, 4, heads=3, kernel=kernel, concat=False).double()
    mean.load_state_dict({k: v for k, v in layer.state_dict().items() if k != "bias"}, strict=False)
    assert torch.allclose(mean(h, edge_index), ref_out.mean(1), atol=1e-12)


def test_both_leaky_relu_branches_are_exercised():
    edge_index, h = _graph()
    layer = GraphAttention(5, 4, heads=3).double()
    x = layer.lin(h).view(12, 3, 4)
    loops = with_self_loops(edge_index, 12)
    pre = (x[loops[1]] * layer.att_i).sum(-1) + (x[loops[0]] * layer.att_j).sum(-1)
    assert (pre > 0).any() and (pre < 0).any()


def test_segment_softmax_matches_dense():
    logits = torch.randn(30, 2, dtype=torch.float64) * 50
    index = torch.randint(0, 6, (30,))
    got = segment_softmax(logits, index, 8)
    for i in range(6):
        sel = index == i
        if sel.any():
            assert torch.allclose(got[sel], torch.softmax(logits[sel], 0), atol=1e-12)


@pytest.mark.parametrize("kernel", ["rbf-only", "expsin", "ikas:R=8", "ikans:R=8", "ikan:R=8,p=1.5",
                                    "ikan-direct:R=8", "mikan:R=8"])
def test_kernel_graph_attention_weights_and_gradients(kernel):
    edge_index, h = _graph()
    layer = GraphAttention(5, 4, heads=2, kernel=kernel)
    h = h.float().requires_grad_()
    out, (used, alpha) = layer(h, edge_index, need_weights=True)
    assert out.shape == (12, 8) and torch.isfinite(out).all() and (alpha >= 0).all()
    sums = torch.zeros(12, 2).index_add(0, used[1], alpha)
    assert torch.allclose(sums, torch.ones(12, 2), atol=1e-5)
    (out.square().mean() + regularization(layer, n_train=10)).backward()
    assert layer.lin.weight.grad.abs().sum() > 0 and layer.att_i.grad.abs().sum() > 0
    if getattr(layer.kernel, "density", None) is not None:
        assert layer.kernel.density.generators[0].net[0].weight.grad.abs().sum() > 0
        assert layer.kernel.density.posterior_net.mu.weight.grad.abs().sum() > 0


def test_kernel_graph_attention_is_eq_10():
    # For one edge, build q = [x_i||0], k = [0||x_j], c a explicitly and evaluate Eq. 10 with the kernel.
    edge_index, h = _graph()
    layer = GraphAttention(5, 3, heads=2, kernel="ikan:R=8,p=1.5").double().eval()
    x = layer.lin(h).view(12, 2, 3)
    loops = with_self_loops(edge_index, 12)
    log_sim, log_mag = layer.scores(x, loops)
    kern = layer.kernel
    zero = torch.zeros_like(x)
    q, k = torch.cat([x, zero], -1).transpose(0, 1)[None], torch.cat([zero, x], -1).transpose(0, 1)[None]
    ws = kern.prepare(q, k)
    a = torch.cat([layer.att_i, layer.att_j], -1)
    for e in (0, 5, 17):
        j, i = loops[0, e].item(), loops[1, e].item()
        for head in range(2):
            pre = (torch.cat([x[i, head], x[j, head]]) * a[head]).sum()
            ca = (1.0 if pre >= 0 else 0.2) * a[head]
            f1 = kern.similarity(q[:, head:head + 1, i:i + 1], ca.view(1, 1, 1, -1), [w[:, head:head + 1] for w in ws])
            f2 = kern.similarity(ca.view(1, 1, 1, -1), k[:, head:head + 1, j:j + 1], [w[:, head:head + 1] for w in ws])
            ref_sim = (f1.squeeze() ** 2 + kern.eps).log() + (f2.squeeze() ** 2 + kern.eps).log()
            lp = lambda v: torch.linalg.vector_norm(v, ord=1.5) ** 2  # noqa: E731
            ref_mag = (2 * lp(ca) + lp(x[i, head]) + lp(x[j, head])) / 2
            assert torch.allclose(log_sim[e, head], ref_sim, atol=1e-10)
            assert torch.allclose(log_mag[e, head], ref_mag, atol=1e-10)


class _LargestTensor(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("kernel", ["gat", "ikan:R=16"])
def test_100k_edges_without_an_n_by_n_tensor(kernel):
    n, e = 50_000, 100_000                       # an N x N float tensor would be 10 GB
    g = torch.Generator().manual_seed(0)
    edge_index = torch.randint(0, n, (2, e), generator=g)
    h = torch.randn(n, 16, generator=g)
    layer = GraphAttention(16, 8, heads=2, kernel=kernel)
    with _LargestTensor() as mode:
        out = layer(h, edge_index)
        (out.square().mean() + regularization(layer)).backward()
    assert out.shape == (n, 16) and torch.isfinite(out).all()
    assert e <= mode.largest < 50 * (n + e)      # linear in the graph size, far below n * n = 2.5e9
    assert layer.lin.weight.grad is not None


def test_bad_inputs_fail_clearly():
    layer = GraphAttention(5, 4)
    with pytest.raises(ValueError, match="edge_index must be"):
        layer(torch.randn(3, 5), torch.zeros(3, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="outside"):
        layer(torch.randn(3, 5), torch.tensor([[0, 3], [1, 1]]))
    with pytest.raises(ValueError, match=r"h must be \(N, 5\)"):
        layer(torch.randn(3, 4), torch.tensor([[0], [1]]))
    with pytest.raises(ValueError, match="positive similarity x magnitude"):
        GraphAttention(5, 4, kernel="linear-magnitude")


def test_the_node_classifiers_kernel_is_a_spec_string_or_mapping():
    from kernel_attention.models import MODELS

    for spec in ("ikan-direct:p=3", {"name": "ikan-direct", "p": 3}):
        model = MODELS.create({"name": "node_classifier", "kernel": spec}, in_features=5, n_classes=3)
        kernels = [m.kernel for m in model.modules() if isinstance(m, GraphAttention)]
        assert len(kernels) == 2 and all(k.name == "ikan-direct" and k.p == 3 for k in kernels)


def test_an_edge_listed_twice_counts_twice():
    """Each column of edge_index is one term of its node's sum (PyG's GATConv alike): the duplicate edges share the
    weight of one, and node 1's output is the weighted sum over the three terms."""
    torch.manual_seed(0)
    layer = GraphAttention(3, 2, heads=1).eval()
    h = torch.randn(3, 3)
    edges = torch.tensor([[0, 0, 2], [1, 1, 1]])
    out, (used, alpha) = layer(h, edges, need_weights=True)
    mine = used[1] == 1
    assert mine.sum() == 4 and torch.allclose(alpha[mine].sum(0), torch.ones(1))  # 0, 0 again, 2, the self loop
    dup = alpha[mine & (used[0] == 0)]
    assert dup.shape[0] == 2 and torch.allclose(dup[0], dup[1])
    once, _ = layer(h, torch.tensor([[0, 2], [1, 1]]), need_weights=True)
    assert not torch.allclose(out[1], once[1])
