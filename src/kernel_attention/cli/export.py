"""``kernel-attention export RUN [--out FILE]``: write a run's weights as ``RUN/model.safetensors``.

RUN is a run directory (its ``best.pt``, else ``last.pt``) or a checkpoint written by ``train``.  ``train``
writes the file itself when a run finishes; this command makes it for a run written before, or from
another checkpoint.  The safetensors metadata holds the run's config and vocabulary file names, so
``kernel_attention.load(RUN)`` (or the file's path) rebuilds the model from it, without pickle.
"""

from __future__ import annotations

import argparse
import sys


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("export", help="write a run's weights as RUN/model.safetensors",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", metavar="RUN")
    p.add_argument("--out", metavar="FILE", help="where to write (default: model.safetensors in the run directory)")
    return p


def run(args) -> int:
    from kernel_attention.load import export
    try:
        out = export(args.checkpoint, args.out)
    except (ValueError, FileNotFoundError, KeyError, OSError) as e:
        print(f"kernel-attention: cannot export {args.checkpoint}: {e}", file=sys.stderr)
        return 2
    print(out)
    return 0
