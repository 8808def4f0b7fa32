r"""Transformer-XL's adaptive input embedding and the adaptive soft-max tied to it (Baevski & Auli 2019; Grave et
al. 2017; Dai et al. 2019, ``AdaptiveEmbedding`` and ``ProjectedAdaptiveLogSoftmax`` with ``tie_weight`` and
``tie_projs``).

The vocabulary, ordered by frequency, is cut at c_1 < ... < c_n into clusters C_0 = [0, c_1), C_k = [c_k,
c_{k+1}) (c_{n+1} = V).  Cluster k is embedded in d_k = d / div^k dimensions and projected to d:

    x(w) = sqrt(d) · P_k E_k[w - c_k]        w in C_k;  E_k (|C_k|, d_k), P_k (d, d_k); no P when div = 1

The soft-max reads the same tables.  The head scores the words of C_0 and one row per tail cluster; a tail
cluster scores its own words:

    head(h) = log_softmax([E_0 ; W_c] (P_0'^T h) + [b_0 ; b_c])    (|C_0| + n,)    P_0' the head's own projection
    log p(w | h) = head(h)[w]                                      w in C_0
    log p(w | h) = head(h)[c(k)] + log_softmax(E_k (P_k^T h) + b_k)[w - c_k]        w in C_k, k >= 1

with c(k) = |C_0| + n - k, the head column Transformer-XL gives cluster k (``head_logprob[:, -k]``), and its
parameters in the same shapes (:class:`TiedAdaptiveLogSoftmax` names them), so that its trained weights map
one to one.  E_k and, for the tails, P_k are the embedding's; the biases b_k, the cluster rows W_c, b_c and the
head's projection are the soft-max's.  With targets, each target's cluster alone is scored.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["AdaptiveEmbedding", "TiedAdaptiveLogSoftmax", "check_cutoffs"]


def check_cutoffs(cutoffs: list[int], vocab: int) -> list[int]:
    """``cutoffs`` as a list when 0 < c_1 < ... < c_n < ``vocab``; otherwise ValueError."""
    cutoffs = list(cutoffs or [])
    if not cutoffs or cutoffs != sorted(set(cutoffs)) or not 0 < cutoffs[0] or cutoffs[-1] >= vocab:
        raise ValueError(f"cutoffs must be c_1 < ... < c_n with 0 < c_1 and c_n < the vocabulary ({vocab}), "
                         f"got {cutoffs!r}")
    return cutoffs


class AdaptiveEmbedding(nn.Module):
    """x(w) = sqrt(d) · P_k E_k[w - c_k] (module docstring): ``tables[k]`` is E_k (|C_k|, d / div^k), ``projs[k]``
    P_k (d, d / div^k), none when ``div_value`` is 1 (one table of all V words).  Initialised N(0, d_k^-1/2) and
    N(0, d^-1/2), so that x has unit-variance entries, as :class:`~kernel_attention.models.common.ScaledEmbedding`.
    """

    def __init__(self, vocab: int, d_model: int, cutoffs: list[int], div_value: float = 1.0):
        super().__init__()
        self.d_model, self.div_value, self.scale = d_model, float(div_value), math.sqrt(d_model)
        self.bounds = [0] + check_cutoffs(cutoffs, vocab) + [vocab]
        if self.div_value == 1:
            self.tables = nn.ParameterList([nn.Parameter(torch.randn(vocab, d_model) * d_model ** -0.5)])
            self.projs = nn.ParameterList()
        else:
            widths = [self.width(k) for k in range(len(self.bounds) - 1)]
            self.tables = nn.ParameterList(nn.Parameter(torch.randn(r - l, w) * w ** -0.5)
                                           for l, r, w in zip(self.bounds, self.bounds[1:], widths))
            self.projs = nn.ParameterList(nn.Parameter(torch.randn(d_model, w) * d_model ** -0.5) for w in widths)

    def width(self, k: int) -> int:
        """d_k = d / div^k, at least 1."""
        return max(1, int(self.d_model // self.div_value ** k))

    def table(self, k: int) -> Tensor:
        """E_k (|C_k|, d_k): a slice of the one table when ``div_value`` is 1."""
        if self.div_value == 1:
            return self.tables[0][self.bounds[k]:self.bounds[k + 1]]
        return self.tables[k]

    def proj(self, k: int) -> Tensor | None:
        return self.projs[k] if len(self.projs) else None

    def forward(self, tokens: Tensor) -> Tensor:
        """(B, T) long -> (B, T, d)."""
        if self.div_value == 1:
            return F.embedding(tokens, self.tables[0]) * self.scale
        flat = tokens.reshape(-1)
        out = self.tables[0].new_zeros(flat.shape[0], self.d_model)
        for k, (l, r) in enumerate(zip(self.bounds, self.bounds[1:])):
            idx = ((flat >= l) & (flat < r)).nonzero().squeeze(1)
            if idx.numel():
                out = out.index_copy(0, idx, F.linear(F.embedding(flat[idx] - l, self.tables[k]), self.projs[k]))
        return (out * self.scale).view(*tokens.shape, self.d_model)


class TiedAdaptiveLogSoftmax(nn.Module):
    """log p(w | h) of the module docstring over the tables of ``embedding`` (an :class:`AdaptiveEmbedding`).

    Own parameters, by Transformer-XL's names: ``cluster_weight`` W_c (n, d_0), ``cluster_bias`` b_c (n,),
    ``biases[k]`` b_k (|C_k|,) (``out_layers[k].bias``; one bias of all V words when ``div_value`` is 1, as
    ``out_layers[0].bias``), ``head_proj`` P_0' (d, d_0) when ``div_value`` is not 1 (``out_projs[0]``, not tied).
    The tables E_k are ``out_layers[k].weight`` and the tail projections ``out_projs[k]``, tied to the embedding's.
    """

    def __init__(self, embedding: AdaptiveEmbedding):
        super().__init__()
        self.embedding = [embedding]  # a plain list: the embedding's parameters are registered by its owner
        bounds, d = embedding.bounds, embedding.d_model
        self.bounds, self.n = bounds, len(bounds) - 2
        width0 = embedding.width(0)
        self.cluster_weight = nn.Parameter(torch.randn(self.n, width0) * width0 ** -0.5)
        self.cluster_bias = nn.Parameter(torch.zeros(self.n))
        if embedding.div_value == 1:
            self.biases = nn.ParameterList([nn.Parameter(torch.zeros(bounds[-1]))])
            self.head_proj = None
        else:
            self.biases = nn.ParameterList(nn.Parameter(torch.zeros(r - l)) for l, r in zip(bounds, bounds[1:]))
            self.head_proj = nn.Parameter(torch.randn(d, width0) * d ** -0.5)

    def _bias(self, k: int) -> Tensor:
        if len(self.biases) == 1:
            return self.biases[0][self.bounds[k]:self.bounds[k + 1]]
        return self.biases[k]

    def _logits(self, h: Tensor, k: int) -> Tensor:
        """(N, |C_k|) scores of cluster k's words (k = 0: with the n cluster rows after them)."""
        emb = self.embedding[0]
        weight, bias = emb.table(k), self._bias(k)
        proj = self.head_proj if k == 0 else emb.proj(k)
        if k == 0:
            weight, bias = torch.cat([weight, self.cluster_weight]), torch.cat([bias, self.cluster_bias])
        return F.linear(h if proj is None else h @ proj, weight, bias)

    def log_prob(self, h: Tensor) -> Tensor:
        """(N, d) -> (N, V) log p(w | h) of every word."""
        head = F.log_softmax(self._logits(h, 0), dim=-1)
        parts = [head[:, :self.bounds[1]]]
        for k in range(1, self.n + 1):
            parts.append(head[:, -k, None] + F.log_softmax(self._logits(h, k), dim=-1))
        return torch.cat(parts, dim=-1)

    def forward(self, h: Tensor, targets: Tensor) -> Tensor:
        """(N, d), (N,) -> (N,) -log p(target | h), scoring each target's cluster alone."""
        head = F.log_softmax(self._logits(h, 0), dim=-1)
        short = targets < self.bounds[1]
        nll = -head.gather(1, torch.where(short, targets, 0)[:, None]).squeeze(1).masked_fill(~short, 0.0)
        for k in range(1, self.n + 1):
            l, r = self.bounds[k], self.bounds[k + 1]
            idx = ((targets >= l) & (targets < r)).nonzero().squeeze(1)
            if idx.numel():
                tail = F.log_softmax(self._logits(h[idx], k), dim=-1)
                logp = head[idx, -k] + tail.gather(1, (targets[idx] - l)[:, None]).squeeze(1)
                nll = nll.index_copy(0, idx, -logp)
        return nll
