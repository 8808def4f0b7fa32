"""One cell of the backend benchmark (:mod:`kernel_attention.backends.bench`): forward and forward+backward time
and peak memory of one kernel x position x filter on one backend at one shape, with the SDPA baseline timed
interleaved in the same process.  On CPU the parent runs it in a fresh process
(``python -m kernel_attention.backends.bench --cell JSON``), so that the growth of the process's maximum resident
set is the cell's peak; on CUDA in the parent's process, with the allocator's counter reset per cell.
"""

from __future__ import annotations

import resource
import time

from kernel_attention.backends.bench_report import BASELINE

__all__ = ["run_cell", "FILTER_SPECS"]

#: the benchmark's filter names and the specs they stand for (``full``: no mask)
FILTER_SPECS = {"full": None, "causal": "causal", "local": "local:window=128"}


def _maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def run_cell(cell: dict) -> dict:
    import torch
    import torch.nn.functional as F

    from kernel_attention.functional import attention, validation
    from kernel_attention.kernels import make_kernel
    from kernel_attention.positions import default_positions, make_position

    torch.set_num_threads(cell["threads"])
    dev = torch.device(cell["device"])
    dtype = getattr(torch, cell["dtype"])
    b, h, t, d = cell["B"], cell["H"], cell["T"], cell["D"]
    hk = cell.get("kv_heads") or h  # grouped-query attention: k and v with fewer heads, for ours and SDPA alike
    gqa = {"enable_gqa": True} if hk != h else {}
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, n, t, d, device=dev, dtype=dtype).requires_grad_() for n in (h, hk, hk))
    gout = torch.randn(b, h, t, d, device=dev, dtype=dtype)
    filt = FILTER_SPECS.get(cell["filter"], cell["filter"])
    backend = cell["backend"]
    mask, causal = None, False
    if filt == "causal":
        causal = True
    elif filt is not None:
        from kernel_attention.filters import make_filter
        mask = make_filter(filt).mask(t, t, dev)

    drop = cell.get("dropout", 0.0)
    key_mask = None
    if cell.get("padding"):
        key_mask = torch.ones(b, t, dtype=torch.bool, device=dev)
        key_mask[::2, t - int(cell["padding"] * t):] = False
        keep = torch.ones(t, t, dtype=torch.bool, device=dev).tril() if causal else mask
        mask = key_mask[:, None, None, :] if keep is None else keep & key_mask[:, None, None, :]
        causal = False

    def sdpa():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, dropout_p=drop, **gqa)
    if backend == BASELINE:
        fn = sdpa
        params = []
    else:
        # Training mode: forward+backward is a training step, and in eval mode the implicit kernels use
        # their posterior mean, whose R spectral points coincide (two distinct ones: 4 features, not 2R).
        kern = make_kernel(cell["kernel"], n_heads=h, d_head=d).to(dev, dtype).train()
        pos = make_position(cell["position"], d_model=h * d, n_heads=h, d_head=d).to(dev, dtype)
        pq, pk = default_positions(t, t, dev, True)
        params = list(pos.parameters()) + list(kern.parameters())
        # offset 0: the default positions of self-attention, known without reading them, as a layer passes them
        # (KernelAttention); read from the tensors, they would cost host syncs a model does not make

        def fn():
            with validation(cell.get("checks", True)):
                return attention(q, k, v, kern, filt, terms=pos.terms(q, k, pq, pk, 0), backend=backend,
                                 dropout_p=drop, key_mask=key_mask, **gqa)

    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    def fwd(f=fn):
        with torch.no_grad():
            f()
        sync()

    def fwd_bwd(f=fn):
        f().backward(gout)
        for x in [q, k, v] + params:
            x.grad = None
        sync()

    def timed(*fs):
        """Minimum time (ms) of each function over the repeats, the functions interleaved so that a
        change of load on the machine hits them alike."""
        best = [float("inf")] * len(fs)
        for _ in range(cell["repeats"]):
            for i, f in enumerate(fs):
                t0 = time.perf_counter()
                f()
                best[i] = min(best[i], time.perf_counter() - t0)
        return [b * 1000 for b in best]

    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = _maxrss_mb()
    t0 = time.perf_counter()
    fwd_bwd()  # first pass: peak memory (and warm-up)
    first = (time.perf_counter() - t0) * 1000
    peak = ((torch.cuda.max_memory_allocated() - base) / 2 ** 20) if dev.type == "cuda" else _maxrss_mb() - base
    paired = backend != BASELINE
    out = {"peak_mb": peak}
    if paired:  # the SDPA baseline of the same shapes and filter, timed alongside
        fwd_bwd(sdpa)
        out["fb_ms"], out["sdpa_fb_ms"] = timed(fwd_bwd, lambda: fwd_bwd(sdpa))
        out["fb_ms"] = min(out["fb_ms"], first)
        fwd()
        fwd(sdpa)
        out["fwd_ms"], out["sdpa_fwd_ms"] = timed(fwd, lambda: fwd(sdpa))
    else:
        out["fb_ms"] = min(first, timed(fwd_bwd)[0])
        fwd()
        out["fwd_ms"] = timed(fwd)[0]
    return out
