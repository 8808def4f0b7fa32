"""The label-smoothed cross-entropy against PyTorch's own (``cross_entropy`` with ``label_smoothing = eps V / (V - 1)``
is fairseq's loss), in value and gradient, over one block of rows and several."""

import pytest
import torch
import torch.nn.functional as F

from kernel_attention.tasks import cross_entropy
from kernel_attention.tasks.cross_entropy import label_smoothed_nll


def _reference(logits, target, epsilon, ignore_index):
    """PyTorch's smoothed cross-entropy over the kept tokens, and their mean nll, from logits in float32 at least."""
    v = logits.shape[-1]
    x, t = logits.to(torch.promote_types(logits.dtype, torch.float32)).reshape(-1, v), target.reshape(-1)
    keep = torch.ones_like(t, dtype=torch.bool) if ignore_index is None else t.ne(ignore_index)
    if not keep.any():
        return x.sum() * 0, x.sum() * 0
    loss = F.cross_entropy(x[keep], t[keep], label_smoothing=epsilon * v / (v - 1))
    nll = F.cross_entropy(x[keep], t[keep])
    return loss, nll


def test_label_smoothing_matches_fairseq_formula():
    """loss = (1 - eps - eps_i) nll + eps_i sum_v -lprobs_v, eps_i = eps / (V - 1), through autograd."""
    logits, target = torch.randn(3, 4, 7), torch.randint(1, 7, (3, 4))
    target[0, 3] = 0
    x, y = logits.clone().requires_grad_(True), logits.clone().requires_grad_(True)
    loss, nll, n = label_smoothed_nll(x, target, 0.1, ignore_index=0)
    lp = torch.log_softmax(y, -1)[target != 0]
    t = target[target != 0]
    ref_nll = -lp.gather(1, t[:, None]).squeeze(1)
    eps_i = 0.1 / 6
    ref = ((1 - 0.1 - eps_i) * ref_nll - eps_i * lp.sum(-1)).mean()
    assert n == 11
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(nll, ref_nll.mean())
    loss.backward()
    ref.backward()
    torch.testing.assert_close(x.grad, y.grad)


@pytest.fixture(params=["one block", "blocks", "threads"])
def blocks(request, monkeypatch):
    """One block of rows; blocks of 5 rows, the last one short (one thread); several threads (one block)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2 if request.param == "threads" else 1)
    monkeypatch.setattr(cross_entropy, "_CPU_BLOCK", 1 << 19 if request.param == "one block" else 50)
    yield cross_entropy._blocks(torch.empty(24, 10))[1]
    torch.set_num_threads(threads)


@pytest.mark.parametrize("epsilon", [0.0, 0.1])
@pytest.mark.parametrize("ignore_index", [0, None])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_matches_pytorch_cross_entropy_with_gradients(blocks, epsilon, ignore_index, dtype):
    logits = (3 * torch.randn(4, 6, 10)).to(dtype)
    target = torch.randint(1, 10, (4, 6))
    target[0, 4:] = 0
    target[2, 5] = 0
    x = logits.clone().requires_grad_(True)
    loss, nll, n = label_smoothed_nll(x, target, epsilon, ignore_index)
    loss.backward()
    y = logits.clone().requires_grad_(True)
    ref_loss, ref_nll = _reference(y, target, epsilon, ignore_index)
    ref_loss.backward()
    assert n.item() == (24 if ignore_index is None else 21)
    assert loss.dtype == nll.dtype == torch.promote_types(dtype, torch.float32) and not nll.requires_grad
    torch.testing.assert_close(loss, ref_loss)
    torch.testing.assert_close(nll, ref_nll)
    assert x.grad.dtype == dtype
    torch.testing.assert_close(x.grad, y.grad)
    assert torch.equal(x.detach(), logits)  # the logits are read, not worked on in place


@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_gradcheck_in_float64(blocks, epsilon):
    """The closed-form backward against finite differences of the forward."""
    x = torch.randn(4, 5, 6, dtype=torch.float64, requires_grad=True)
    target = torch.randint(0, 6, (4, 5))
    assert torch.autograd.gradcheck(lambda t: label_smoothed_nll(t, target, epsilon)[0], (x,))


def test_nothing_to_score_gives_zeros_not_nan():
    x = torch.randn(3, 7, requires_grad=True)
    loss, nll, n = label_smoothed_nll(x, torch.zeros(3, dtype=torch.long), 0.1, ignore_index=0)
    loss.backward()
    assert n.item() == 0 and loss.item() == nll.item() == 0.0
    assert torch.equal(x.grad, torch.zeros_like(x))


def test_scales_with_the_gradient_it_receives():
    """The backward multiplies by the incoming gradient (a loss scaled by 3 gives 3 times the gradient)."""
    logits, target = torch.randn(5, 8), torch.randint(0, 8, (5,))
    x, y = logits.clone().requires_grad_(True), logits.clone().requires_grad_(True)
    label_smoothed_nll(x, target, 0.1)[0].backward()
    (3 * label_smoothed_nll(y, target, 0.1)[0]).backward()
    torch.testing.assert_close(y.grad, 3 * x.grad)


def test_reads_nothing_back_to_the_host(host_reads):
    """On a GPU a read waits for the device; the count of kept tokens stays a tensor."""
    x = torch.randn(2, 5, 9, requires_grad=True)
    loss, _, _ = label_smoothed_nll(x, torch.randint(0, 9, (2, 5)), 0.1)
    loss.backward()
    assert not [f for f in host_reads if "kernel_attention" in f]


def test_a_target_of_another_shape_is_refused():
    with pytest.raises(ValueError, match=r"need a target of shape \(2, 5\)"):
        label_smoothed_nll(torch.randn(2, 5, 9), torch.zeros(2, 6, dtype=torch.long))


def test_blocks_only_with_one_thread_on_the_cpu(blocks, request):
    """Blocks of rows stay in the cache with one thread; with several, every block would be a parallel region
    waiting for all threads, so the rows form one block."""
    assert blocks == {"one block": 24, "blocks": 5, "threads": 24}[request.node.callspec.params["blocks"]]
