r"""The kernel base class, the forms backends read (:class:`SDPAForm`, :class:`SquaredForm`), the kernel
registry and :func:`make_kernel`.

A kernel acts on per-head projected features q (B, H, Tq, D) and k (B, H, Tk, D).  Positive kernels
(``positive = True``) return log k, and the smoother takes a soft-max of it; direct kernels return k, which
the smoother normalises as k / sum k.  The kernels themselves live in :mod:`~kernel_attention.kernels.classic`
(Transformer Dissection's) and :mod:`~kernel_attention.kernels.implicit` (Implicit Kernel Attention's).
"""

from __future__ import annotations

import dataclasses

from torch import Tensor, nn

from kernel_attention.registry import Registry, SpecError, spec_string

__all__ = ["Kernel", "SDPAForm", "SquaredForm", "KERNELS", "make_kernel", "kernel_matrix", "with_scale"]


@dataclasses.dataclass
class SDPAForm:
    r"""A positive kernel written for fused soft-max attention:

        log k(q_i, k_j) = scale · <q_i', k_j'> + key_bias_j + (a term constant along each row)

    ``q`` (B, H, Tq, D'), ``k`` (B, H, Tk, D') are the (possibly augmented) features and ``key_bias``
    (B, H, 1, Tk) or None a per-key term.  The row-constant term cancels in the smoother."""

    q: Tensor
    k: Tensor
    scale: float
    key_bias: Tensor | None = None


@dataclasses.dataclass
class SquaredForm:
    r"""A positive kernel that is a squared feature product times a per-key factor:

        k(q_i, k_j) = c_i · (<q_i', k_j'>^2 + eps) · exp(key_log_j)

    ``q`` (B, H, Tq, F) and ``k`` (B, H, Tk, F) are the features (any normaliser folded into ``q``),
    ``key_log`` (B|1, H, Tk) the per-key log factor; c_i > 0 is constant along a row and cancels.  The
    implicit kernels (random-feature similarity f^2 + eps times the magnitude) have this form, which
    lets a backend form k itself per pair instead of log k (:mod:`kernel_attention.backends.squared`).

    With ``drop`` > 0 (magnitude dropout, the implicit kernels' official form in training) the pair's
    magnitude is dropped, not the row's, so the query's factor no longer cancels:

        k(q_i, k_j) = (<q_i', k_j'>^2 + eps) · exp(D_ij · (query_log_i + key_log_j))

    ``query_log`` (B|1, H, Tq); both logs already carry the 1 / (1 - drop) of inverted dropout, and
    D_ij is 1 where the block whose first query row is r0 and first key c0 keeps the pair:
    ``keep_mask((B, H, keys, rows), drop, block_seed(seed, r0, c0))`` transposed
    (:mod:`kernel_attention.dropout`), the distribution of
    :meth:`SimilarityMagnitudeKernel.block_magnitude`'s masks in the squared path's key-major layout."""

    q: Tensor
    k: Tensor
    eps: float
    key_log: Tensor
    query_log: Tensor | None = None
    drop: float = 0.0
    seed: int = 0


class Kernel(nn.Module):
    """Base class of a kernel on per-head features.

    Subclasses set ``positive`` and implement :meth:`log_kernel` (positive kernels) or :meth:`kernel`
    (direct kernels).  ``psd`` says whether the kernel is positive semi-definite when both arguments
    come from the same projection (the symmetric form).  What a fast backend can do with a kernel is
    told by the capabilities it mixes in (:mod:`~kernel_attention.kernels.capabilities`).
    """

    name: str = "kernel"
    positive: bool = True
    psd: bool = True

    def __init__(self):
        # An explicit signature: the registry passes context sizes (n_heads, d_head) only to
        # constructors that name them, and nn.Module's own (*args, **kwargs) would accept anything.
        super().__init__()

    def __init_subclass__(cls, **kwargs):
        """A direct kernel (``positive = False``) is read through :meth:`kernel`; one that defines only
        :meth:`log_kernel` would be taken as exp of what it returns."""
        super().__init_subclass__(**kwargs)
        if not cls.positive and cls.kernel is Kernel.kernel:
            raise TypeError(f"kernel class {cls.__name__}: positive = False (k may be zero or negative, no log) "
                            f"reads k itself from kernel(q, k), which it does not define; define kernel(q, k), "
                            f"or set positive = True for a log_kernel")

    def log_kernel(self, q: Tensor, k: Tensor) -> Tensor:
        """log k(q_i, k_j): (B, H, Tq, D), (B, H, Tk, D) -> (B, H, Tq, Tk)."""
        raise NotImplementedError(f"kernel {self.name!r} is not positive; use .kernel()")

    def kernel(self, q: Tensor, k: Tensor) -> Tensor:
        """k(q_i, k_j): (B, H, Tq, D), (B, H, Tk, D) -> (B, H, Tq, Tk)."""
        return self.log_kernel(q, k).exp()

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.hparams().items())

    def hparams(self) -> dict:
        return {}


KERNELS = Registry("kernel", base=Kernel)


def with_scale(kernel, scale: float | None):
    """``kernel`` with the scale of its exponent set to ``scale`` (the ``scale=`` of PyTorch's fused attention):
    a spec string gains ``scale=``, so that it is still kept between calls.  A kernel object, a kernel without
    a ``scale`` parameter, or a spec that gives another scale, is refused."""
    if scale is None:
        return kernel
    if isinstance(kernel, Kernel):
        raise ValueError(f"scale= goes with a kernel given by name; a kernel object takes its scale when built "
                         f"(for instance ExpKernel(scale={scale}))")
    name, params = KERNELS.validate(kernel)
    if "scale" not in params:
        scaled = ", ".join(n for n in KERNELS.names() if any(p.name == "scale" for p in KERNELS.entry(n).params))
        raise SpecError(f"kernel {name!r} has no scale; scale= applies to {scaled}")
    if params["scale"] is not None and params["scale"] != scale:
        raise SpecError(f"scale={scale} and the kernel spec's scale={params['scale']} disagree; give one of them")
    return spec_string(name, {**params, "scale": float(scale)})


def kernel_matrix(kernel: Kernel, q: Tensor, k: Tensor, log: bool = True) -> Tensor:
    """``kernel.log_kernel(q, k)`` (``log``) or ``kernel.kernel(q, k)``, checked to be (B, H, Tq, Tk) for q
    (B, H, Tq, D) and k (B, H, Tk, D): a kernel of one's own that returned a smaller, broadcastable shape (one
    batch row for all, one key) would otherwise be averaged without a word."""
    out = kernel.log_kernel(q, k) if log else kernel.kernel(q, k)
    want = (*q.shape[:-1], k.shape[-2])
    if not isinstance(out, Tensor) or tuple(out.shape) != want:
        got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise ValueError(f"kernel {kernel.name!r}: {'log_kernel' if log else 'kernel'}(q, k) gave {got}, not (B, H, "
                         f"Tq, Tk) = {want} for q {tuple(q.shape)} and k {tuple(k.shape)}")
    return out

#: the sizes of a layer that :func:`make_kernel` passes on to the kernels whose constructor names them
KERNEL_CONTEXT = ("n_heads", "d_head")


def make_kernel(spec, **kwargs) -> Kernel:
    """A kernel from a name, ``"name:key=value"``, a mapping, or a :class:`Kernel` instance.

    ``kwargs`` are the kernel's parameters (``make_kernel("rbf", scale=0.3)`` is ``make_kernel("rbf:scale=0.3")``)
    and the layer's sizes, ``n_heads`` and ``d_head``, which reach the kernels whose constructor names them (the
    implicit kernels hold per-head spectral parameters)."""
    if isinstance(spec, Kernel):
        return spec
    spec, context = KERNELS.with_params(spec, kwargs, KERNEL_CONTEXT)
    return KERNELS.create(spec, **context)
