r"""Benchmark of the attention backends: forward, forward+backward and peak memory of each
kernel x position x filter on each backend, against PyTorch's ``scaled_dot_product_attention`` with
the exponential kernel on the same shapes, in one run.

    python benchmarks/attention.py --T 256 1024 4096 --out docs/benchmarks.md
    kernel-attention bench --T 1024 --kernels exp rbf --positions none shaw --filters full causal

On CPU each cell (:mod:`.bench_cell`) runs in a fresh subprocess (``python -m kernel_attention.backends.bench
--cell JSON``) so that its peak memory is the growth of the process's maximum resident set (``ru_maxrss``) during one
forward+backward pass, measured before the timed repeats.  On CUDA the cells share one process: the
peak is the allocator's ``max_memory_allocated`` above the inputs, reset per cell.  Times are the
minimum over ``--repeats`` runs after one warm-up.  Ratios are to SDPA with the exponential kernel
timed *in the same process, interleaved with the cell* (so that a change of load on a shared machine
hits both alike): plain SDPA for the full filter, ``is_causal`` SDPA for causal filters, SDPA with the
bool mask for other filters.  The SDPA rows of the table are separate cells, for reference.

``--dropout P`` times training-shaped calls: dropout P on the weights for every backend and for the SDPA
baseline alike (which on the CPU takes SDPA's math path: its flash kernel has no dropout).  The kernels
run in training mode in any case, so a kernel with magnitude dropout (``ikan:official=true``) draws it.

``--padding F`` gives every other sequence of the batch its last F·T keys as padding (a key mask, as a batch of
sentences has): every backend gets it as ``key_mask``, the SDPA baseline as the bool mask of the filter and
the padding together.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import platform
import subprocess
import sys
import time

from kernel_attention.backends.bench_cell import FILTER_SPECS, run_cell
from kernel_attention.backends.bench_report import BASELINE, Result, summary, table
from kernel_attention.cli.counts import at_least
from kernel_attention.cli.threads import threads_per_op

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
DIRECT = ("poly", "linear")


def _backends_for(kernel: str, dense: bool = True) -> list[str]:
    out = ["dense"] if dense else []
    if kernel in DIRECT or kernel.startswith("poly"):
        out.append("linear")
    else:
        out.append("auto")
        if kernel == "rbf":
            out.append("sdpa:key_bias=mask")
    return out


# ---- the parent: grid, subprocesses, table ----------------------------------------------------------

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


def _run_in_process(cell: dict, r: Result) -> Result:
    """A CUDA cell: its peak memory is the allocator's own counter (reset per cell), so it needs no
    process of its own, and one process keeps the kernels FlexAttention compiled for earlier cells."""
    import gc

    import torch

    try:
        out = run_cell(cell)
    except torch.cuda.OutOfMemoryError:
        r.status = "out of GPU memory"
        return r
    except Exception as e:  # a failing cell is reported in the table; the other cells still run
        r.status = f"error: {type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}"
        return r
    finally:
        gc.collect()
        torch.cuda.empty_cache()
    return _filled(r, out)


def _filled(r: Result, out: dict) -> Result:
    """``r`` with the times and peak memory of :func:`run_cell`'s output."""
    r.fwd_ms, r.fb_ms, r.peak_mb = out["fwd_ms"], out["fb_ms"], out["peak_mb"]
    r.sdpa_fwd_ms, r.sdpa_fb_ms = out.get("sdpa_fwd_ms"), out.get("sdpa_fb_ms")
    return r


def _run_child(cell: dict, timeout: float) -> Result:
    r = Result(cell["T"], cell["kernel"], cell["position"], cell["filter"], cell["backend"])
    if cell["device"] == "cuda":
        return _run_in_process(cell, r)
    if cell["backend"] == "dense" and _dense_estimate_mb(cell) > 0.8 * _mem_available_mb():
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
    return _filled(r, json.loads(p.stdout.strip().splitlines()[-1]))


def machine(threads: int | None = None) -> str:
    """The machine in one line; ``threads``: the torch threads each cell ran with."""
    import torch

    from kernel_attention.machine import cpu
    from kernel_attention.malloc import describe

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    return (f"{platform.system()} {platform.machine()}, CPU {cpu()}, {os.cpu_count()} cores, torch "
            f"{torch.__version__}, {threads or torch.get_num_threads()} torch thread(s) per cell, GPU: {gpu}, "
            f"malloc: {describe()}")


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--T", type=at_least(1, "sequence length"), nargs="+", default=[256, 1024, 4096],
                   help="sequence lengths")
    p.add_argument("--B", type=at_least(1, "batch size"), default=4)
    p.add_argument("--H", type=at_least(1, "heads"), default=8)
    p.add_argument("--D", type=at_least(1, "head size"), default=64)
    p.add_argument("--kv-heads", type=int, default=None,
                   help="key/value heads, a divisor of H (grouped-query attention, ours and SDPA's; default H)")
    p.add_argument("--kernels", nargs="+", help="kernel specs; with --positions/--filters: their full product "
                   "(default: the target variants of docs/benchmarks.md)")
    p.add_argument("--positions", nargs="+", help="positional schemes (default none)")
    p.add_argument("--filters", nargs="+", help="filters: full, causal, local (window 128) or any filter spec")
    p.add_argument("--backends", nargs="+", help="backends to time (default: dense and the fast ones that apply)")
    p.add_argument("--no-dense-above", type=at_least(1, "a sequence length"), default=None,
                   help="skip dense for T above this")
    p.add_argument("--dropout", type=float, default=0.0,
                   help="dropout on the weights, for every backend and the SDPA baseline (default 0)")
    p.add_argument("--padding", type=float, default=0.0,
                   help="every other sequence's last fraction of keys as padding, a key mask (default 0: none)")
    p.add_argument("--repeats", type=at_least(1, "timed runs per cell"), default=3)
    p.add_argument("--threads", type=threads_per_op, default=None, help="torch threads (default: all cores)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--dtype", default=None, help="float32 (CPU default) or bfloat16 (CUDA default)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per CPU cell (CUDA cells run in-process)")
    p.add_argument("--no-checks", action="store_true",
                   help="time without the input checks (their NaN test costs one device sync per call on GPU)")
    p.add_argument("--out", help="also write the table (markdown, with the command and machine) here")
    return p


def _bad_names(args) -> str | None:
    """What of the kernels, positions, filters, backends, device and dtype asked for does not exist, or None: checked
    before any cell runs, so that a misspelt name is one error, not one per cell of the table."""
    import torch

    from kernel_attention.backends.dispatch import AUTO, resolve_backend
    from kernel_attention.filters import make_filter
    from kernel_attention.kernels import KERNELS
    from kernel_attention.positions import POSITIONS

    checks = [("--kernels", args.kernels, KERNELS.validate, ""),
              ("--positions", args.positions, POSITIONS.validate, ""),
              ("--filters", [f for f in args.filters or [] if f not in FILTER_SPECS], make_filter, ""),
              ("--backends", [b for b in args.backends or [] if b != AUTO], resolve_backend, f"; or {AUTO!r}"),
              ("--device", [args.device], torch.device, "")]
    for option, specs, check, more in checks:
        for spec in specs or []:
            try:
                check(spec)
            except (ValueError, RuntimeError) as e:
                return f"{option} {spec}: {str(e).splitlines()[0]}{more}"
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        return f"--device {args.device}: this machine's torch has no CUDA device (torch {torch.__version__})"
    if args.dtype is not None and not isinstance(getattr(torch, args.dtype, None), torch.dtype):
        return f"--dtype {args.dtype!r} is not a torch dtype; accepted: float32, bfloat16, float16, float64"
    if args.dtype is not None and not getattr(torch, args.dtype).is_floating_point:
        return f"--dtype {args.dtype!r} is not a floating-point dtype; accepted: float32, bfloat16, float16, float64"
    return None


def run(args) -> int:
    bad = _bad_names(args)
    if bad is not None:
        print(f"kernel-attention bench: {bad}", file=sys.stderr)
        return 2
    if args.kv_heads is not None and not (args.kv_heads >= 1 and args.H % args.kv_heads == 0):
        print(f"kernel-attention bench: --kv-heads must be a divisor of --H={args.H} (key/value heads shared by "
              f"H / kv-heads query heads each), got {args.kv_heads}", file=sys.stderr)
        return 2
    if not 0.0 <= args.padding < 1.0:
        print(f"kernel-attention bench: --padding must be a fraction in [0, 1) of each padded sequence's keys, "
              f"got {args.padding}", file=sys.stderr)
        return 2
    if not 0.0 <= args.dropout < 1.0:
        print(f"kernel-attention bench: --dropout must be a rate in [0, 1), got {args.dropout}", file=sys.stderr)
        return 2
    if not args.timeout > 0:
        print(f"kernel-attention bench: --timeout must be > 0 seconds, got {args.timeout}", file=sys.stderr)
        return 2
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
        common = dict(T=t, B=args.B, H=args.H, D=args.D, kv_heads=args.kv_heads, threads=threads,
                      device=args.device, dtype=dtype,
                      checks=not args.no_checks, dropout=args.dropout, padding=args.padding,
                      repeats=args.repeats if t < 4096 else max(1, args.repeats - 1))
        for filt in dict.fromkeys(f for _, _, f in variants):
            cell = dict(common, kernel="exp", position="none", filter=filt, backend=BASELINE)
            results.append(_run_child(cell, args.timeout))
            _progress(results[-1], started)
            _write(args, results, threads, dtype, started)
        for kernel, position, filt in variants:
            backends = args.backends or _backends_for(kernel)
            for backend in backends:
                if backend == "dense" and args.no_dense_above is not None and t > args.no_dense_above:
                    results.append(Result(t, kernel, position, filt, backend, status="skipped (--no-dense-above)"))
                    continue
                cell = dict(common, kernel=kernel, position=position, filter=filt, backend=backend)
                results.append(_run_child(cell, args.timeout))
                _progress(results[-1], started)
                _write(args, results, threads, dtype, started)
    text = _write(args, results, threads, dtype, started)
    print(text)
    return 0


def _write(args, results: list[Result], threads: int, dtype: str, started: float) -> str:
    """The table and the targets; with ``--out`` also written there (markdown, and the rows as JSON).
    Called after every cell, so that a run cut short keeps what it measured."""
    text = table(results) + "\n\nTargets:\n\n" + summary(results)
    if args.out:
        cmd = " ".join([os.path.basename(sys.argv[0])] + sys.argv[1:])
        with open(args.out, "w") as f:
            f.write(f"Command: `{cmd}`\n\nMachine: {machine(threads)}\n\nDate: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
                    f"wall time {time.time() - started:.0f} s, dtype {dtype}, B={args.B}, H={args.H}, D={args.D}, "
                    f"{'' if args.kv_heads in (None, args.H) else f'{args.kv_heads} key/value heads, '}"
                    f"dropout {args.dropout:g}{f', padding {args.padding:g}' if args.padding else ''}\n\n")
            f.write(text + "\n")
        with open(args.out + ".json", "w") as f:
            json.dump([dataclasses.asdict(r) for r in results], f, indent=1)
    return text


def _progress(r: Result, started: float) -> None:
    print(f"[{time.time() - started:6.0f}s] T={r.T} {r.variant} {r.backend}: "
          f"{r.status if r.status != 'ok' else f'fwd {r.fwd_ms:.0f} ms, fwd+bwd {r.fb_ms:.0f} ms, peak {r.peak_mb:.0f} MB'}",
          file=sys.stderr, flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cell", help=argparse.SUPPRESS)
    add_arguments(p)
    args = p.parse_args(argv)
    if args.cell:  # a child: glibc read its malloc settings from the environment the parent gave it
        print(json.dumps(run_cell(json.loads(args.cell))))
        return 0
    from kernel_attention.malloc import configure

    configure()  # as the command line does (kernel_attention.malloc)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
