"""``kernel-attention translate CHECKPOINT --input FILE|-``: translate one tokenised sentence per line.

For a ``translation`` run the lines are source sentences (BPE is applied, then removed from the output);
for a ``synthetic`` run they are whitespace-separated symbol ids (>= 3).  Output: one line per input on
stdout (an empty line for an empty one).  Decoding options come from the stored ``eval`` section; override
with ``--beam``.  The BPE and vocabularies come from the run directory, so the training data is not needed.
``--detokenize`` writes plain text: Moses escapes such as ``&apos;`` undone, punctuation and clitics attached
(:func:`kernel_attention.data.bpe.detokenize`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kernel_attention.cli.counts import at_least


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("translate", help="translate the lines of --input FILE (- for stdin) with a trained model",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint")
    p.add_argument("overrides", nargs="*", help="section.key=value changes to the stored config (run.imports=...)")
    p.add_argument("--input", required=True, help="file with one sentence per line, or - for stdin")
    p.add_argument("--beam", type=at_least(1, "beam width"), default=None)
    p.add_argument("--detokenize", action="store_true",
                   help="translation: write plain text (undo Moses escapes such as &apos; and tokenisation)")
    p.add_argument("--device", default="cpu")
    return p


def target_language(data) -> str | None:
    """The ``tgt`` code of a run's dataset spec (``parallel:path=..,src=en,tgt=fr`` -> ``fr``), if it names one."""
    from kernel_attention.registry import SpecError, parse_spec
    spec = (data or {}).get("dataset")
    if not isinstance(spec, (str, dict)):
        return None
    try:
        name, params = parse_spec(spec)
    except SpecError:
        return None
    return params.get("tgt", "en" if name in ("multi30k", "iwslt14") else None)


def run(args) -> int:
    import torch

    from kernel_attention.cli.evaluate import load
    from kernel_attention.tasks.synthetic import EOS, FIRST, PAD, SyntheticSeq2SeqTask
    from kernel_attention.tasks.translation import TranslationTask

    from kernel_attention.data.files import DataFormatError, read_lines, split_lines

    args.overrides = list(args.overrides or []) + ([f"eval.beam={args.beam}"] if args.beam is not None else [])
    if args.input != "-" and Path(args.input).is_dir():
        print(f"kernel-attention: --input {args.input} is a folder: give a file with one sentence per line, or - "
              f"for stdin", file=sys.stderr)
        return 2
    try:
        lines = (split_lines(sys.stdin.buffer.read(), "<stdin>") if args.input == "-"
                 else read_lines(args.input)[1])
    except (OSError, DataFormatError) as e:
        print(f"kernel-attention: cannot read --input {args.input}: {e}", file=sys.stderr)
        return 2
    loaded = load(args)
    if loaded is None:
        return 2
    task, model, _ = loaded
    if isinstance(task, TranslationTask):
        from kernel_attention.data.bpe import detokenize
        lang = target_language(task.data)
        for out in task.translate_lines(model, lines):
            print(detokenize(out, lang) if args.detokenize else out)
    elif isinstance(task, SyntheticSeq2SeqTask):
        for line in lines:
            try:
                ids = [int(t) for t in line.split()]
            except ValueError:
                print(f"kernel-attention: synthetic input lines hold integer symbol ids, got {line!r}", file=sys.stderr)
                return 2
            bad = [t for t in ids if not FIRST <= t < task.n_tokens]
            if bad or not ids:
                print(f"kernel-attention: symbol ids must be in [{FIRST}, {task.n_tokens - 1}], got {line!r}",
                      file=sys.stderr)
                return 2
            src = torch.tensor([ids + [EOS]])
            with torch.no_grad():
                hyp = task.decode(model, src, len(ids) + 1 + int(task.eval_opts["max_extra"]))[0].tolist()
            print(" ".join(str(t) for t in hyp if t not in (EOS, PAD)))
    else:
        print(f"kernel-attention: translate needs a translation or synthetic run, not {type(task).__name__}",
              file=sys.stderr)
        return 2
    return 0
