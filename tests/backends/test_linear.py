"""The linear backend (explicit feature maps, full and causal scans) agrees with ``dense``, in groups of
(batch, head) slices too, and passes gradients to kernel parameters."""

import dataclasses

import pytest
import torch
from _common import D, DT, H, close, inputs, padding_mask, run

import kernel_attention as ka
from kernel_attention.backends import POLICIES
from kernel_attention.functional import attention, explain
from kernel_attention.kernels.capabilities import FeatureMap

@pytest.mark.parametrize("kernel", ["linear", "poly", "poly:degree=3", "poly:degree=1"])
@pytest.mark.parametrize("filt", [None, "causal", "padding", "causal&padding"])
def test_linear_matches_dense(kernel, filt):
    km = padding_mask(23) if "padding" in str(filt) else None
    ref = run("dense", kernel, "none", filt, key_mask=km)
    for backend in ("linear", "linear:chunk=5"):
        close(run(backend, kernel, "none", filt, key_mask=km), ref, atol=1e-8)


@pytest.mark.parametrize("kernel", ["linear", "poly"])
@pytest.mark.parametrize("filt", [None, "padding", "causal"])
def test_grouped_key_value_heads(monkeypatch, kernel, filt):
    """Grouped-query attention (4 query heads on 2 key/value heads): non-causal, the scan takes each key/value head
    once with its group's query heads as more rows (one state per key/value head); causal, the heads repeated.
    Both equal dense on the heads repeated by hand, gradients of the grouped k and v included."""
    import kernel_attention.backends.linear as linear

    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 23, D, generator=g, dtype=DT, requires_grad=True)
    k, v = (torch.randn(2, 2, 23, D, generator=g, dtype=DT, requires_grad=True) for _ in range(2))
    km = padding_mask(23) if filt == "padding" else None
    shapes = []
    for name in ("causal_scan", "full_scan"):
        scan = getattr(linear, name)
        monkeypatch.setattr(linear, name, lambda *a, _scan=scan: shapes.append(a[1].shape) or _scan(*a))
    out = attention(q, k, v, kernel, filt, key_mask=km, backend="linear:chunk=5", enable_gqa=True)
    ref = attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), kernel, filt, key_mask=km,
                    backend="dense")
    torch.testing.assert_close(out, ref, atol=1e-8, rtol=1e-8)
    w = torch.linspace(-1, 1, out.numel(), dtype=DT).view_as(out)
    for a, b in zip(torch.autograd.grad((out * w).sum(), [q, k, v]), torch.autograd.grad((ref * w).sum(), [q, k, v])):
        torch.testing.assert_close(a, b, atol=1e-8, rtol=1e-8)
    assert shapes == [(2, 4 if filt == "causal" else 2, 23, D)]
    grouped = "one state per key/value head" in explain(q, k, v, kernel, filt, key_mask=km, backend="linear",
                                                        enable_gqa=True).reasons["linear"]
    assert grouped == (filt != "causal")


@pytest.mark.parametrize("elements", [1, 2 * 5 * 36])
@pytest.mark.parametrize("filt", ["padding", "causal&padding"])
def test_linear_scans_in_groups_of_slices_match_dense(monkeypatch, elements, filt):
    # poly (F = 36 at D = 8) in blocks of 5 rows: a budget of one slice splits the heads, of two
    # slices (= H) the batch; each group is its own scan and must give what the whole one gives.
    import kernel_attention.backends.linear as linear

    km = padding_mask(23)
    ref = run("dense", "poly", "none", filt, key_mask=km)
    monkeypatch.setitem(POLICIES, "cpu", dataclasses.replace(POLICIES["cpu"], scan_elements=elements))
    calls = []
    for name in ("causal_scan", "full_scan"):
        scan = getattr(linear, name)
        monkeypatch.setattr(linear, name, lambda *a, _scan=scan: calls.append(a[0].shape) or _scan(*a))
    close(run("linear:chunk=5", "poly", "none", filt, key_mask=km), ref, atol=1e-8)
    assert calls == ([(1, 1, 23, D)] * 4 if elements == 1 else [(1, H, 23, D)] * 2)
    why = explain(*inputs(23, 23), "poly", filt, backend="linear:chunk=5", key_mask=km).reasons["linear"]
    assert ("in 4 groups of 1 (batch, head) slices" if elements == 1 else "in 2 groups of 2") in why


def test_linear_slices_parameter_sets_the_groups():
    """``linear:slices=N`` groups N (batch, head) slices per scan whatever the element budget (how the
    benchmark compares group sizes): 1 -> four groups, 2 -> two (the batch split), 4 -> one."""
    km = padding_mask(23)
    ref = run("dense", "poly", "none", "causal&padding", key_mask=km)
    for slices, text in ((1, "in 4 groups of 1 (batch, head) slices"), (2, "in 2 groups of 2"), (4, None)):
        backend = f"linear:chunk=5,slices={slices}"
        close(run(backend, "poly", "none", "causal&padding", key_mask=km), ref, atol=1e-8)
        why = explain(*inputs(23, 23), "poly", "causal", backend=backend).reasons["linear"]
        assert (text in why) if text else ("groups" not in why), why


class _WeightedLinear(FeatureMap, ka.Kernel):
    """<a, b>_w = sum_d w_d^2 a_d b_d with a trainable (H, 1, D) w: a per-head parameter whose
    gradient must come back through the scans; a user's kernel that declares the FeatureMap capability."""

    name = "weighted_linear"
    positive = False

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.linspace(0.5, 1.5, H * D, dtype=DT).view(H, 1, D))

    def kernel(self, q, k):
        return torch.matmul(q * self.w, (k * self.w).transpose(-1, -2))

    def feature_map(self, x):
        return x * self.w


@pytest.mark.parametrize("filt, tq", [("causal", 23), (None, 23), (None, 11)])
def test_linear_scans_pass_gradients_to_kernel_parameters(monkeypatch, filt, tq):
    # causal, full, and full with Tq != Tk (cross-attention)
    # per-head parameters: groups keep whole heads
    monkeypatch.setitem(POLICIES, "cpu", dataclasses.replace(POLICIES["cpu"], scan_elements=1))
    q, k, v = inputs(tq, 23)
    got = {}
    for backend in ("dense", "linear:chunk=5"):
        kern = _WeightedLinear()
        out = attention(q, k, v, kern, filt, backend=backend)
        got[backend] = (out, torch.autograd.grad(out, [q, k, v, kern.w], torch.ones_like(out) + out.detach()))
    assert got["dense"][1][3].abs().sum() > 0
    close(got["linear:chunk=5"], got["dense"], atol=1e-8)


def test_poly_features_are_the_kernel():
    x, y = torch.randn(5, D, dtype=DT), torch.randn(7, D, dtype=DT)
    for degree in (1, 2, 3):
        kern = ka.make_kernel(f"poly:degree={degree}")
        phi = kern.feature_map(x) @ kern.feature_map(y).T
        torch.testing.assert_close(phi, (x @ y.T) ** degree)
    assert ka.make_kernel("poly:degree=2").feature_map(x).shape[-1] == D * (D + 1) // 2
    from kernel_attention.kernels.capabilities import feature_map

    assert feature_map(ka.make_kernel("exp"), x) is None  # no capability: the backend's query says so
