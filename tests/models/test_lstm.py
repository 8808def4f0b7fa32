"""Transformer Networks LSTM (Eqs. 13-21): the Eq. 19 identity and torch.nn.LSTM as a reference."""

import pytest
import torch

from kernel_attention.models.lstm import AblatedLSTM, TNLSTM, eq19_weights


@pytest.mark.parametrize("cls", [TNLSTM, AblatedLSTM])
@pytest.mark.parametrize("activation", ["sigmoid", "tanh"])
def test_eq19_cell_state_is_weighted_sum_of_candidates(cls, activation):
    torch.manual_seed(0)
    model = cls(6, activation=activation).double()
    x = torch.randn(3, 9, 6, dtype=torch.double)
    _, _, gates = model(x, return_gates=True)
    w = eq19_weights(gates["i"], gates["f"])                      # (B, T, T, d)
    c_sum = (w * gates["c_tilde"][:, None, :, :]).sum(2)          # sum_s w_{t,s} o c~_s
    torch.testing.assert_close(c_sum, gates["c"])
    # explicit product for one (t, s) pair, independent of the log-space computation
    t, s = 7, 2
    manual = gates["i"][:, s] * gates["f"][:, s + 1:t + 1].prod(1)
    torch.testing.assert_close(w[:, t, s], manual)
    assert torch.all(w[:, 2, 5] == 0)                             # s > t gets no weight
    torch.testing.assert_close(model.weights(x), w)


def test_sigmoid_form_follows_the_equations():
    """h_t = o_t o sigma(c_t) with sigma the logistic function (Eq. 18), c~ with sigma (Eq. 13)."""
    torch.manual_seed(1)
    m = TNLSTM(4).double()
    x = torch.randn(2, 5, 4, dtype=torch.double)
    h, _, g = m(x, return_gates=True)
    torch.testing.assert_close(h, g["o"] * torch.sigmoid(g["c"]))
    assert torch.all(g["c_tilde"] > 0)                            # a sigmoid candidate is positive
    ab = AblatedLSTM(4).double()
    h, _, g = ab(x, return_gates=True)
    torch.testing.assert_close(h, torch.sigmoid(g["c"]))


def test_tanh_form_matches_torch_lstm():
    torch.manual_seed(2)
    d = 5
    ref = torch.nn.LSTM(d, d, batch_first=True).double()
    m = TNLSTM(d, activation="tanh", bias=True).double()
    # torch order: i, f, g(=c~), o; ours: c~, i, f, o
    i, f, g, o = ref.weight_ih_l0.chunk(4)
    hi, hf, hg, ho = ref.weight_hh_l0.chunk(4)
    bi, bf, bg, bo = (ref.bias_ih_l0 + ref.bias_hh_l0).chunk(4)
    with torch.no_grad():
        m.w_x.weight.copy_(torch.cat([g, i, f, o]))
        m.w_h.weight.copy_(torch.cat([hg, hi, hf, ho]))
        m.w_x.bias.copy_(torch.cat([bg, bi, bf, bo]))
    x = torch.randn(2, 7, d, dtype=torch.double)
    out_ref, (h_ref, c_ref) = ref(x)
    out, (h, c) = m(x)
    torch.testing.assert_close(out, out_ref)
    torch.testing.assert_close(c, c_ref[0])


def test_bad_activation():
    with pytest.raises(ValueError, match="activation"):
        TNLSTM(4, activation="relu")
