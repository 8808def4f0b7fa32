"""Imports every study module so that their studies are registered in STUDIES."""

from kernel_attention.study import dissection, ika, smoke  # noqa: F401
