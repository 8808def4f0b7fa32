r"""The LSTM of Transformer Networks (Thickstun), Eqs. 13-18, and the ablated LSTM of Eqs. 20-21, written
so that the element-wise weights of Eq. 19 can be read off and plotted next to attention weights.

Full LSTM, exactly as written in the paper (no biases; sigma is the logistic sigmoid everywhere):

    c~_t = sigma(W_ch h_{t-1} + W_cx x_t)                                  (13)
    i_t  = sigma(W_ih h_{t-1} + W_ix x_t)                                  (14)
    f_t  = sigma(W_fh h_{t-1} + W_fx x_t)                                  (15)
    c_t  = i_t o c~_t + f_t o c_{t-1}                                      (16)
    o_t  = sigma(W_oh h_{t-1} + W_ox x_t)                                  (17)
    h_t  = o_t o sigma(c_t)                                                (18)

Ablated LSTM (Levy et al. 2018; recurrent connections and the output gate removed):

    c~_t = sigma(W_cx x_t),  i_t = sigma(W_ix x_t),  f_t = sigma(W_fx x_t)  (20)
    c_t  = i_t o c~_t + f_t o c_{t-1},   h_t = sigma(c_t)                  (21)

Unrolling Eq. 16 from c_0 = 0 gives an element-wise weighted sum of the candidates (Eq. 19):

    c_t = sum_{s=1}^t w_{t,s} o c~_s,     w_{t,s} = i_s o prod_{k=s+1}^t f_k

Note: the paper writes sigma (sigmoid) for the candidate c~_t and for the output squashing of h_t; the
common form (Hochreiter & Schmidhuber / Gers et al., torch.nn.LSTM) uses tanh in both places.  The
default here follows the equations (``activation="sigmoid"``); ``activation="tanh"`` gives the common
form.  Eq. 19 holds for either, since it only concerns Eq. 16.  ``bias=True`` adds the usual biases.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["TNLSTM", "AblatedLSTM", "eq19_weights"]

_ACTIVATIONS = {"sigmoid": torch.sigmoid, "tanh": torch.tanh}


def eq19_weights(i: Tensor, f: Tensor) -> Tensor:
    r"""w_{t,s} = i_s o prod_{k=s+1}^t f_k  for all t, s (Eq. 19); zero for s > t.

    Args: input gates i and forget gates f, (B, T, d).  Returns (B, T, T, d) indexed [b, t, s, :].
    Computed in log space of f (cumulative sums) so long products stay accurate.
    """
    log_f = torch.log(f.clamp_min(1e-30))
    cum = torch.cumsum(log_f, dim=1)                       # sum_{k<=t} log f_k
    # prod_{k=s+1}^t f_k = exp(cum_t - cum_s) for s <= t
    diff = cum[:, :, None, :] - cum[:, None, :, :]         # [b, t, s, :]
    t = i.shape[1]
    keep = torch.ones(t, t, dtype=torch.bool, device=i.device).tril()[None, :, :, None]
    prod = torch.where(keep, torch.exp(diff.masked_fill(~keep, 0.0)), torch.zeros_like(diff))
    return prod * i[:, None, :, :]


class _Base(nn.Module):
    def __init__(self, d: int, activation: str):
        super().__init__()
        if activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)}, got {activation!r}")
        self.d, self.activation = d, activation
        self.act = _ACTIVATIONS[activation]

    def weights(self, x: Tensor) -> Tensor:
        """Eq. 19 weights (B, T, T, d) of the gates computed on x (B, T, d)."""
        out = self.forward(x, return_gates=True)
        return eq19_weights(out[2]["i"], out[2]["f"])


class TNLSTM(_Base):
    """The full LSTM of Eqs. 13-18 over x (B, T, d) with state size d (the paper's W are d x d)."""

    def __init__(self, d: int, *, activation: str = "sigmoid", bias: bool = False):
        super().__init__(d, activation)
        # One matrix per gate and input, stacked: rows [c~, i, f, o].
        self.w_x = nn.Linear(d, 4 * d, bias=bias)
        self.w_h = nn.Linear(d, 4 * d, bias=False)

    def forward(self, x: Tensor, state: tuple[Tensor, Tensor] | None = None, return_gates: bool = False):
        """x (B, T, d) -> h (B, T, d), (h_T, c_T) [, gates {"c_tilde","i","f","o","c"} each (B, T, d)]."""
        b, t, d = x.shape
        h = x.new_zeros(b, d) if state is None else state[0]
        c = x.new_zeros(b, d) if state is None else state[1]
        gx = self.w_x(x)
        hs, gates = [], {k: [] for k in ("c_tilde", "i", "f", "o", "c")}
        for step in range(t):
            g = gx[:, step] + self.w_h(h)
            gc, gi, gf, go = g.chunk(4, dim=-1)
            c_tilde = self.act(gc)                                  # (13)
            i, f, o = torch.sigmoid(gi), torch.sigmoid(gf), torch.sigmoid(go)   # (14), (15), (17)
            c = i * c_tilde + f * c                                 # (16)
            h = o * self.act(c)                                     # (18)
            hs.append(h)
            for k, v in zip(gates, (c_tilde, i, f, o, c)):
                gates[k].append(v)
        out = torch.stack(hs, dim=1)
        if return_gates:
            return out, (h, c), {k: torch.stack(v, dim=1) for k, v in gates.items()}
        return out, (h, c)


class AblatedLSTM(_Base):
    """The ablated LSTM of Eqs. 20-21: gates and candidates from x_t alone, no output gate."""

    def __init__(self, d: int, *, activation: str = "sigmoid", bias: bool = False):
        super().__init__(d, activation)
        self.w_x = nn.Linear(d, 3 * d, bias=bias)   # rows [c~, i, f]

    def forward(self, x: Tensor, state: Tensor | None = None, return_gates: bool = False):
        """x (B, T, d) -> h (B, T, d), c_T [, gates {"c_tilde","i","f","c"}]."""
        gc, gi, gf = self.w_x(x).chunk(3, dim=-1)
        c_tilde, i, f = self.act(gc), torch.sigmoid(gi), torch.sigmoid(gf)       # (20)
        c = x.new_zeros(x.shape[0], self.d) if state is None else state
        cs = []
        for step in range(x.shape[1]):
            c = i[:, step] * c_tilde[:, step] + f[:, step] * c                   # (21)
            cs.append(c)
        cs = torch.stack(cs, dim=1)
        h = self.act(cs)                                                         # (21)
        if return_gates:
            return h, c, {"c_tilde": c_tilde, "i": i, "f": f, "c": cs}
        return h, c
