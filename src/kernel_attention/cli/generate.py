"""``kernel-attention generate CHECKPOINT --prompt "the cat" [--max-new 20] [--temperature 0]``: continue a
prompt with a trained language model (greedy at temperature 0, else sampling with ``--seed``); a generated line
end ``<eos>`` starts a new line."""

from __future__ import annotations

import argparse
import sys

from kernel_attention.cli.counts import at_least


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("generate", help="continue a prompt with a trained language model",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint")
    p.add_argument("overrides", nargs="*", help="section.key=value changes to the stored config (run.imports=...)")
    p.add_argument("--prompt", required=True, help="whitespace-tokenised words")
    p.add_argument("--max-new", type=at_least(1, "words to add"), default=20)
    p.add_argument("--temperature", type=at_least(0, "0: greedy", float), default=0.0, help="0: greedy; > 0: sampling")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    return p


def run(args) -> int:
    from kernel_attention.cli.evaluate import load
    from kernel_attention.tasks.language_modeling import LanguageModelingTask

    loaded = load(args)
    if loaded is None:
        return 2
    task, model, _ = loaded
    if not isinstance(task, LanguageModelingTask):
        print(f"kernel-attention: generate needs a language-model run, not {type(task).__name__}", file=sys.stderr)
        return 2
    words = args.prompt.split()
    if any("\udc80" <= c <= "\udcff" for c in args.prompt):  # bytes the locale could not decode
        print("kernel-attention: --prompt is not valid UTF-8", file=sys.stderr)
        return 2
    if not words:
        print("kernel-attention: --prompt is empty", file=sys.stderr)
        return 2
    unknown = [w for w in dict.fromkeys(words) if w not in task.vocab]
    if unknown:
        print(f"kernel-attention: warning: not in the vocabulary, read as <unk>: {' '.join(unknown)}", file=sys.stderr)
    out = task.generate(model, words, args.max_new, args.temperature, args.seed)
    print(as_text(words + out))
    return 0


def as_text(tokens: list[str]) -> str:
    """The tokens joined by spaces, each ``<eos>`` (the corpus's line end) printed as a line break."""
    from kernel_attention.data.wikitext import EOS

    lines: list[list[str]] = [[]]
    for token in tokens:
        if token == EOS:
            lines.append([])
        else:
            lines[-1].append(token)
    return "\n".join(" ".join(line) for line in lines)
