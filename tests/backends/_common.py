"""Inputs and comparisons shared by the backend tests: small float64 problems, one call's output and
gradients on a named backend, their comparison with ``dense``, and the backends of
:data:`~kernel_attention.backends.ORDER` that can run a combination; and whether the triton tests run on the GPU."""

import contextlib
import dataclasses

import torch

import kernel_attention as ka
from kernel_attention.backends import ORDER, choose
from kernel_attention.backends.dispatch import resolve_backend
from kernel_attention.backends.policy import POLICIES
from kernel_attention.backends.triton_support import _interpreting
from kernel_attention.functional import attention, build_problem
from kernel_attention.positions import default_positions, make_position

B, H, D = 2, 2, 8
DT = torch.float64
#: the triton tests run the compiled kernels on the GPU; otherwise Triton's interpreter on CPU tensors
TRITON_ON_CUDA = torch.cuda.is_available() and not _interpreting()


def inputs(tq, tk, d=D, seed=0, dtype=DT, b=B, transposed=False):
    """Random q, k, v; ``transposed``: the same values held with the feature dimension strided (views of
    (b, H, d, T) tensors), as a user's transposed inputs are."""
    g = torch.Generator().manual_seed(seed)
    out = [torch.randn(b, H, t, d, generator=g, dtype=dtype) for t in (tq, tk, tk)]
    if transposed:
        out = [x.mT.contiguous().mT for x in out]
    return tuple(x.requires_grad_() for x in out)


def _call(kernel, position, tq, tk, value_position, self_attention, dtype, b, transposed=False):
    pos = make_position(position, d_model=H * D, n_heads=H, d_head=D, value_position=value_position).to(dtype)
    kern = ka.make_kernel(kernel, n_heads=H, d_head=D).to(dtype).eval()
    q, k, v = inputs(tq, tk, dtype=dtype, b=b, transposed=transposed)
    pq, pk = default_positions(tq, tk, "cpu", self_attention)
    return pos, kern, q, k, v, pos.terms(q, k, pq, pk)


def problem(kernel, position="none", filt=None, tq=23, tk=23, key_mask=None, value_position="none",
            self_attention=True, dropout_p=0.0, dtype=DT, b=B):
    """The backend Problem of the call :func:`run` makes with the same arguments."""
    torch.manual_seed(1)
    _, kern, q, k, v, terms = _call(kernel, position, tq, tk, value_position, self_attention, dtype, b)
    return build_problem(q, k, v, kern, filt, terms=terms, key_mask=key_mask, dropout_p=dropout_p)


def capable(p, exclude=("dense",)):
    """The names of ORDER (dense left out) whose backend supports problem ``p`` (capability only: what
    asking for the backend by name runs)."""
    return [n for n in ORDER if n not in exclude and resolve_backend(n).supports(p) is None]


def first_capable(p, exclude=("dense",)):
    """The first name of ORDER other than dense that supports ``p`` (the fast path that runs it), or None."""
    names = capable(p, exclude)
    return names[0] if names else None


def small_blocks(name):
    """``name`` with blocks of 1024 elements where it has a ``block`` parameter, so that several blocks run
    (and skip keys) on tiny inputs."""
    return f"{name}:block=1024" if name in BLOCKED else name


def chosen(p, backend="auto"):
    """The name of the backend that runs ``p``."""
    return choose(p, backend).name


@contextlib.contextmanager
def sliced_from(keys):
    """Inside the block, the CPU policy runs blockwise's slice loops from ``keys`` keys on (a length no test
    reaches: the per-block form those terms take without the loops)."""
    old = POLICIES["cpu"]
    POLICIES["cpu"] = dataclasses.replace(old, sliced_min_keys=keys)
    try:
        yield
    finally:
        POLICIES["cpu"] = old


#: a length no test reaches, for :func:`sliced_from`
NEVER = 1 << 30


def run(backend, kernel, position="none", filt=None, tq=23, tk=23, key_mask=None, value_position="none",
         self_attention=True, dropout_p=0.0, dtype=DT, b=B, transposed=False):
    """Output and gradients (q, k, v, positional and kernel parameters) for one combination."""
    torch.manual_seed(1)
    pos, kern, q, k, v, terms = _call(kernel, position, tq, tk, value_position, self_attention, dtype, b,
                                      transposed)
    torch.manual_seed(2)
    out = attention(q, k, v, kern, filt, terms=terms, key_mask=key_mask, backend=backend, dropout_p=dropout_p)
    params = [q, k, v] + [p for p in pos.parameters()] + [p for p in kern.parameters() if p.requires_grad]
    grads = torch.autograd.grad(out, params, torch.ones_like(out) + out.detach(), allow_unused=True)
    return out, grads


def close(a, b, atol=1e-10):
    out_a, ga = a
    out_b, gb = b
    torch.testing.assert_close(out_a, out_b, atol=atol, rtol=atol)
    for x, y in zip(ga, gb):
        if x is None or y is None:
            assert (x is None or not x.any()) and (y is None or not y.any())
        else:
            torch.testing.assert_close(x, y, atol=atol, rtol=atol)


def padding_mask(tk, empty=False):
    km = torch.ones(B, tk, dtype=torch.bool)
    km[1, tk // 2:] = False
    if empty:
        km[0] = False  # every key of sequence 0 is padding: all its queries have an empty set
    return km



#: the backends with a ``block`` parameter (elements of one (B, H, rows, Tk) block)
BLOCKED = ("blockwise", "squared")
POSITIVE = ["exp", "rbf", "periodic", "ikas"]
POSITIONS = ["none", "shaw", "xl", "product"]
FILTERS = [None, "causal", "local:window=4", "padding"]
