r"""The benchmark's report: one :class:`Result` per cell, the markdown table of times, peak memory and
ratios (to SDPA timed alongside, and to ``dense``), and the targets of ``docs/benchmarks.md`` checked
against them (:func:`summary`).  The runner is :mod:`kernel_attention.backends.bench`."""

from __future__ import annotations

import dataclasses
import json

__all__ = ["Result", "table", "summary", "load", "BASELINE"]

#: The baseline of every ratio: PyTorch's own scaled_dot_product_attention with the exponential kernel (the
#: ``sdpa`` backend is ours, on kernel features).
BASELINE = "torch-sdpa"


@dataclasses.dataclass
class Result:
    """One cell: times in ms (minimum over the repeats), peak memory in MB, and the SDPA baseline timed
    in the same process (``sdpa_*``; None for the SDPA cells themselves)."""

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


def _fmt(x, spec=".0f"):
    return "-" if x is None else format(x, spec)


def _ms(x):
    """A time in ms to three significant digits (GPU cells take fractions of a millisecond)."""
    return "-" if x is None else format(x, ".0f" if x >= 100 else ".3g")


def table(results: list[Result]) -> str:
    """Markdown table: times, peak memory and ratios to SDPA (same filter) and to dense."""
    base = {(r.T, r.filter): r for r in results if r.backend == BASELINE}
    dense = {(r.T, r.variant): r for r in results if r.backend == "dense"}
    lines = ["| T | kernel / position / filter | backend | fwd ms | fwd+bwd ms | peak MB | fwd / SDPA | "
             "fwd+bwd / SDPA | fwd+bwd: dense / this | peak: this / dense |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if r.status != "ok":
            lines.append(f"| {r.T} | {r.variant if r.backend != BASELINE else 'SDPA exp / ' + r.filter} | "
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
        name = r.variant if r.backend != BASELINE else f"SDPA exp / {r.filter}"
        lines.append(f"| {r.T} | {name} | {r.backend} | {_ms(r.fwd_ms)} | {_ms(r.fb_ms)} | {_fmt(r.peak_mb)} | "
                     f"{_fmt(fratio, '.2f')} | {_fmt(ratio, '.2f')} | {_fmt(speed, '.1f')} | {_fmt(mem, '.3f')} |")
    return "\n".join(lines)


def _fast(r: Result) -> bool:
    return r.backend not in ("dense", BASELINE)


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
    if len(lines) == 2:  # the targets are about T >= 1024 (ratios) and 4096 (dense, memory)
        return "none measured here: the targets read fast backends at T >= 1024 (against SDPA) and 4096 (against dense)"
    return "\n".join(lines)


def load(paths) -> list[Result]:
    out = []
    for path in paths:
        with open(path) as f:
            out += [Result(**r) for r in json.load(f)]
    return out
