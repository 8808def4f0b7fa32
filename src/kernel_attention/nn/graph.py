r"""Graph attention in kernel form over an edge list (GAT, Veličković et al. 2018; IKA Eq. 10).

    x = W h                                    (N, H, d)
    GAT:       log a~_ij = LeakyReLU(a_i^T x_i + a_j^T x_j)                            (Eq. 2)
    kernel:    log a~_ij = log s(q_i, c a) + log s(c a, k_j) + (2||c a||_p^2 + ||q_i||_p^2 + ||k_j||_p^2)/2
               q_i = [x_i || 0], k_j = [0 || x_j], a = [a_i || a_j], c = 1 if a^T[x_i||x_j] >= 0 else slope
    alpha_ij = softmax over the in-neighbours j of i;   out_i = sum_j alpha_ij x_j   (concat or mean over H)

With s(u, v) = exp(-||u - v||^2 / 2) and p = 2 the kernel form *is* GAT (Prop. 2, ``kernel="gat-kernel"``);
any positive similarity × magnitude kernel of :mod:`kernel_attention.kernels.implicit` takes s's place
(``log s`` is its ``log_similarity``, f^2 + eps for the implicit ones, with one spectral sample shared
by both factors; the magnitude uses its p; no sqrt(d), as in Eq. 10).

Everything is per edge: s(q_i, c a) takes two values per node (c in {1, slope}), so it is computed on
nodes and gathered; the neighbourhood soft-max is a scatter (amax, then sum) over the edge targets.
No N x N tensor is ever built.  ``edge_index`` (2, E) follows the source -> target convention: row 0
is the neighbour j, row 1 the centre node i whose neighbourhood is normalised.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kernel_attention.inputs import check_finite
from kernel_attention.kernels.decomposition import gat_decompose, lp_norm_sq
from kernel_attention.kernels.implicit import SimilarityMagnitudeKernel
from kernel_attention.kernels import make_kernel
from kernel_attention.nn.arguments import check_rate, check_sizes, flag

__all__ = ["GraphAttention", "segment_softmax", "with_self_loops"]


def with_self_loops(edge_index: Tensor, n: int) -> Tensor:
    """Drop existing self loops and add one per node: (2, E) -> (2, E' + n)."""
    keep = edge_index[0] != edge_index[1]
    loops = torch.arange(n, device=edge_index.device).unsqueeze(0).expand(2, n)
    return torch.cat([edge_index[:, keep], loops], dim=1)


def segment_softmax(logits: Tensor, index: Tensor, n: int) -> Tensor:
    """Soft-max of ``logits`` (E, H) within the groups given by ``index`` (E,) in [0, n).

    The group maximum (a constant shift, detached) comes from ``scatter_reduce(amax)``, the sums from
    ``index_add``."""
    idx = index.unsqueeze(-1).expand_as(logits)
    mx = logits.new_full((n, logits.shape[1]), float("-inf"))
    mx = mx.scatter_reduce(0, idx, logits.detach(), reduce="amax", include_self=True)
    ex = (logits - mx[index]).exp()
    den = torch.zeros_like(mx).index_add(0, index, ex)
    return ex / den[index]


class GraphAttention(nn.Module):
    """A GAT layer whose kernel is a name: ``"gat"`` (Eq. 2), ``"gat-kernel"`` (the same weights via the
    Prop. 2 decomposition), or a positive kernel spec such as ``"ikan:p=1.5"``, ``"mikan"``,
    ``"ikan-direct"``, ``"rbf-only"``, ``"expsin"`` (built with n_heads=heads, d_head=2·out_dim).

    Args:
        in_dim, out_dim: feature sizes; heads: attention heads H.
        concat: output (N, H·out_dim) if True, else the mean over heads (N, out_dim).
        dropout: dropout on the attention weights (input dropout belongs to the model).
        negative_slope: GAT's LeakyReLU slope, also the c of the inactive branch.
        add_self_loops: replace self loops by exactly one per node.

    Every column of ``edge_index`` is one term of its node's sum: an edge listed twice counts twice (as in PyG's
    GATConv), so a multigraph is weighted by its multiplicities.
    """

    def __init__(self, in_dim: int, out_dim: int, heads: int = 1, kernel="gat", *, concat: bool = True,
                 dropout: float = 0.0, negative_slope: float = 0.2, add_self_loops: bool = True,
                 bias: bool = True):
        super().__init__()
        check_sizes("GraphAttention", in_dim=in_dim, out_dim=out_dim, heads=heads)
        check_rate("GraphAttention", "dropout", dropout)
        concat, add_self_loops, bias = (flag("GraphAttention", name, value) for name, value in (
            ("concat", concat), ("add_self_loops", add_self_loops), ("bias", bias)))
        self.in_dim, self.out_dim, self.heads = in_dim, out_dim, heads
        self.concat, self.dropout, self.negative_slope = concat, dropout, negative_slope
        self.add_self_loops = add_self_loops
        self.lin = nn.Linear(in_dim, heads * out_dim, bias=False)
        self.att_i = nn.Parameter(torch.empty(heads, out_dim))   # a_i: the centre node's half of a
        self.att_j = nn.Parameter(torch.empty(heads, out_dim))   # a_j: the neighbour's half
        self.bias = nn.Parameter(torch.zeros(heads * out_dim if concat else out_dim)) if bias else None
        if kernel in ("gat", "gat-kernel"):
            self.kernel_name, self.kernel = kernel, None
        else:
            self.kernel = make_kernel(kernel, n_heads=heads, d_head=2 * out_dim)
            if not (isinstance(self.kernel, SimilarityMagnitudeKernel) and self.kernel.positive):
                raise ValueError(f"GraphAttention needs 'gat', 'gat-kernel' or a positive similarity x magnitude "
                                 f"kernel (rbf-only, expsin, ikas, ikans, ikan, ikan-direct, mikan); got {kernel!r}")
            self.kernel_name = self.kernel.name
        nn.init.xavier_uniform_(self.lin.weight)
        nn.init.xavier_uniform_(self.att_i)
        nn.init.xavier_uniform_(self.att_j)

    def scores(self, x: Tensor, edge_index: Tensor) -> tuple[Tensor, Tensor]:
        """(log_similarity, log_magnitude) per edge, each (E, H), from x = W h (N, H, d).
        For ``"gat"`` the whole LeakyReLU logit is returned as the similarity and the magnitude is 0."""
        src, dst = edge_index[0], edge_index[1]
        s_i = (x * self.att_i).sum(-1)                      # (N, H) a_i^T x_i
        s_j = (x * self.att_j).sum(-1)
        if self.kernel_name == "gat":
            logit = F.leaky_relu(s_i[dst] + s_j[src], self.negative_slope)
            return logit, torch.zeros_like(logit)
        if self.kernel_name == "gat-kernel":
            return gat_decompose(x[dst], x[src], self.att_i, self.att_j, self.negative_slope)
        return self._kernel_scores(x, s_i[dst] + s_j[src], src, dst)

    def _kernel_scores(self, x: Tensor, pre: Tensor, src: Tensor, dst: Tensor) -> tuple[Tensor, Tensor]:
        kern = self.kernel
        n, h, d = x.shape
        zero = torch.zeros_like(x)
        q = torch.cat([x, zero], -1).transpose(0, 1).unsqueeze(0)          # (1, H, N, 2d)  [x || 0]
        k = torch.cat([zero, x], -1).transpose(0, 1).unsqueeze(0)          # (1, H, N, 2d)  [0 || x]
        a = torch.cat([self.att_i, self.att_j], -1)                          # (H, 2d)
        ca = torch.stack([a, self.negative_slope * a], 1).unsqueeze(0)      # (1, H, 2, 2d)  c in {1, slope}
        state = kern.prepare(q, k)                                           # one spectral sample for both
        sim_q = kern.log_similarity(q, ca, state)[0].permute(1, 0, 2)        # (N, H, 2) log s(q_i, c a)
        sim_k = kern.log_similarity(ca, k, state)[0].permute(2, 0, 1)        # (N, H, 2) log s(c a, k_j)
        c_idx = (pre < 0).long().unsqueeze(-1)                               # (E, H, 1): 0 -> c = 1
        log_sim = sim_q[dst].gather(-1, c_idx).squeeze(-1) + sim_k[src].gather(-1, c_idx).squeeze(-1)
        if not kern.use_magnitude:
            return log_sim, torch.zeros_like(log_sim)
        p = kern.p
        m_ca = lp_norm_sq(ca[0], p)                                          # (H, 2)
        m_x = lp_norm_sq(x, p)                                               # (N, H) = ||q_i||_p^2 = ||k_j||_p^2
        m_ca_e = m_ca.unsqueeze(0).expand(pre.shape[0], h, 2).gather(-1, c_idx).squeeze(-1)
        return log_sim, 0.5 * (2 * m_ca_e + m_x[dst] + m_x[src])

    def forward(self, h: Tensor, edge_index: Tensor, need_weights: bool = False):
        """h (N, in_dim), edge_index (2, E) long -> (N, H·out_dim | out_dim); with ``need_weights`` also
        ``(edge_index_used (2, E'), alpha (E', H))`` (self loops included when added)."""
        if h.dim() != 2 or h.shape[1] != self.in_dim:
            raise ValueError(f"h must be (N, {self.in_dim}), got {tuple(h.shape)}")
        if edge_index.dim() != 2 or edge_index.shape[0] != 2 or edge_index.dtype != torch.long:
            raise ValueError(f"edge_index must be a (2, E) long tensor, got {tuple(edge_index.shape)} "
                             f"{edge_index.dtype}")
        n = h.shape[0]
        if edge_index.numel() and (edge_index.min() < 0 or edge_index.max() >= n):
            raise ValueError(f"edge_index has node ids outside [0, {n})")
        check_finite({"h": h})  # as attention()'s inputs: on CPU tensors in eager mode, see validation()
        if self.add_self_loops:
            edge_index = with_self_loops(edge_index, n)
        x = self.lin(h).view(n, self.heads, self.out_dim)
        log_sim, log_mag = self.scores(x, edge_index)
        src, dst = edge_index[0], edge_index[1]
        alpha = segment_softmax(log_sim + log_mag, dst, n)                   # (E, H)
        used = F.dropout(alpha, self.dropout, self.training) if self.dropout > 0 else alpha
        out = torch.zeros_like(x).index_add(0, dst, used.unsqueeze(-1) * x[src])
        out = out.reshape(n, self.heads * self.out_dim) if self.concat else out.mean(1)
        if self.bias is not None:
            out = out + self.bias
        return (out, (edge_index, alpha)) if need_weights else out
