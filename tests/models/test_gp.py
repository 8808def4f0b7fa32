"""The GP rows of IKA Table 4 (models/gp.py) against closed forms: the marginal likelihood, its gradients and
the posterior mean by an explicit Cholesky, the spectral-mixture kernel by a loop over pairs and by its
identity with the RBF kernel; then through the regression task and the trainer (fit, no look at the test
targets, exact resume)."""

import math

import pytest
import torch

from kernel_attention.data import RegressionData
from kernel_attention.models import MODELS
from kernel_attention.models.gp import GPRegressor, SpectralMixture
from kernel_attention.registry import SpecError
from kernel_attention.tasks import build_task
from kernel_attention.training import TrainConfig, Trainer, load_checkpoint


def _data(n=30, f=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, f, generator=g, dtype=torch.float64)
    y = torch.sin(2 * x[:, 0]) + 0.5 * x[:, -1] + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)
    return x, y


def _reference(kxx, kzx, y, noise, c):
    """-log N(y; c, K + σ²I) / N and the posterior mean c + K_zx (K + σ²I)⁻¹ (y - c), by Cholesky."""
    n = y.shape[0]
    chol = torch.linalg.cholesky(kxx + noise * torch.eye(n, dtype=kxx.dtype))
    alpha = torch.cholesky_solve((y - c)[:, None], chol)[:, 0]
    nll = 0.5 * (y - c) @ alpha + chol.diagonal().log().sum() + 0.5 * n * math.log(2 * math.pi)
    return nll / n, c + kzx @ alpha


@pytest.mark.parametrize("ard", [True, False])
def test_rbf_gp_marginal_likelihood_gradients_and_mean_match_a_cholesky(ard):
    x, y = _data()
    z = torch.randn(7, 2, dtype=torch.float64)
    model = MODELS.create({"name": "gp", "kernel": "rbf", "ard": ard}, in_features=2)
    model.condition(x, y)
    covar = model.gp.covar_module
    assert covar.base_kernel.lengthscale.shape == ((1, 2) if ard else (1, 1))
    with torch.no_grad():  # away from the defaults, so that a swapped parameter would show
        covar.base_kernel.lengthscale = torch.tensor([[0.7, 1.9]] if ard else [[1.3]], dtype=torch.float64)
        covar.outputscale = 1.3
        model.gp.likelihood.noise = 0.05
        model.gp.mean_module.constant.fill_(0.2)
    params = [covar.base_kernel.raw_lengthscale, covar.raw_outputscale, model.gp.likelihood.raw_noise,
              model.gp.mean_module.raw_constant]

    def rbf(a, b):
        ell = covar.base_kernel.lengthscale[0]
        return covar.outputscale * torch.exp(-0.5 * (((a[:, None] - b[None]) / ell) ** 2).sum(-1))

    ref_nll, ref_mean = _reference(rbf(x, x), rbf(z, x), y, model.gp.likelihood.noise[0],
                                   model.gp.mean_module.constant)
    ref_grads = torch.autograd.grad(ref_nll, params)
    nll = model.negative_mll()
    torch.testing.assert_close(nll, ref_nll, rtol=1e-9, atol=1e-9)
    for got, want in zip(torch.autograd.grad(nll, params), ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-7, atol=1e-9)
    model.eval()
    with torch.no_grad():
        mean = model(z[None].float())
    assert mean.shape == (1, 7) and mean.dtype == torch.float32
    torch.testing.assert_close(mean[0].double(), ref_mean.detach(), rtol=1e-5, atol=1e-5)


def test_spectral_mixture_is_its_formula_positive_definite_and_an_rbf_at_zero_frequency():
    torch.manual_seed(0)
    x = torch.randn(9, 3, dtype=torch.float64)
    sm = SpectralMixture(3, 3).double()
    sm.initialize_from_data(x, torch.randn(9, dtype=torch.float64))
    with torch.no_grad():
        sm.raw_means.add_(0.3)  # mixture 0 starts at frequency 0; move it, so that every cosine is exercised
    w, mu, s = sm.weights, sm.means, sm.scales
    loop = torch.zeros(9, 9, dtype=torch.float64)
    for i in range(9):
        for j in range(9):
            tau = x[i] - x[j]
            loop[i, j] = sum(w[q] * torch.exp(-2 * math.pi ** 2 * (s[q] ** 2 * tau ** 2).sum())
                             * torch.cos(2 * math.pi * (mu[q] * tau).sum()) for q in range(3))
    k = sm(x, x).to_dense()
    torch.testing.assert_close(k, loop, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(sm(x, x, diag=True), loop.diagonal(), rtol=1e-12, atol=1e-12)
    assert torch.linalg.eigvalsh(k.detach()).min() > 0
    # one mixture at μ = 0: w exp(-2π² v τ²) is the RBF kernel with ℓ² = 1 / (4π² v)
    one = SpectralMixture(1, 3).double()
    one._set("means", torch.full((1, 3), 1e-30, dtype=torch.float64))
    one._set("scales", torch.tensor([[0.2, 0.5, 1.0]], dtype=torch.float64))
    one._set("weights", torch.tensor([1.5], dtype=torch.float64))
    ell = 1 / (2 * math.pi * one.scales[0])
    rbf = 1.5 * torch.exp(-0.5 * (((x[:, None] - x[None]) / ell) ** 2).sum(-1))
    torch.testing.assert_close(one(x, x).to_dense(), rbf, rtol=1e-12, atol=1e-12)


def _sm_loop(x1, x2, w, mu, s):
    """Σ_q w_q exp(-2π² Σ_d s_qd² τ_d²) cos(2π μ_qᵀτ) over all pairs, broadcast, for autograd to differentiate."""
    tau = x1[..., :, None, :] - x2[..., None, :, :]                           # (..., N1, N2, F)
    return sum(w[q] * torch.exp(-2 * math.pi ** 2 * ((s[q] * tau) ** 2).sum(-1))
               * torch.cos(2 * math.pi * (tau @ mu[q])) for q in range(w.shape[0]))


@pytest.mark.parametrize("shapes", [((6, 3), (4, 3)), ((2, 5, 2), (2, 3, 2)), "same"])
def test_spectral_mixture_gradients_match_autograd_of_the_loop_and_finite_differences(shapes):
    """The kernel matrix's own backward (recomputed per mixture) for w, μ, √v and both inputs, with and
    without batch dimensions and with x1 the same tensor as x2 (the training covariance)."""
    from kernel_attention.models.spectral_mixture import _SpectralMixtureMatrix
    g = torch.Generator().manual_seed(0)

    def rand(*shape, scale=1.0, shift=0.0):
        return (shift + scale * torch.rand(*shape, generator=g, dtype=torch.float64)).requires_grad_()
    x1 = rand(5, 2, scale=2.0, shift=-1.0) if shapes == "same" else rand(*shapes[0], scale=2.0, shift=-1.0)
    x2 = x1 if shapes == "same" else rand(*shapes[1], scale=2.0, shift=-1.0)
    f = x1.shape[-1]
    w, mu, s = rand(3, shift=0.5), rand(3, f, scale=0.8, shift=0.1), rand(3, f, scale=0.5, shift=0.1)
    inputs = (x1, w, mu, s) if shapes == "same" else (x1, x2, w, mu, s)
    out = _SpectralMixtureMatrix.apply(x1, x2, w, mu, s)
    ref = _sm_loop(x1, x2, w, mu, s)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    upstream = torch.randn(out.shape, generator=g, dtype=torch.float64)
    got = torch.autograd.grad(out, inputs, upstream)
    want = torch.autograd.grad(ref, inputs, upstream)
    for a, b, name in zip(got, want, ("x1", "w", "mu", "s") if shapes == "same" else ("x1", "x2", "w", "mu", "s")):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=name)
    assert torch.autograd.gradcheck(lambda *a: _SpectralMixtureMatrix.apply(*(a[:1] + a if shapes == "same" else a)),
                                    inputs)


def test_spectral_mixture_keeps_no_pairwise_tensor_for_its_backward():
    """What autograd keeps for the N×N kernel matrix: its inputs and parameters only (O(N·F)), where the
    composed formula kept several N×N tensors per mixture (Parkinsons: 20 of 224 MB each)."""
    n, f = 200, 4
    x = torch.randn(n, f, dtype=torch.float64)
    sm = SpectralMixture(4, f).double()
    sm.initialize_from_data(x, torch.randn(n, dtype=torch.float64))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        k = sm(x, x).to_dense()
    assert k.shape == (n, n) and k.requires_grad
    assert sum(saved) < n * n, saved
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        _sm_loop(x, x, sm.weights, sm.means, sm.scales)
    assert sum(saved) > 4 * n * n  # the hook does see what a composed formula keeps


def test_sm_start_keeps_the_likeliest_of_its_draws(monkeypatch):
    x, y = _data(40, 1)
    model = GPRegressor(1, kernel="sm", restarts=6)
    nlls = []
    original = SpectralMixture.initialize_from_data

    def draw(self, xx, yy):
        original(self, xx, yy)
        with torch.no_grad():
            nlls.append(float(model.negative_mll()))
    monkeypatch.setattr(SpectralMixture, "initialize_from_data", draw)
    torch.manual_seed(3)
    model.condition(x, y)
    assert len(nlls) == 6 and len(set(nlls)) == 6
    with torch.no_grad():
        assert float(model.negative_mll()) == min(nlls)


def test_gp_rejects_what_it_cannot_fit():
    with pytest.raises(SpecError, match=r"kernel='periodic' is not one of \['rbf', 'sm'\]"):
        MODELS.create({"name": "gp", "kernel": "periodic"}, in_features=2)
    model = GPRegressor(2)
    with pytest.raises(RuntimeError, match="condition"):
        model(torch.zeros(1, 3, 2))
    with pytest.raises(ValueError, match=r"must be \(N, 2\)"):
        model.condition(torch.zeros(5, 3), torch.zeros(5))
    with pytest.raises(ValueError, match="5 training inputs but 4 targets"):
        model.condition(torch.zeros(5, 2), torch.zeros(4))
    with pytest.raises(ValueError, match="NaN"):
        model.condition(torch.tensor([[0.0, float("nan")]]), torch.zeros(1))
    model.condition(torch.zeros(5, 2), torch.zeros(5))
    with pytest.raises(ValueError, match=r"takes \(B, N, 2\), got \(5, 2\)"):
        model(torch.zeros(5, 2))
    with pytest.raises(ValueError, match="inputs hold NaN"):
        model(torch.full((1, 3, 2), float("inf")))
    with pytest.raises(ValueError, match="one target"):
        GPRegressor(2, out_features=2)


def _sine_task(kernel, seed=1):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(150, 1, generator=g, dtype=torch.float64) * 10
    y = torch.sin(x) + 0.1 * torch.randn(150, 1, generator=g, dtype=torch.float64)
    ds = RegressionData("sine", x, y, ["t"], "y")
    return build_task({"task": {"name": "regression", "scale": "standard", "valid_fraction": 0.0},
                       "data": {"dataset": ds}, "model": {"name": "gp", "kernel": kernel, "restarts": 4},
                       "seed": seed}), y


@pytest.mark.parametrize("kernel", ["rbf", "sm"])
def test_gp_rows_fit_a_noisy_sine_through_the_trainer(tmp_path, kernel):
    task, y = _sine_task(kernel)
    trainer = Trainer(task, TrainConfig(max_steps=60, lr=0.1, eval_every=0, progress=False, test_best=False),
                      tmp_path / kernel)
    with torch.no_grad():  # as the trainer evaluates
        before = task.evaluate(trainer.model.eval(), "test")["rmse"]
    trainer.fit()
    after = trainer.evaluate("test")["rmse"]
    assert after < 0.2 < 0.5 * float(y.std()) and after < before  # the noise is 0.1


def test_gp_sees_neither_test_targets_in_its_loss_nor_in_its_predictions():
    task, _ = _sine_task("rbf")
    model = task.build_model()
    batch = next(iter(task.train_batches(0)))
    loss = task.loss(model, batch)[0]
    test_rows = task.index["test"]
    with torch.no_grad():
        before = model(task.x[None])[0, test_rows]
    task.y[test_rows] += 100.0             # the task's targets at the test rows, after the model was built
    again = task.build_model()
    torch.testing.assert_close(task.loss(again, batch)[0], loss)
    with torch.no_grad():
        torch.testing.assert_close(again(task.x[None])[0, test_rows], before)


def test_an_interrupted_gp_run_resumes_exactly(tmp_path):
    def cfg(**kw):
        return TrainConfig(max_steps=8, lr=0.1, eval_every=2, checkpoint_every=3, progress=False, seed=5, **kw)
    Trainer(_sine_task("sm")[0], cfg(), tmp_path / "full").fit()
    Trainer(_sine_task("sm")[0], cfg(stop_after=5), tmp_path / "part").fit()
    resumed = Trainer(_sine_task("sm")[0], cfg(), tmp_path / "part")
    assert resumed.resumed_from == 3
    resumed.fit()
    a = load_checkpoint(tmp_path / "full" / "last.pt")["model"]
    b = load_checkpoint(tmp_path / "part" / "last.pt")["model"]
    assert a.keys() == b.keys() and any("raw_means" in k for k in a)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)


def test_gp_refuses_to_train_data_parallel():
    task, _ = _sine_task("rbf")

    class Wrapped(torch.nn.Module):  # what DistributedDataParallel looks like to unwrap()
        def __init__(self, module):
            super().__init__()
            self.module = module
    with pytest.raises(RuntimeError, match="trains in one process"):
        task.loss(Wrapped(task.build_model()), next(iter(task.train_batches(0))))
