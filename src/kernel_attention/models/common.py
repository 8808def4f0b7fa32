r"""Pieces every model family shares: per-place attention configs, scaled embeddings, weight capture.

An *attention config* is a dict of :class:`~kernel_attention.nn.attention.KernelAttention` keyword arguments
(``kernel=``, ``symmetric=``, ``position=``, ``value_position=``, ``filter=``, ``dropout=``, ``bias=``, ...).
Models take one per place, e.g. the translation model's encoder self-attention (A), encoder-decoder
attention (B) and decoder self-attention (C) -- Transformer Dissection's Table 3 differs only in C.
:func:`attention_config` merges the model's defaults under the user's dict, rejects unknown keys naming
the accepted ones, and checks the impossible combinations before any weights are built.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Any, Iterator, Mapping

import torch
from torch import Tensor, nn

from kernel_attention.nn.attention import ATTENTION_KEYS, KernelAttention, attention_options
from kernel_attention.positions.encodings import sinusoid
from kernel_attention.filters import And, Filter, Memory, Or, make_filter
from kernel_attention.kernels import KERNELS
from kernel_attention.positions import POSITIONS
from kernel_attention.registry import SpecError

__all__ = ["ATTENTION_KEYS", "attention_config", "config_place", "ScaledEmbedding", "sinusoidal_input",
           "collect_decompositions", "share_xl_biases", "KernelRegularized"]



@contextmanager
def config_place(where: str) -> Iterator[None]:
    """A :class:`SpecError` raised inside names the config place it concerns (``decoder_attention (C): ...``)."""
    try:
        yield
    except SpecError as e:
        raise SpecError(f"{where}: {e}") from None


def attention_config(user: Mapping[str, Any] | None, where: str, **defaults: Any) -> dict[str, Any]:
    """``defaults`` overridden by ``user``; unknown keys and impossible combinations fail here.

    Checked: every key is a KernelAttention argument; the kernel, position and filter names exist with
    valid parameters; ``value_position="relative"`` needs ``position="shaw"``; no filter reads the padding mask
    itself (the models pass it with each batch, and a language model's segments or a decoding step have none).
    """
    cfg = {**defaults, **attention_options(user, where)}
    with config_place(where):
        if not isinstance(cfg.get("kernel", "exp"), nn.Module):
            KERNELS.validate(cfg.get("kernel", "exp"))
        position = cfg.get("position", "none")
        pos_name = position.name if isinstance(position, nn.Module) else POSITIONS.validate(position)[0]
        if not isinstance(cfg.get("filter", "full"), Tensor) and make_filter(cfg.get("filter", "full")).needs_key_mask:
            raise SpecError(f"filter {cfg['filter']!r} reads a batch's padding mask, which the model applies to "
                            f"every attention already (padding keys never take part); leave 'padding' out")
        vp = cfg.get("value_position", "none")
        if vp == "relative" and pos_name != "shaw":
            raise SpecError(f"value_position='relative' is Shaw's a^V table and needs position='shaw', "
                            f"got position={pos_name!r}")
        if vp not in ("none", "absolute", "relative", True, False):
            raise SpecError(f"value_position={vp!r} is not one of ['none', 'absolute', 'relative']")
    return cfg


def with_position_param(cfg: dict[str, Any], name: str, key: str, value: Any) -> dict[str, Any]:
    """``cfg`` with ``position`` rewritten to carry ``key=value`` when the scheme is ``name``."""
    position = cfg.get("position", "none")
    if isinstance(position, nn.Module) or value is None:
        return cfg
    pname, params = POSITIONS.validate(position)
    if pname != name:
        return cfg
    return {**cfg, "position": {"name": pname, **params, key: value}}


def causal_filter(spec: Any) -> Any:
    """A decoder self-attention filter: the user's filter intersected with causal (never leaks the future); a
    filter that keeps no future key already (``causal``, ``memory``, ``causal&local:window=4``) as it is."""
    if spec is None or spec == "full":
        return "causal"
    user = make_filter(spec)
    return spec if within_causal(user) else make_filter("causal") & user


def within_causal(f: Filter) -> bool:
    """Whether filter ``f`` keeps no key after a query's own position, read off its structure: a causal
    filter, a memory one, an intersection with such a filter, a union of such filters."""
    if f.kind == "causal" or isinstance(f, Memory):
        return True
    if isinstance(f, And):
        return within_causal(f.a) or within_causal(f.b)
    if isinstance(f, Or):
        return within_causal(f.a) and within_causal(f.b)
    return False


class KernelRegularized:
    """Mixin for models whose attention may use the implicit kernels of IKA.

    ``finish_kernels()`` (end of the constructor) makes the implicit kernels share one spectral density
    (the paper's shared estimator, :func:`kernel_attention.kernels.implicit.share_spectral`);
    ``regularization()`` is their KL (+ copula) term of the last forward pass divided by ``n_train``, the
    number of training examples, which the task sets (the trainer adds it to the loss).  Zero when no
    kernel is implicit.
    """

    n_train: float = 1.0

    def finish_kernels(self) -> None:
        from kernel_attention.kernels.implicit import share_spectral
        share_spectral(self)

    def regularization(self) -> Tensor:
        from kernel_attention.kernels.implicit import regularization
        return regularization(self, self.n_train)


def share_xl_biases(attentions) -> tuple[nn.Parameter, nn.Parameter] | None:
    """Give every ``xl`` attention in ``attentions`` one shared (H, d) pair u, v (Transformer-XL's r_w_bias
    and r_r_bias, created once per model); returns the pair, or None when none of them is ``xl``."""
    from kernel_attention.positions import XLPosition

    xl = [a for a in attentions if isinstance(a.position, XLPosition)]
    if not xl:
        return None
    u = nn.Parameter(torch.randn(xl[0].n_heads, xl[0].d_head) * 0.02)
    v = nn.Parameter(torch.randn(xl[0].n_heads, xl[0].d_head) * 0.02)
    for a in xl:
        a.position.share_biases(u, v)
    return u, v


class ScaledEmbedding(nn.Module):
    """Token embedding scaled by sqrt(d) (Vaswani; fairseq's ``embed_scale``; Transformer-XL's ``emb_scale``).

    Initialised N(0, d^-1/2) with the padding row zero, as fairseq does; the same matrix can serve as the
    tied output projection (``logits = h E^T``).
    """

    def __init__(self, vocab_size: int, d_model: int, pad_id: int | None = 0, scale: bool = True):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model, padding_idx=pad_id)
        nn.init.normal_(self.embed.weight, mean=0.0, std=d_model ** -0.5)
        if pad_id is not None:
            with torch.no_grad():
                self.embed.weight[pad_id].zero_()
        self.scale = math.sqrt(d_model) if scale else 1.0

    @property
    def weight(self) -> Tensor:
        return self.embed.weight

    def forward(self, tokens: Tensor) -> Tensor:
        """(B, T) long -> (B, T, d)."""
        return self.embed(tokens) * self.scale


def sinusoidal_input(x: Tensor, pos: Tensor) -> Tensor:
    """The standard Vaswani baseline: add the sinusoid of positions ``pos`` (T,) once to (B, T, d)."""
    return x + sinusoid(pos, x.shape[-1]).to(x.dtype)


def collect_decompositions(model: nn.Module, run) -> list[dict[str, Any]]:
    """Similarity and magnitude terms of every attention whose kernel splits log k that way: ``exp``
    (IKA Proposition 1) and the implicit kernels (their ``decompose``), via
    :func:`kernel_attention.kernels.decomposition.decompose`.

    ``run()`` performs one forward pass; each :class:`KernelAttention` in ``model`` records, per call,
    ``{"module": name, "log_similarity": (B,H,Tq,Tk), "log_magnitude": (B,H,Tq,Tk)}`` computed from its per-head
    projections q, k (the kernel on f only: positional factors and filters are not included).  Attentions
    whose kernel has no decomposition are skipped.
    """
    from kernel_attention.kernels.decomposition import decompose
    from kernel_attention.kernels import ExpKernel

    out: list[dict[str, Any]] = []
    patched = []
    for name, mod in model.named_modules():
        if isinstance(mod, KernelAttention) and (isinstance(mod.kernel, ExpKernel) or hasattr(mod.kernel, "decompose")):
            def wrapped(*a, _orig=mod.project, _m=mod, _name=name, **kw):
                res = _orig(*a, **kw)
                sim, mag = decompose(_m.kernel, res[0], res[1])
                out.append({"module": _name, "log_similarity": sim, "log_magnitude": mag})
                return res
            mod.project = wrapped  # an instance attribute shadows the method for this pass only
            patched.append(mod)
    try:
        with torch.no_grad():
            run()
    finally:
        for mod in patched:
            del mod.project
    return out
