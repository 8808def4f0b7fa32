"""Greedy and beam search over a model-agnostic step function.

A model plugs in through one function (and, if it keeps per-hypothesis state, one reorder hook)::

    step(prefix, state) -> (log_probs, new_state)
        prefix     (N, t) LongTensor: BOS followed by the t-1 tokens generated so far, N = B * beam
        state      anything (encoder output, cached keys/values, ...), one row per hypothesis
        log_probs  (N, V) log-probabilities of the next token
    reorder(state, index) -> state      index (N',) LongTensor: row i of the new state is row index[i]

The default :func:`reorder_state` index-selects dim 0 of every tensor in a (nested) tuple/list/dict, which
suffices when every tensor has the hypotheses on dim 0.  ``state`` is given for the ``B`` inputs; the search
expands it to ``B * beam`` rows with ``reorder(state, arange(B).repeat_interleave(beam))``.

Scores follow fairseq's ``SequenceGenerator``: a finished hypothesis y_1..y_L (y_L = EOS, L counting EOS)
scores ``sum_i log p(y_i | y_<i) / L ** len_penalty``.  At each step the ``2*beam`` best continuations of
the live hypotheses are ranked; those ending in EOS that rank within the first ``beam`` are finished, and
the first ``beam`` that do not end in EOS stay live.  A sentence is done once it has ``beam`` finished
hypotheses; at the last step (``max_len`` tokens including EOS) EOS is forced.  ``pad`` (if given) is never
generated.  ``beam = 1`` is exactly greedy search.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

__all__ = ["Decoded", "greedy_search", "beam_search", "reorder_state"]

StepFn = Callable[[torch.Tensor, Any], tuple[torch.Tensor, Any]]


@dataclasses.dataclass
class Decoded:
    """Best hypothesis per input; ``nbest[b]`` lists ``(tokens, score)`` best first (beam search)."""

    tokens: torch.Tensor   # (B, L) generated tokens without BOS, ending with EOS, right-padded with pad
    scores: torch.Tensor   # (B,) length-normalised log-probability
    lengths: torch.Tensor  # (B,) tokens including EOS
    nbest: list[list[tuple[list[int], float]]] = dataclasses.field(default_factory=list)


def reorder_state(state: Any, index: torch.Tensor) -> Any:
    """Select rows ``index`` along dim 0 of every tensor in a nested tuple/list/dict; ``None`` stays."""
    if state is None:
        return None
    if isinstance(state, torch.Tensor):
        return state.index_select(0, index.to(state.device))
    if isinstance(state, dict):
        return {k: reorder_state(v, index) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(reorder_state(v, index) for v in state)
    raise TypeError(f"reorder_state cannot reorder a {type(state).__name__}; pass a reorder= hook")


def _pack(seqs: list[list[int]], scores: list[float], pad: int, device) -> Decoded:
    L = max(len(s) for s in seqs)
    tokens = torch.full((len(seqs), L), pad, dtype=torch.long)
    for i, s in enumerate(seqs):
        tokens[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    # built on the host and moved once: a copy per row would be a transfer per sentence
    return Decoded(tokens.to(device), torch.tensor(scores, dtype=torch.float32), torch.tensor([len(s) for s in seqs]))


def _mask(lp: torch.Tensor, eos: int, pad: int | None, last: bool) -> torch.Tensor:
    lp = lp.float().clone()
    if pad is not None:
        lp[:, pad] = float("-inf")
    if last:  # force EOS at max_len
        keep = lp[:, eos].clone()
        lp.fill_(float("-inf"))
        lp[:, eos] = keep
    return lp


@torch.no_grad()
def greedy_search(step: StepFn, batch_size: int, bos: int, eos: int, max_len: int, state: Any = None,
                  pad: int | None = 0, len_penalty: float = 1.0, device: torch.device | str = "cpu") -> Decoded:
    """Arg-max decoding; stops a sentence at EOS (forced at ``max_len`` tokens).

    Each step reads the batch's arg-max and its log-probability back to the host once, as two (B,) tensors:
    on a GPU, reading them per sentence would wait for the device B times a step."""
    prefix = torch.full((batch_size, 1), bos, dtype=torch.long, device=device)
    total = torch.zeros(batch_size, dtype=torch.float64)
    lengths = torch.zeros(batch_size, dtype=torch.long)
    done = torch.zeros(batch_size, dtype=torch.bool)
    steps: list[torch.Tensor] = []  # (B,) tokens of each step, on the host
    for t in range(max_len):
        lp, state = step(prefix, state)
        lp = _mask(lp, eos, pad, t == max_len - 1)
        best, tok = lp.max(-1)
        best_h, tok_h = best.double().cpu(), tok.cpu()
        live = ~done
        steps.append(tok_h)
        total += best_h.where(live, 0.0)
        lengths += live.long()
        done |= tok_h == eos
        if bool(done.all()):
            break
        prefix = torch.cat([prefix, tok.view(-1, 1).to(prefix.device)], 1)
    rows = torch.stack(steps, 1).tolist()
    out = [row[:n] for row, n in zip(rows, lengths.tolist())]
    scores = [float(s) / n ** len_penalty for s, n in zip(total.tolist(), lengths.tolist())]
    res = _pack(out, scores, pad if pad is not None else eos, device)
    res.nbest = [[(out[b], scores[b])] for b in range(batch_size)]
    return res


@torch.no_grad()
def beam_search(step: StepFn, batch_size: int, beam: int, bos: int, eos: int, max_len: int, state: Any = None,
                reorder: Callable[[Any, torch.Tensor], Any] = reorder_state, len_penalty: float = 1.0,
                pad: int | None = 0, device: torch.device | str = "cpu") -> Decoded:
    """fairseq-style beam search (see the module docstring); returns the best and the ``beam``-best.

    Each step ranks the candidates on the model's device and reads back the (B, 2·beam) best; the prefixes are
    kept on the host too, so that a finished hypothesis is read without waiting for the device."""
    B, K = batch_size, beam
    N = B * K
    ninf = float("-inf")
    state = reorder(state, torch.arange(B, device=device).repeat_interleave(K)) if state is not None else None
    prefix_h = torch.full((N, 1), bos, dtype=torch.long)
    prefix = prefix_h.to(device)
    live = torch.full((B, K), ninf, dtype=torch.float64)
    live[:, 0] = 0.0  # one real hypothesis per sentence to start with
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(B)]
    done = [False] * B
    for t in range(max_len):
        lp, state = step(prefix, state)
        lp = _mask(lp, eos, pad, t == max_len - 1).double()
        V = lp.size(-1)
        cand = (live.to(lp.device).view(N, 1) + lp).view(B, K * V)
        top_s, top_i = (x.cpu() for x in cand.topk(min(2 * K, K * V), dim=1))
        src = torch.empty(B, K, dtype=torch.long)
        tok = torch.full((B, K), eos, dtype=torch.long)
        new_live = torch.full((B, K), ninf, dtype=torch.float64)
        for b in range(B):
            src[b] = b * K  # dead rows copy some row of their sentence; their -inf score keeps them dead
            if done[b]:
                continue
            n_live = 0
            for r in range(top_s.size(1)):
                s = float(top_s[b, r])
                if s == ninf:
                    break
                k, w = divmod(int(top_i[b, r]), V)
                if w == eos:
                    if r < K:
                        seq = prefix_h[b * K + k, 1:].tolist() + [eos]
                        finished[b].append((s / len(seq) ** len_penalty, seq))
                elif n_live < K:
                    src[b, n_live], tok[b, n_live], new_live[b, n_live] = b * K + k, w, s
                    n_live += 1
            done[b] = len(finished[b]) >= K or n_live == 0
        if all(done):
            break
        prefix_h = torch.cat([prefix_h.index_select(0, src.view(-1)), tok.view(-1, 1)], 1)
        prefix = prefix_h.to(device)
        state = reorder(state, src.view(-1).to(device)) if state is not None else None
        live = new_live
    seqs, scores, nbest = [], [], []
    for b in range(B):
        ranked = sorted(finished[b], key=lambda x: -x[0])[:K]
        nbest.append([(seq, score) for score, seq in ranked])
        seqs.append(ranked[0][1])
        scores.append(ranked[0][0])
    res = _pack(seqs, scores, pad if pad is not None else eos, device)
    res.nbest = nbest
    return res
