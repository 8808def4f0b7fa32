"""The models pass their positions as the defaults they are, so that no attention call reads them back to the host
(on a GPU each read waits for the device: Transformer-XL's distance range was read so in every layer)."""

import pytest
import torch

from kernel_attention.functional import validation
from kernel_attention.models import LanguageModel, TranslationModel


# dense: every scheme's terms are formed by the library itself, as on a GPU where no fused kernel runs them
POSITIONS = ["xl", "shaw", "product", "absolute"]


@pytest.mark.parametrize("position", POSITIONS)
def test_language_model_with_memory_reads_no_positions(position, host_reads):
    torch.manual_seed(0)
    model = LanguageModel(40, d_model=16, n_heads=2, d_ff=32, n_layers=2, mem_len=4,
                          attention={"position": position, "backend": "dense"})
    tokens = torch.randint(0, 40, (2, 6))
    with validation(False):  # the finiteness check reads on the CPU only (validation "auto")
        _, mems = model(tokens)
        host_reads.clear()
        logits, _ = model(tokens, mems)
        logits.sum().backward()
    assert host_reads == []


@pytest.mark.parametrize("position", POSITIONS)
def test_translation_model_reads_no_positions(position, host_reads):
    """Training's forward and incremental decoding (cross-attention from the tokens after the cached ones)."""
    torch.manual_seed(0)
    att = {"position": position, "backend": "dense"}
    model = TranslationModel(30, 30, d_model=16, n_heads=2, d_ff=32, enc_layers=1, dec_layers=2, dropout=0.0,
                             encoder_attention=att, cross_attention=att,
                             decoder_attention={**att, "filter": "causal"}).eval()
    src, tgt = torch.randint(1, 30, (2, 5)), torch.randint(1, 30, (2, 4))
    with validation(False):
        host_reads.clear()
        model(src, tgt).sum().backward()
        state = {"enc": model.encode(src)}
        for t in range(1, 4):
            _, state = model.step(tgt[:, :t], state)
    assert host_reads == []
