r"""Multi-head kernel attention: the four parts of Transformer Dissection composed in one module.

    attn = KernelAttention(d_model=512, n_heads=8, kernel="rbf", symmetric=True, position="product",
                           value_position="none", filter="causal")
    y = attn(x)                               # self-attention, positions 0..T-1
    y = attn(x_dec, x_enc, pos_q=pd, pos_k=pe) # encoder-decoder attention

Per head h (Transformer Networks Eqs. 1-3, generalised):

    q_i = g_q(f_i, t_i) W_q^h,   k_j = g_k(f_j, t_j) W_k^h      (g = f, or f + t for the direct sum)
    p_ij = k(x_i, x_j) / sum_{j' in M(i)} k(x_i, x_j')        (kernel x positional factor, filter M)
    v(x_j) = f_j W_v^h  (Eq. 8)   or   (f_j + t_j) W_v^h (Eq. 7)   [+ Shaw's a^V_{t_i - t_j}]
    u_i = sum_h W_o^h sum_j p_ij v(x_j)

``symmetric=True`` uses one projection for queries and keys (W_q = W_k), the valid-kernel variant of
Table 2.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any, Mapping

import torch
from torch import Tensor, nn

from kernel_attention.positions.encodings import as_positions, make_encoding
from kernel_attention.filters import Padding, make_filter
from kernel_attention.functional import attention as kernel_attention_fn
from kernel_attention.inputs import check_broadcast
from kernel_attention.kernels import make_kernel
from kernel_attention.nn.arguments import check_rate, check_sizes, flag
from kernel_attention.positions import AbsolutePosition, default_positions, make_position
from kernel_attention.registry import Param, SpecError
from kernel_attention.smoother import PositionalTerms

__all__ = ["KernelAttention", "VALUE_POSITIONS", "ATTENTION_KEYS", "attention_options"]

#: Value functions: "none" = f W_v (Eq. 8), "absolute" = (f + t) W_v (Eq. 7), "relative" = Shaw's a^V.
VALUE_POSITIONS = ("none", "absolute", "relative")
_value_param = Param("value_position", (str, bool), choices=VALUE_POSITIONS + (True, False))


class KernelAttention(nn.Module):
    """Multi-head attention whose kernel, positional integration, value function and set filter are
    chosen by name.

    Args:
        d_model: model width.
        n_heads: number of heads H.
        d_head: per-head width d (default d_model / H).
        kernel: kernel on the features (``"exp"``, ``"rbf"``, ``"poly"``, ``"linear"``, ``"periodic"``,
            ... or a spec such as ``"poly:degree=3"``).
        symmetric: share the query and key projections (W_q = W_k).
        position: positional scheme (``"none"``, ``"absolute"``, ``"shaw"``, ``"xl"``, ``"product"``).
        value_position: ``"none"`` / False (Eq. 8, default), ``"absolute"`` / True (Eq. 7) or
            ``"relative"`` (Shaw's a^V table; ``position="shaw"`` only).
        filter: the set filter M applied to every call (``"full"``, ``"causal"``, ``"memory"``, ...);
            a call's ``mask`` / ``key_mask`` are intersected with it.
        axes: number of position axes (2 for images).
        dropout: dropout on the attention weights.
        bias: biases in the four projections (fairseq: True; Transformer-XL: False).
        kdim: width of the key/value input when it differs from d_model (encoder-decoder).
        kv_heads: key/value heads H_kv, a divisor of H (grouped-query attention: each is shared by H / H_kv
            consecutive query heads, as ``enable_gqa`` of :func:`kernel_attention.attention`); default H.
        backend: ``"auto"`` or a backend name (``"sdpa"``, ``"triton"``, ``"flex"``, ``"banded"``,
            ``"squared"``, ``"blockwise"``, ``"linear"``, ``"dense"``); see :func:`kernel_attention.explain`.
    """

    def __init__(self, d_model: int, n_heads: int, *, d_head: int | None = None, kernel="exp",
                 symmetric: bool = False, position="none", value_position="none", filter="full",
                 axes: int = 1, dropout: float = 0.0, bias: bool = True, kdim: int | None = None,
                 kv_heads: int | None = None, backend="auto"):
        super().__init__()
        check_sizes("KernelAttention", d_model=d_model, n_heads=n_heads, axes=axes)
        check_rate("KernelAttention", "dropout (of the attention weights)", dropout)
        symmetric, bias = flag("KernelAttention", "symmetric", symmetric), flag("KernelAttention", "bias", bias)
        from kernel_attention.backends.dispatch import AUTO, resolve_backend

        if backend != AUTO:  # an unknown name or a bad parameter fails here, not at the first call
            try:
                resolve_backend(backend)
            except SpecError as e:
                raise SpecError(f"KernelAttention: {e}; or 'auto', the default") from None
        kv_heads = n_heads if kv_heads is None else kv_heads
        if not (isinstance(kv_heads, int) and kv_heads >= 1 and n_heads % kv_heads == 0):
            raise SpecError(f"kv_heads must be a divisor of n_heads={n_heads} (grouped-query attention), "
                            f"got {kv_heads!r}")
        if symmetric and kv_heads != n_heads:
            raise SpecError("symmetric=True shares W_q and W_k, so keys have n_heads heads: leave kv_heads out")
        if d_head is None:
            if d_model % n_heads:
                raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}; pass d_head")
            d_head = d_model // n_heads
        kdim = d_model if kdim is None else kdim
        check_sizes("KernelAttention", d_head=d_head, kdim=kdim)
        value_position = _value_param.coerce(value_position, "KernelAttention")
        value_position = {True: "absolute", False: "none"}.get(value_position, value_position)
        if symmetric and kdim != d_model:
            raise SpecError("symmetric=True shares W_q and W_k, so keys must have width d_model")
        self.d_model, self.n_heads, self.d_head, self.axes = d_model, n_heads, d_head, axes
        self.kernel = make_kernel(kernel, n_heads=n_heads, d_head=d_head)
        self.filter = make_filter(filter)
        if getattr(self.kernel, "pools_over_positions", False) and hides_keys(self.filter):
            raise SpecError(
                f"kernel {self.kernel.name!r} infers its spectral density from q and k pooled over every "
                f"position, so under filter {self.filter!r} a query would see keys the filter hides"
                f"{' (future tokens)' if self.filter.kind == 'causal' else ''}; use "
                f"'{self.kernel.name}:amortized=false' or a filter that keeps all keys")
        self.position = make_position(position, d_model=d_model, n_heads=n_heads, d_head=d_head, axes=axes,
                                      value_position=value_position)
        if value_position == "relative" and not self.position.relative_value:
            raise SpecError(f"value_position='relative' needs a relative value table; position "
                            f"{self.position.name!r} has none (use position='shaw')")
        self.value_position = value_position
        # whether forward needs positions: without, a call given none forms no default ones
        self.reads_positions = self.position.reads_positions or value_position == "absolute"
        if value_position == "absolute":
            # Eq. 7 needs an absolute t; reuse the direct-sum encoding when there is one.
            self.value_encoding = (self.position.encoding if isinstance(self.position, AbsolutePosition)
                                   else make_encoding("sinusoidal", kdim, axes))
        self.symmetric = symmetric
        self.q_proj = nn.Linear(d_model, n_heads * d_head, bias=bias)
        self.kv_heads = kv_heads
        self.k_proj = self.q_proj if symmetric else nn.Linear(kdim, kv_heads * d_head, bias=bias)
        self.v_proj = nn.Linear(kdim, kv_heads * d_head, bias=bias)
        self.out_proj = nn.Linear(n_heads * d_head, d_model, bias=bias)
        self.dropout = dropout
        self.backend = backend
        if symmetric:
            self._register_load_state_dict_pre_hook(_one_shared_projection)

    def extra_repr(self) -> str:
        parts = [f"d_model={self.d_model}", f"n_heads={self.n_heads}", f"d_head={self.d_head}"]
        if self.kv_heads != self.n_heads:
            parts.append(f"kv_heads={self.kv_heads}")
        parts += [f"filter={self.filter!r}", f"value_position={self.value_position!r}"]
        parts += [p for p, on in ((f"dropout={self.dropout}", self.dropout), ("symmetric=True", self.symmetric),
                                  (f"backend={self.backend!r}", self.backend != "auto")) if on]
        return ", ".join(parts)

    def _heads(self, x: Tensor) -> Tensor:
        """(B, T, h·d) -> (B, h, T, d)."""
        b, t, _ = x.shape
        return x.view(b, t, x.shape[-1] // self.d_head, self.d_head).transpose(1, 2)

    def project(self, query: Tensor, key: Tensor, pos_q: Tensor, pos_k: Tensor, offset: int | None = None):
        """Per-head q (B, H, Tq, d), k (B, H_kv, Tk, d), v (B, H_kv, Tk, d) and the positional terms
        (``offset``: the positions are the defaults, :meth:`PositionScheme.terms`); H_kv = ``kv_heads``, each
        key/value head shared by H / H_kv consecutive query heads."""
        fq = self.position.inputs(query, pos_q)
        fk = self.position.inputs(key, pos_k)
        q, k = self._heads(self.q_proj(fq)), self._heads(self.k_proj(fk))
        fv = key + self.value_encoding(pos_k, key.dtype) if self.value_position == "absolute" else key
        v = self._heads(self.v_proj(fv))
        terms = self.position.terms(q, k, pos_q, pos_k, offset)
        if terms is not None and not isinstance(terms, PositionalTerms):  # a scheme of one's own
            raise TypeError(f"position {self.position.name!r}: terms() gave a {type(terms).__name__}; it returns a "
                            f"PositionalTerms (say PositionalTerms(bias=log k_T), (..., Tq, Tk)) or None")
        return q, k, v, terms

    def forward(self, query: Tensor, key: Tensor | None = None, *, pos_q: Tensor | None = None,
                pos_k: Tensor | None = None, query_offset: int | None = None, memory: Tensor | None = None,
                mask=None, key_mask: Tensor | None = None, need_weights: bool = False,
                query_mask: Tensor | None = None):
        """
        Args:
            query: (B, Tq, d_model) features f of the queries.
            key: (B, Tk, kdim) features of the keys/values; None = self-attention on ``query``.
            pos_q, pos_k: integer positions (T,), (T, A) or (B, T, A).  Default: keys 0..Tk-1, queries
                aligned to the last Tq keys in self-attention, 0..Tq-1 in cross-attention.  Positions left to
                their defaults are known without reading them: on a GPU no relative term waits for a read
                of them back to the host.
            query_offset: without ``pos_q``, the queries' first position (one axis): o..o+Tq-1 (say, a
                decoder's cross-attention from the tokens after its cached ones).
            memory: (B, M, d_model) cached states prepended to the keys (Transformer-XL); the caller
                detaches them.  Positions then cover [memory; segment].
            mask: extra filter for this call (bool tensor, float tensor, Filter or name), intersected
                with the module's ``filter``.
            key_mask: (B, Tk) bool, True = real token (padding excluded); covers the memory too.
            query_mask: (B, Tq) bool, True = real query: the queries a kernel pools over (the implicit
                kernels' amortised density).  Default: ``key_mask`` in self-attention without memory, every
                query otherwise (a cross-attention's padded queries: pass them here).
            need_weights: also return the (B, H, Tq, Tk) attention weights.

        Returns:
            (B, Tq, d_model), or ``(output, weights)`` when ``need_weights``.
        """
        self_attention = key is None
        key = query if key is None else key
        if memory is not None:
            if memory.dim() != 3 or memory.shape[0] != key.shape[0] or memory.shape[2] != key.shape[-1]:
                raise ValueError(f"memory must be (B={key.shape[0]}, M, {key.shape[-1]}), the keys' batch and width; "
                                 f"got {tuple(memory.shape)}")
            key = torch.cat([memory, key], dim=1)
        if query.dim() != 3 or key.dim() != 3:
            raise ValueError(f"query and key must be (B, T, d_model), got {tuple(query.shape)} and {tuple(key.shape)}")
        if not (query.is_floating_point() and key.is_floating_point()):
            raise TypeError(f"query and key must be floating-point features, got {query.dtype} and {key.dtype}")
        if query.shape[-1] != self.d_model or key.shape[-1] != self.v_proj.in_features:
            raise ValueError(f"query (B, Tq, {query.shape[-1]}) and key (B, Tk, {key.shape[-1]}): this layer takes "
                             f"query width d_model={self.d_model} and key width kdim={self.v_proj.in_features}")
        tq, tk = query.shape[1], key.shape[1]
        if query_offset is not None and (pos_q is not None or self.axes != 1):
            raise ValueError("query_offset places the default query positions of one axis; got pos_q as well"
                             if pos_q is not None else f"query_offset needs one position axis, this layer has {self.axes}")
        # default positions are known without reading them: t_k = j, t_q = offset + i
        offset = None
        if pos_q is None and pos_k is None and self.axes == 1:
            offset = query_offset if query_offset is not None else (tk - tq if self_attention else 0)
        if self.reads_positions or pos_q is not None or pos_k is not None:  # else none are formed
            if pos_q is None or pos_k is None:
                dq, dk = default_positions(tq, tk, query.device, self_attention, query_offset)
                if self.axes != 1:
                    raise ValueError(f"with {self.axes} position axes, pass pos_q and pos_k explicitly")
                pos_q = dq if pos_q is None else pos_q
                pos_k = dk if pos_k is None else pos_k
            pos_q = as_positions(pos_q, self.axes, "pos_q")
            pos_k = as_positions(pos_k, self.axes, "pos_k")
            if pos_q.shape[1] != tq or pos_k.shape[1] != tk:
                raise ValueError(f"positions do not match the sequences: pos_q has {pos_q.shape[1]} for Tq={tq}, "
                                 f"pos_k has {pos_k.shape[1]} for Tk={tk}")
        # a direct kernel's weights are as exact as q and k (kernel_attention.attention): its projections
        # stay in float32 under autocast too
        wide = not self.kernel.positive and torch.is_autocast_enabled(query.device.type)
        with torch.autocast(query.device.type, enabled=False) if wide else contextlib.nullcontext():
            if wide:
                dt = torch.promote_types(query.dtype, torch.float32)
                query, key = query.to(dt), key.to(dt)
            q, k, v, terms = self.project(query, key, pos_q, pos_k, offset)
            float_mask = isinstance(mask, Tensor) and mask.is_floating_point()
            filt = self.filter if mask is None or float_mask else self.filter & make_filter(mask)
            bias = mask if float_mask else None
            check_broadcast("mask", bias, q, k)  # named as the caller passed it; attention() checks it as a bias
            if query_mask is None and self_attention and memory is None:
                query_mask = key_mask  # the queries are the keys
            out = kernel_attention_fn(q, k, v, self.kernel, filt, key_mask=key_mask, terms=terms, bias=bias,
                                      dropout_p=self.dropout if self.training else 0.0, need_weights=need_weights,
                                      enable_gqa=self.kv_heads != self.n_heads, backend=self.backend,
                                      query_mask=query_mask)
        out, weights = out if need_weights else (out, None)
        b = query.shape[0]
        y = self.out_proj(out.transpose(1, 2).reshape(b, tq, self.n_heads * self.d_head))
        return (y, weights) if need_weights else y


def _one_shared_projection(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                           error_msgs) -> None:
    """Load hook of a symmetric layer: q_proj and k_proj are one module, so a state dict that holds two different
    matrices for them (an asymmetric layer's) would load the last one silently."""
    for name in ("weight", "bias"):
        wq, wk = state_dict.get(f"{prefix}q_proj.{name}"), state_dict.get(f"{prefix}k_proj.{name}")
        if isinstance(wq, Tensor) and isinstance(wk, Tensor) and (wq.shape != wk.shape or not torch.equal(wq, wk)):
            error_msgs.append(f"{prefix or 'KernelAttention'}: symmetric=True shares W_q = W_k, and the state dict "
                              f"holds two different {prefix}q_proj.{name} and {prefix}k_proj.{name} (an asymmetric "
                              f"layer's); load it into KernelAttention(..., symmetric=False)")


def hides_keys(filt) -> bool:
    """Whether a filter removes some key from some query (padding aside), at some length up to 2,048 (a local
    window of 7 keys hides none of 8 positions, but some of 64)."""
    if filt.kind == "full" or isinstance(filt, Padding):
        return False
    for n in (8, 64, 512, 2048):  # on the CPU: works under meta init
        if not bool(filt.mask(n, n, device="cpu", key_mask=torch.ones(1, n, dtype=torch.bool)).all()):
            return True
    return False


#: the keyword arguments of KernelAttention a model's or block's attention options may set (d_model and n_heads
#: come from the model)
ATTENTION_KEYS = tuple(n for n in inspect.signature(KernelAttention.__init__).parameters
                       if n not in ("self", "d_model", "n_heads"))


def attention_options(given: Any, where: str) -> dict[str, Any]:
    """``given`` (None, or a mapping of KernelAttention keyword arguments) as a dict; anything else, or a key
    KernelAttention does not take, fails naming :data:`ATTENTION_KEYS`."""
    if given is None:
        return {}
    if not isinstance(given, Mapping):
        raise SpecError(f"{where}: the attention config must be a mapping of KernelAttention arguments "
                        f"({', '.join(ATTENTION_KEYS)}), got {given!r}")
    unknown = sorted(str(k) for k in set(given) - set(ATTENTION_KEYS))
    if unknown:
        raise SpecError(f"{where}: unknown attention option(s) {', '.join(unknown)}; accepted: "
                        f"{', '.join(ATTENTION_KEYS)}")
    return dict(given)
