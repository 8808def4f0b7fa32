"""``kernel-attention check``: every registered variant against an independent reference.

Kernels, positional schemes, value functions and filters are compared with the plain O(T²) loops of
:mod:`kernel_attention.reference`; ``exp`` also with PyTorch's fused attention and IKA's Proposition 1 (log k =
log similarity + log magnitude); the similarity of each positive similarity x magnitude kernel with IKA's scalar
formula, pair by pair, and the normalisation of their weights; each backend with ``dense`` on the first of a few
calls it runs (a backend this machine runs none of, such as a GPU's, is listed as not checked, with why).  Prints
one line per check and exits non-zero if any disagrees.
"""

from __future__ import annotations

import argparse
import time

import torch

TOL64, TOL32 = 1e-8, 1e-5  # float64 checks, float32 checks (fused kernels run in float32)
#: the calls a backend is checked on (kernel, position, filter), the first it runs: each backend runs one of them
_BACKEND_CALLS = [("rbf", "none", "causal"), ("exp", "shaw:clip=4", "causal"), ("ikan", "none", "full"),
                  ("linear", "none", "causal")]


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("check", help="list every registered variant and check it against its reference",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=0)
    return p


def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


_NO_REFERENCE = "a part of your own (registered outside the library): no reference here to check it against"


def _users(registry, name: str) -> bool:
    """Whether the part registered as ``name`` is the user's (its class defined outside this package)."""
    return not getattr(registry.entry(name).factory, "__module__", "").startswith("kernel_attention.")


def _checks():
    """Yield (part, name, reference, error, tolerance) for every registered variant; error None: not checked
    on this machine (the reference says why)."""
    import kernel_attention as ka
    from kernel_attention import reference as R

    q = torch.randn(2, 2, 4, 6, dtype=torch.float64)
    k = torch.randn(2, 2, 5, 6, dtype=torch.float64)
    v = torch.randn(2, 2, 5, 3, dtype=torch.float64)
    explicit = {"exp", "rbf", "poly", "linear", "periodic"}
    for name in ka.KERNELS.names():
        if _users(ka.KERNELS, name):
            yield "kernel", name, _NO_REFERENCE, None, TOL64
        elif name in explicit:
            out = ka.attention(q, k, v, kernel=name, mask="causal")
            ref = R.smoother_loop(q, k, v, lambda a, b, n=name: R.kernel_value(n, a, b),
                                  R.filter_keep("causal", 4, 5))
            yield "kernel", name, "O(T^2) loop of Table 2's formula", _err(out, ref), TOL64
        else:
            layer = ka.KernelAttention(12, 2, kernel=name).double().eval()
            x = torch.randn(2, 5, 12, dtype=torch.float64)
            pos = ka.positions.encodings.as_positions(torch.arange(5), 1)
            qh, kh, _, _ = layer.project(x, x, pos, pos)
            kern = layer.kernel
            if hasattr(kern, "log_similarity") and kern.positive:
                # the similarity of each (query, key) pair against IKA's scalar formula (Eqs. 12-16)
                sim, _ = kern.decompose(qh, kh)
                ref_name = name if name in ("rbf-only", "expsin") else "implicit"
                ws = kern.prepare(qh, kh) if ref_name == "implicit" else None
                params = ({"lengthscale": kern.lengthscale, "period": getattr(kern, "period", None)} if ws is None
                          else {"freq_scale": kern.freq_scale, "eps": kern.eps})
                want = torch.stack([torch.stack([R.log_similarity_value(
                    ref_name, qh[0, 0, i], kh[0, 0, j], ws=None if ws is None else [w[0, 0] for w in ws], **params)
                    for j in range(kh.shape[2])]) for i in range(qh.shape[2])])
                yield "kernel", name, "IKA's similarity formula, per pair", _err(sim[0, 0], want), TOL64
            _, w = layer(x, need_weights=True)
            negative = float((-w).clamp_min(0).max()) if kern.positive else 0.0
            yield ("kernel", name, "weights >= 0 sum to 1" if kern.positive else "weights sum to 1",
                   max(_err(w.sum(-1), torch.ones_like(w.sum(-1))), negative), TOL64)
    sim, mag = ka.decompose("exp", q, k)
    yield "kernel", "exp", "IKA Prop. 1: RBF similarity x magnitude", _err(
        sim + mag, ka.make_kernel("exp").log_kernel(q, k)), TOL64
    qf, kf, vf = q.float(), k[:, :, :4].float(), v[:, :, :4].float()
    yield "kernel", "exp", "torch scaled_dot_product_attention", _err(
        ka.attention(qf, kf, vf, mask="causal"),
        torch.nn.functional.scaled_dot_product_attention(qf, kf, vf, is_causal=True)), TOL32

    x, mem = torch.randn(2, 3, 12, dtype=torch.float64), torch.randn(2, 2, 12, dtype=torch.float64)
    for name in ka.POSITIONS.names():
        if _users(ka.POSITIONS, name):
            yield "position", name, _NO_REFERENCE, None, TOL64
            continue
        values = ["none", "absolute"] + (["relative"] if name == "shaw" else [])
        for value in values:
            layer = ka.KernelAttention(12, 2, kernel="rbf", position=name, value_position=value,
                                       filter="memory").double()
            ref = R.module_loop(layer, x, memory=mem, keep=R.filter_keep("memory", 3, 5))
            yield "position", f"{name} (value={value})", "per-pair formula, memory filter", _err(
                layer(x, memory=mem), ref), TOL64

    cases = {"full": {}, "causal": {}, "memory": {"same_length": True, "mem_len": 2}, "local": {"window": 1},
             "strided": {"stride": 2}, "fixed": {"stride": 2}}
    for name in ka.FILTERS.names():
        if _users(ka.FILTERS, name):
            yield "filter", name, _NO_REFERENCE, None, 0.0
            continue
        if name in ("padding", "cross"):
            km = torch.tensor([[True, True, True, False, False]] * 2)
            got = ka.make_filter(name).mask(4, 5, key_mask=km)[:, 0]
            yield "filter", name, "key mask broadcast", float((got != km[:, None, :]).any()), 0.0
            continue
        params = cases.get(name, {})
        got = ka.make_filter({"name": name, **params}).mask(4, 6)
        yield "filter", name, "entry-wise definition", float((got != R.filter_keep(name, 4, 6, **params)).any()), 0.0

    from kernel_attention.backends import ORDER, BackendError

    x = torch.randn(1, 48, 32, dtype=torch.float64)  # float64: the linear kernel's signed normaliser magnifies
    for name in ORDER:  # each named backend on the first of the calls it runs, or why it runs none here
        why = None
        for kernel, position, filt in _BACKEND_CALLS:
            layer = ka.KernelAttention(32, 2, kernel=kernel, position=position, filter=filt, backend="dense")
            layer = layer.double().eval()
            ref = layer(x)
            layer.backend = name
            try:
                out = layer(x)
            except BackendError as e:
                why = why or str(e).split(": ", 1)[-1].split(". Use backend=")[0]
                continue
            yield "backend", name, f"dense backend, {kernel} + {position} + {filt}", _err(out, ref), TOL64
            break
        else:
            yield "backend", name, f"skipped here: {why}", None, 0.0


def run(args) -> int:
    import kernel_attention as ka
    from kernel_attention.vocabulary import describe_vocabulary

    torch.manual_seed(args.seed)
    start = time.time()
    print(describe_vocabulary())
    print()
    print(f"{'part':<9} {'variant':<34} {'reference':<40} {'max |err|':>10}  ok")
    failures = skipped = 0
    with torch.no_grad():
        results = list(_checks())
    for part, name, ref, err, tol in results:
        if err is None:  # the reason in full, after the columns
            skipped += 1
            print(f"{part:<9} {name:<34} {'-':<40} {'-':>10}  -   {ref}")
            continue
        ok = err <= tol
        failures += not ok
        print(f"{part:<9} {name:<34} {ref:<40} {err:>10.1e}  {'yes' if ok else 'NO'}")
    print(f"\n{'all agree' if not failures else f'{failures} disagree'}"
          f"{f', {skipped} not checked on this machine' if skipped else ''} "
          f"(tolerance {TOL64:g} in float64, {TOL32:g} in float32) in {time.time() - start:.1f} s; "
          f"kernel-attention {ka.__version__}, torch {torch.__version__}")
    return 1 if failures else 0
