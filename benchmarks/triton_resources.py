"""What the ``triton`` backend's kernels take of a GPU, compiled for it on any machine (no GPU needed).

For each variant and tile size, the launches of one call (forward, backward over keys, backward over queries) are
recorded on CPU tensors and compiled by Triton for the architecture (sm_90 by default: the H100, H200) as a CUDA
launch compiles them (:mod:`kernel_attention.backends.triton_aot`); the table gives each kernel's warps, registers
per thread, bytes per thread spilled to local memory (a spill is a load and a store to memory where a register
would do) and whether its loops are software-pipelined.

    python benchmarks/triton_resources.py --blocks 64 128 --out FILE
"""

from __future__ import annotations

import argparse
import sys

import torch

from kernel_attention.backends.triton_aot import (backend_call, compile_launch, compiled_modules, record_launches,
                                                  resources)

#: (label, kernel, position, filter, value position, training mode)
VARIANTS = [
    ("exp, causal", "exp", "none", "causal", "none", False),
    ("exp, full", "exp", "none", None, "none", False),
    ("exp, shaw (keys), causal", "exp", "shaw", "causal", "none", False),
    ("exp, shaw (keys and values), causal", "exp", "shaw", "causal", "relative", False),
    ("rbf, xl, causal", "rbf", "xl", "causal", "none", False),
    ("exp, strided:stride=128", "exp", "none", "strided:stride=128", "none", False),
    ("ikas, causal (training)", "ikas", "none", "causal", "none", True),
    ("ikan-direct, magnitude dropout 0.1, causal", "ikan-direct:magnitude_dropout=0.1", "none", "causal", "none",
     True),
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, nargs="+", default=[64], help="tile sizes (triton:block=N)")
    ap.add_argument("--d", type=int, default=64, help="head size")
    ap.add_argument("--arch", type=int, default=90, help="CUDA architecture (90: sm_90)")
    ap.add_argument("--out", help="also write the table to this file")
    args = ap.parse_args(argv)
    mods = compiled_modules()
    lines = [f"sm_{args.arch}, D={args.d}, bf16, T=256 (tile counts do not change the code)", "",
             "| variant | block | kernel | warps | registers | spill bytes | pipelined |",
             "|---|---|---|---|---|---|---|"]
    for block in args.blocks:
        for label, kernel, position, filt, value, train in VARIANTS:
            call = backend_call(kernel, position, filt, value, d=args.d, block=block, dtype=torch.bfloat16,
                                train=train)
            for launch in record_launches(call):
                r = resources(compile_launch(launch, mods, args.arch))
                lines.append(f"| {label} | {block} | {launch.kernel} | {launch.kwargs.get('num_warps', 4)} | "
                             f"{r['registers']} | {r['spill_bytes']} | {'yes' if r['pipelined'] else 'no'} |")
                print(lines[-1], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("Command: `python benchmarks/triton_resources.py " + " ".join(sys.argv[1:]) + "`\n\n")
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
