r"""Benchmark of the attention backends: forward, forward+backward and peak memory of each
kernel x position x filter on each backend, against PyTorch's ``scaled_dot_product_attention`` with
the exponential kernel on the same shapes, in one run.

    python benchmarks/attention.py --T 256 1024 4096 --out docs/benchmarks.md
    kernel-attention bench --T 1024 --kernels exp rbf --positions none shaw --filters full causal

Each cell runs in a fresh subprocess (``python -m kernel_attention.backends.bench --cell JSON``) so that
its peak memory is the growth of the process's maximum resident set (``ru_maxrss``) during one
forward+backward pass, measured before the timed repeats.  Times are the minimum over ``--repeats``
runs after one warm-up.  Ratios are to SDPA with the exponential kernel timed *in the same process,
interleaved with the cell* (so that a change of load on a shared machine hits both alike): plain SDPA
for the full filter, ``is_causal`` SDPA for causal filters, SDPA with the bool mask for other filters.
The SDPA rows of the table are separate cells, for reference.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import platform
import resource
import subprocess
import sys
import time

__all__ = ["main", "add_arguments", "run", "DEFAULT_VARIANTS"]

#: The default grid: the variants the targets of docs/benchmarks.md name (kernel, position, filter).
DEFAULT_VARIANTS = [
    ("exp", "none", "full"), ("exp", "none", "causal"), ("exp", "none", "local"),
    ("rbf", "none", "full"), ("rbf", "none", "causal"),
    ("periodic", "none", "full"), ("periodic", "none", "causal"),
    ("exp", "product", "full"), ("rbf", "product", "full"),
    ("exp", "shaw", "full"), ("exp", "shaw", "causal"),
    ("exp", "xl", "full"), ("exp", "xl", "causal"),
    ("ikas", "none", "full"), ("rbf-only", "none", "causal"),
    ("poly", "none", "full"), ("poly", "none", "causal"),
    ("linear", "none", "full"), ("linear", "none", "causal"),
]
FILTER_SPECS = {"full": None, "causal": "causal", "local": "local:window=128"}
DIRECT = ("poly", "linear")


def _backends_for(kernel: str, dense: bool = True) -> list[str]:
    out = ["dense"] if dense else []
    if kernel in DIRECT or kernel.startswith("poly"):
        out.append("linear")
    else:
        out.append("fused")
        if kernel == "rbf":
            out.append("fused:key_bias=mask")
    return out


# ---- one cell, in a child process -----------------------------------------------------------------

def _maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def run_cell(cell: dict) -> dict:
    import torch
    import torch.nn.functional as F

    from kernel_attention.functional import attention
    from kernel_attention.kernels import make_kernel
    from kernel_attention.positions import default_positions, make_position

    torch.set_num_threads(cell["threads"])
    dev = torch.device(cell["device"])
    dtype = getattr(torch, cell["dtype"])
    b, h, t, d = cell["B"], cell["H"], cell["T"], cell["D"]
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, h, t, d, device=dev, dtype=dtype).requires_grad_() for _ in range(3))
    gout = torch.randn(b, h, t, d, device=dev, dtype=dtype)
    filt = FILTER_SPECS.get(cell["filter"], cell["filter"])
    backend = cell["backend"]
    mask, causal = None, False
    if filt == "causal":
        causal = True
    elif filt is not None:
        from kernel_attention.filters import make_filter
        mask = make_filter(filt).mask(t, t, dev)

    def sdpa():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    if backend == "sdpa":
        fn = sdpa
        params = []
    else:
        kern = make_kernel(cell["kernel"], n_heads=h, d_head=d).to(dev, dtype).eval()
        pos = make_position(cell["position"], d_model=h * d, n_heads=h, d_head=d).to(dev, dtype)
        pq, pk = default_positions(t, t, dev, True)
        params = list(pos.parameters()) + list(kern.parameters())

        def fn():
            return attention(q, k, v, kern, filt, terms=pos.terms(q, k, pq, pk), backend=backend)

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
    paired = backend != "sdpa"
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


# ---- the parent: grid, subprocesses, table ----------------------------------------------------------

@dataclasses.dataclass
class Result:
    T: int
    kernel: str
    position: str
    filter: str
    backend: str
    fwd_ms: float | None = None
    fb_ms: float | None = None
    peak_mb: float | None = None
    status: str = "ok"
    sdpa_fwd_ms: float | None = None
    sdpa_fb_ms: float | None = None

    @property
    def variant(self) -> str:
        return f"{self.kernel} / {self.position} / {self.filter}"


def _mem_available_mb() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("inf")


def _dense_estimate_mb(cell: dict) -> float:
    """Rough peak of the dense backend's forward+backward: a handful of (B, H, T, T) tensors (more for
    kernels that form several, such as the implicit ones)."""
    per = cell["B"] * cell["H"] * cell["T"] ** 2 * 4 / 2 ** 20
    return per * (9 if cell["kernel"].startswith("ik") else 5)


def _run_child(cell: dict, timeout: float) -> Result:
    r = Result(cell["T"], cell["kernel"], cell["position"], cell["filter"], cell["backend"])
    if cell["backend"] == "dense" and cell["device"] == "cpu" and _dense_estimate_mb(cell) > 0.8 * _mem_available_mb():
        r.status = "skipped (memory)"
        return r
    cmd = [sys.executable, "-m", "kernel_attention.backends.bench", "--cell", json.dumps(cell)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        r.status = f"timeout (> {timeout:.0f} s)"
        return r
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["?"])[-1]
        r.status = "killed (memory)" if p.returncode in (-9, 137) else f"error: {last[:120]}"
        return r
    out = json.loads(p.stdout.strip().splitlines()[-1])
    r.fwd_ms, r.fb_ms, r.peak_mb = out["fwd_ms"], out["fb_ms"], out["peak_mb"]
    r.sdpa_fwd_ms, r.sdpa_fb_ms = out.get("sdpa_fwd_ms"), out.get("sdpa_fb_ms")
    return r


def _baseline_key(filt: str) -> str:
    return {"full": "full", "causal": "causal"}.get(filt, filt)


def _fmt(x, spec=".0f"):
    return "-" if x is None else format(x, spec)


def table(results: list[Result]) -> str:
    """Markdown table: times, peak memory and ratios to SDPA (same filter) and to dense."""
    base = {(r.T, r.filter): r for r in results if r.backend == "sdpa"}
    dense = {(r.T, r.variant): r for r in results if r.backend == "dense"}
    lines = ["| T | kernel / position / filter | backend | fwd ms | fwd+bwd ms | peak MB | fwd / SDPA | "
             "fwd+bwd / SDPA | fwd+bwd: dense / this | peak: this / dense |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if r.status != "ok":
            lines.append(f"| {r.T} | {r.variant if r.backend != 'sdpa' else 'SDPA exp / ' + r.filter} | "
                         f"{r.backend} | {r.status} | | | | | | |")
            continue
        s = base.get((r.T, r.filter))
        if r.sdpa_fb_ms:  # measured alongside, in the same process
            ratio, fratio = r.fb_ms / r.sdpa_fb_ms, r.fwd_ms / r.sdpa_fwd_ms
        elif s is not None and s.status == "ok":
            ratio, fratio = r.fb_ms / s.fb_ms, r.fwd_ms / s.fwd_ms
        else:
            ratio = fratio = None
        dn = dense.get((r.T, r.variant))
        ok = dn is not None and dn.status == "ok" and r.backend != "dense"
        speed = dn.fb_ms / r.fb_ms if ok else None
        mem = (max(r.peak_mb, 0.0) / max(dn.peak_mb, 1e-9)) if ok else None
        name = r.variant if r.backend != "sdpa" else f"SDPA exp / {r.filter}"
        lines.append(f"| {r.T} | {name} | {r.backend} | {_fmt(r.fwd_ms)} | {_fmt(r.fb_ms)} | {_fmt(r.peak_mb)} | "
                     f"{_fmt(fratio, '.2f')} | {_fmt(ratio, '.2f')} | {_fmt(speed, '.1f')} | {_fmt(mem, '.3f')} |")
    return "\n".join(lines)


def _fast(r: Result) -> bool:
    return r.backend not in ("dense", "sdpa")


def summary(results: list[Result]) -> str:
    """The targets of docs/benchmarks.md, checked against the results (markdown)."""
    ok = [r for r in results if r.status == "ok"]
    dense = {(r.T, r.variant): r for r in ok if r.backend == "dense"}
    lines = ["| target | variant | backend | T | measured | met |", "|---|---|---|---|---|---|"]

    def row(target, r, value, good, fmt=".2f"):
        lines.append(f"| {target} | {r.variant} | {r.backend} | {r.T} | {format(value, fmt)} | "
                     f"{'yes' if good else '**no**'} |")

    for r in ok:
        if not _fast(r) or r.T < 1024 or not r.sdpa_fb_ms:
            continue
        ratio = r.fb_ms / r.sdpa_fb_ms
        if r.position == "none" and r.kernel in ("exp", "rbf") or r.position == "product":
            row("fwd+bwd / SDPA <= 1.3", r, ratio, ratio <= 1.3)
        elif r.position in ("shaw", "xl"):
            row("fwd+bwd / SDPA <= 1.8", r, ratio, ratio <= 1.8)
        if r.backend == "linear" and r.filter == "causal" and r.T >= 4096:
            row("causal linear: fwd+bwd / SDPA-causal <= 2", r, ratio, ratio <= 2.0)
    for r in ok:
        d = dense.get((r.T, r.variant))
        if not _fast(r) or r.T < 4096 or d is None or r.backend == "linear":
            continue
        row("dense / this >= 2 (fwd+bwd time)", r, d.fb_ms / r.fb_ms, d.fb_ms / r.fb_ms >= 2.0, ".1f")
        frac = max(r.peak_mb, 0.0) / max(d.peak_mb, 1e-9)
        row("peak this / dense <= 0.25", r, frac, frac <= 0.25, ".3f")
    for r in ok:
        if _fast(r) and r.T >= 4096 and (r.T, r.variant) not in dense:
            st = next((x.status for x in results if x.backend == "dense" and x.T == r.T and x.variant == r.variant), "not run")
            lines.append(f"| dense comparison | {r.variant} | {r.backend} | {r.T} | dense {st} | - |")
    # crossover of the linear backend with dense
    for variant in dict.fromkeys(r.variant for r in ok if r.backend == "linear"):
        ts = sorted({r.T for r in ok if r.variant == variant})
        wins = []
        for t in ts:
            lin = next((r for r in ok if r.variant == variant and r.T == t and r.backend == "linear"), None)
            d = dense.get((t, variant))
            if lin is not None and d is not None:
                wins.append((t, lin.fb_ms < d.fb_ms, d.fb_ms / lin.fb_ms))
        if wins:
            first = next((t for t, w, _ in wins if w and all(w2 for t2, w2, _ in wins if t2 >= t)), None)
            detail = ", ".join(f"T={t}: dense/linear {x:.2f}" for t, _, x in wins)
            lines.append(f"| linear beats dense from a crossover | {variant} | linear | - | "
                         f"{'from T=' + str(first) if first else 'not in the measured range'} ({detail}) | "
                         f"{'yes' if first else '**no**'} |")
    return "\n".join(lines)


def load(paths) -> list[Result]:
    out = []
    for path in paths:
        with open(path) as f:
            out += [Result(**r) for r in json.load(f)]
    return out


def machine(threads: int | None = None) -> str:
    """The machine in one line; ``threads``: the torch threads each cell ran with."""
    import torch

    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    return (f"{platform.system()} {platform.machine()}, CPU {cpu}, {os.cpu_count()} cores, torch "
            f"{torch.__version__}, {threads or torch.get_num_threads()} torch thread(s) per cell, GPU: {gpu}")


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--T", type=int, nargs="+", default=[256, 1024, 4096], help="sequence lengths")
    p.add_argument("--B", type=int, default=4)
    p.add_argument("--H", type=int, default=8)
    p.add_argument("--D", type=int, default=64)
    p.add_argument("--kernels", nargs="+", help="kernel specs; with --positions/--filters: their full product "
                   "(default: the target variants of docs/benchmarks.md)")
    p.add_argument("--positions", nargs="+", help="positional schemes (default none)")
    p.add_argument("--filters", nargs="+", help="filters: full, causal, local (window 128) or any filter spec")
    p.add_argument("--backends", nargs="+", help="backends to time (default: dense and the fast ones that apply)")
    p.add_argument("--no-dense-above", type=int, default=None, help="skip dense for T above this")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--dtype", default=None, help="float32 (CPU default) or bfloat16 (CUDA default)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per cell")
    p.add_argument("--out", help="also write the table (markdown, with the command and machine) here")
    return p


def run(args) -> int:
    if args.kernels or args.positions or args.filters:
        variants = list(itertools.product(args.kernels or ["exp"], args.positions or ["none"],
                                          args.filters or ["full"]))
    else:
        variants = DEFAULT_VARIANTS
    dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    threads = args.threads or os.cpu_count() or 1
    results: list[Result] = []
    started = time.time()
    for t in args.T:
        common = dict(T=t, B=args.B, H=args.H, D=args.D, threads=threads, device=args.device, dtype=dtype,
                      repeats=args.repeats if t < 4096 else max(1, args.repeats - 1))
        for filt in dict.fromkeys(f for _, _, f in variants):
            cell = dict(common, kernel="exp", position="none", filter=filt, backend="sdpa")
            results.append(_run_child(cell, args.timeout))
            _progress(results[-1], started)
        for kernel, position, filt in variants:
            backends = args.backends or _backends_for(kernel)
            for backend in backends:
                if backend == "dense" and args.no_dense_above is not None and t > args.no_dense_above:
                    results.append(Result(t, kernel, position, filt, backend, status="skipped (--no-dense-above)"))
                    continue
                cell = dict(common, kernel=kernel, position=position, filter=filt, backend=backend)
                results.append(_run_child(cell, args.timeout))
                _progress(results[-1], started)
    text = table(results) + "\n\nTargets:\n\n" + summary(results)
    print(text)
    if args.out:
        cmd = " ".join([os.path.basename(sys.argv[0])] + sys.argv[1:])
        with open(args.out, "w") as f:
            f.write(f"Command: `{cmd}`\n\nMachine: {machine(threads)}\n\nDate: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
                    f"wall time {time.time() - started:.0f} s, dtype {dtype}, B={args.B}, H={args.H}, D={args.D}\n\n")
            f.write(text + "\n")
        with open(args.out + ".json", "w") as f:
            json.dump([dataclasses.asdict(r) for r in results], f, indent=1)
    return 0


def _progress(r: Result, started: float) -> None:
    print(f"[{time.time() - started:6.0f}s] T={r.T} {r.variant} {r.backend}: "
          f"{r.status if r.status != 'ok' else f'fwd {r.fwd_ms:.0f} ms, fwd+bwd {r.fb_ms:.0f} ms, peak {r.peak_mb:.0f} MB'}",
          file=sys.stderr, flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cell", help=argparse.SUPPRESS)
    add_arguments(p)
    args = p.parse_args(argv)
    if args.cell:
        print(json.dumps(run_cell(json.loads(args.cell))))
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
