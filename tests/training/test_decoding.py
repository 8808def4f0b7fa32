import itertools

import pytest
import torch

from kernel_attention.training.decoding import beam_search, greedy_search

PAD, BOS, EOS, V, D = 0, 1, 2, 5, 4


class ToyDecoder:
    """A recurrent toy model: state h (N, D); h' = 0.5 h + E[last token]; log p = log_softmax(3 h' W)."""

    def __init__(self, seed):
        g = torch.Generator().manual_seed(seed)
        self.E = torch.randn(V, D, generator=g, dtype=torch.float64)
        self.W = torch.randn(D, V, generator=g, dtype=torch.float64)
        self.calls = 0

    def step(self, prefix, h):
        self.calls += 1
        h = 0.5 * h + self.E[prefix[:, -1]]
        return torch.log_softmax(3 * h @ self.W, -1), h

    def score(self, h0, seq):
        """Sum of log-probs of seq (ending with EOS) from scratch, no beam machinery involved."""
        prefix, h, total = [BOS], h0.view(1, D), 0.0
        for w in seq:
            lp, h = self.step(torch.tensor([prefix]), h)
            total += float(lp[0, w])
            prefix.append(w)
        return total


def exhaustive(dec, h0, max_len, len_penalty):
    words = [w for w in range(V) if w not in (PAD, EOS)]
    best = None
    for L in range(1, max_len + 1):
        for body in itertools.product(words, repeat=L - 1):
            seq = list(body) + [EOS]
            s = dec.score(h0, seq) / L ** len_penalty
            if best is None or s > best[0]:
                best = (s, seq)
    return best


@pytest.mark.parametrize("seed,len_penalty", [(0, 1.0), (1, 0.0), (2, 2.0), (3, 1.0)])
def test_wide_beam_equals_exhaustive_search(seed, len_penalty):
    dec = ToyDecoder(seed)
    B, max_len = 3, 4
    h0 = torch.randn(B, D, generator=torch.Generator().manual_seed(100 + seed), dtype=torch.float64)
    # 3 free words and up to 4 tokens: 1 + 3 + 9 + 27 = 40 sequences, so a beam of 40 never prunes
    out = beam_search(dec.step, B, beam=40, bos=BOS, eos=EOS, max_len=max_len, state=h0, pad=PAD,
                      len_penalty=len_penalty)
    for b in range(B):
        want_score, want_seq = exhaustive(dec, h0[b], max_len, len_penalty)
        L = int(out.lengths[b])
        assert out.tokens[b, :L].tolist() == want_seq
        assert float(out.scores[b]) == pytest.approx(want_score, rel=1e-5)
        assert out.nbest[b][0][0] == want_seq
        assert [s for _, s in out.nbest[b]] == sorted([s for _, s in out.nbest[b]], reverse=True)


def test_beam_one_is_greedy():
    for seed in range(5):
        dec = ToyDecoder(seed)
        h0 = torch.randn(4, D, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        g = greedy_search(dec.step, 4, bos=BOS, eos=EOS, max_len=6, state=h0, pad=PAD)
        b = beam_search(dec.step, 4, beam=1, bos=BOS, eos=EOS, max_len=6, state=h0, pad=PAD)
        assert torch.equal(g.tokens, b.tokens) and torch.equal(g.lengths, b.lengths)
        torch.testing.assert_close(g.scores, b.scores)


def test_beam_beats_greedy_somewhere_and_respects_max_len():
    # Not everywhere: like fairseq, a sentence stops once `beam` hypotheses have finished, which can
    # miss a longer greedy path with a better length-normalised score.
    gains = 0
    for seed in range(20):
        dec = ToyDecoder(seed)
        h0 = torch.randn(2, D, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        g = greedy_search(dec.step, 2, bos=BOS, eos=EOS, max_len=5, state=h0, pad=PAD)
        b = beam_search(dec.step, 2, beam=4, bos=BOS, eos=EOS, max_len=5, state=h0, pad=PAD)
        gains += int((b.scores > g.scores + 1e-6).sum())
        assert (b.lengths <= 5).all() and (b.tokens != PAD).sum() == b.lengths.sum()
        for row, L in zip(b.tokens, b.lengths):
            assert row[L - 1] == EOS and EOS not in row[: L - 1].tolist()
    assert gains > 0


class _ScalarReads(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts reads of one tensor element into Python (``int(t)``, ``float(t)``, ``t.item()``): on a GPU each
    waits for the device."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func is torch.ops.aten._local_scalar_dense.default
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("batch", [2, 32])
def test_greedy_reads_the_device_once_a_step_whatever_the_batch(batch):
    """A step whose arg-max is never EOS runs every sentence to max_len: at most one element read per step (whether
    all are done), not one per sentence; the result is greedy's all the same (beam 1)."""
    dec = ToyDecoder(0)

    def step(prefix, h):
        lp, h = dec.step(prefix, h)
        return lp.index_fill(1, torch.tensor([EOS]), -30.0), h  # never the arg-max; forced at max_len

    h0 = torch.randn(batch, D, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    reads = _ScalarReads()
    with reads:
        g = greedy_search(step, batch, bos=BOS, eos=EOS, max_len=6, state=h0, pad=PAD)
    assert reads.count <= 6 and (g.lengths == 6).all()
    b = beam_search(step, batch, beam=1, bos=BOS, eos=EOS, max_len=6, state=h0, pad=PAD)
    assert torch.equal(g.tokens, b.tokens)
    torch.testing.assert_close(g.scores, b.scores)


@pytest.mark.gpu
def test_greedy_and_beam_on_cuda_give_the_cpus_hypotheses():
    dec = ToyDecoder(3)

    def on_cuda(prefix, h):
        assert prefix.is_cuda
        lp, h = dec.step(prefix.cpu(), h.cpu())
        return lp.cuda(), h.cuda()

    h0 = torch.randn(5, D, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    for search, kw in ((greedy_search, {}), (beam_search, {"beam": 3})):
        cpu = search(dec.step, 5, bos=BOS, eos=EOS, max_len=6, state=h0, pad=PAD, **kw)
        cuda = search(on_cuda, 5, bos=BOS, eos=EOS, max_len=6, state=h0.cuda(), pad=PAD, device="cuda", **kw)
        assert cuda.tokens.is_cuda and torch.equal(cuda.tokens.cpu(), cpu.tokens)
        torch.testing.assert_close(cuda.scores, cpu.scores)
