"""Training throughput (tokens/s) of a small LM with kernel attention (exp kernel) vs the same model built
from torch.nn.TransformerEncoderLayer, in one run; or, with ``--backends``, of our model on each attention
backend named (``--position``: its positions, e.g. Transformer-XL's ``xl``), the last named the reference.

    python benchmarks/lm_throughput.py [--d-model 128 --layers 2 --seq 128 --batch 16 --steps 5 --repeats 12]
    python benchmarks/lm_throughput.py --device cuda --bf16 --position xl --backends triton dense --seq 2048

Both models: token embedding scaled by sqrt(d) + sinusoidal positions at the input, L post-LN blocks
(d, H heads, FFN d_ff, ReLU, dropout 0), causal mask, output tied to the embedding, Adam.  Ours is
``LanguageModel(attention={"kernel": "exp", "position": "none", "bias": True}, pe_at_input=True, mem_len=0)``
(projection biases on, as nn.MultiheadAttention, so both have the same parameters); the
reference uses ``nn.TransformerEncoderLayer(batch_first=True)`` with a float causal mask.  Steps of the two
models are interleaved (repeats x steps each, after warm-up, in ABBA order) and the median tokens/s is
reported; the ratio is the median over back-to-back pairs, so a machine-load change hits both alike.
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import time

import torch
from torch import nn

from kernel_attention.positions.encodings import sinusoid
from kernel_attention.models import LanguageModel


class TorchLM(nn.Module):
    """The reference: the same LM from torch.nn.TransformerEncoderLayer."""

    def __init__(self, vocab, d_model, n_heads, d_ff, n_layers):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        # Same initialisation as ours (fairseq's N(0, d^-1/2)); PyTorch's default N(0, 1) times sqrt(d) gives
        # huge tied logits whose softmax gradients are denormal floats, which makes CPU matmuls ~10x slower.
        nn.init.normal_(self.embed.weight, std=d_model ** -0.5)
        layer = nn.TransformerEncoderLayer(d_model, n_heads, d_ff, dropout=0.0, batch_first=True)
        self.layers = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.scale = math.sqrt(d_model)

    def forward(self, tokens):
        t = tokens.shape[1]
        x = self.embed(tokens) * self.scale + sinusoid(torch.arange(t, device=tokens.device), self.embed.embedding_dim)
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=tokens.device)
        h = self.layers(x, mask=mask, is_causal=True)
        return h @ self.embed.weight.t()


def make_step(model, vocab, amp):
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)

    def step(x, y):
        with amp:
            out = model(x)
            logits = out[0] if isinstance(out, tuple) else out
            loss = nn.functional.cross_entropy(logits.reshape(-1, vocab).float(), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return step


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", type=int, default=2000)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--d-ff", type=int, default=512)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--repeats", type=int, default=12)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--position", default="none", help="our model's positions (with --backends)")
    p.add_argument("--backends", nargs="+", help="our model on these backends, the last the reference")
    p.add_argument("--bf16", action="store_true", help="autocast to bfloat16 (training's precision bf16)")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    dev = torch.device(a.device)

    def ours(position="none", backend="auto"):
        torch.manual_seed(0)  # the same weights on every backend
        return LanguageModel(a.vocab, d_model=a.d_model, n_heads=a.heads, d_ff=a.d_ff, n_layers=a.layers,
                             dropout=0.0, attention={"kernel": "exp", "position": position, "bias": True,
                                                     "backend": backend},
                             pe_at_input=position == "none", mem_len=0).to(dev)

    if a.backends:
        models = {name: ours(a.position, name) for name in a.backends}
    else:
        models = {"ours": ours(), "torch": TorchLM(a.vocab, a.d_model, a.heads, a.d_ff, a.layers).to(dev)}
    params = ", ".join(f"{k} {sum(p.numel() for p in m.parameters())}" for k, m in models.items())
    amp = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.bf16)
    steps = {k: make_step(m, a.vocab, amp) for k, m in models.items()}
    x = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev)
    y = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    ref = list(steps)[-1]
    for fn in steps.values():  # warm-up
        for _ in range(3):
            fn(x, y)
    rates = {k: [] for k in steps}
    for r in range(a.repeats):
        order = list(steps.items()) if r % 2 == 0 else list(steps.items())[::-1]  # ABBA: no order bias
        for name, fn in order:
            sync()
            t0 = time.perf_counter()
            for _ in range(a.steps):
                fn(x, y)
            sync()
            rates[name].append(a.steps * a.batch * a.seq / (time.perf_counter() - t0))
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"device {dev} ({platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads)")
    print(f"LM: vocab {a.vocab}, d {a.d_model}, heads {a.heads}, d_ff {a.d_ff}, layers {a.layers}, "
          f"batch {a.batch} x seq {a.seq}, positions {a.position if a.backends else 'none'}"
          f"{', bf16' if a.bf16 else ''}; params {params}")
    print("| model | tokens/s (median) | min | max |")
    print("|---|---:|---:|---:|")
    for k, v in rates.items():
        print(f"| {k} | {med[k]:.0f} | {min(v):.0f} | {max(v):.0f} |")
    for name in list(steps)[:-1]:  # back-to-back pairs share the machine load
        paired = [o / t for o, t in zip(rates[name], rates[ref])]
        print(f"ratio {name} / {ref}: median of paired repeats {statistics.median(paired):.3f} "
              f"(ratio of medians {med[name] / med[ref]:.3f}; pairs {min(paired):.2f}..{max(paired):.2f})")


if __name__ == "__main__":
    main()
