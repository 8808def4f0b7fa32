"""Models built from kernel attention: one readable file per family."""

from kernel_attention.models.block import TransformerBlock

__all__ = ["TransformerBlock"]
