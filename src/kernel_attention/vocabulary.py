"""The attention vocabulary shared by the Python API, configs and the CLI, in one printable place."""

from __future__ import annotations

from kernel_attention.nn.attention import VALUE_POSITIONS
from kernel_attention.backends import BACKENDS
from kernel_attention.filters import FILTERS
from kernel_attention.kernels import KERNELS
from kernel_attention.positions import POSITIONS

__all__ = ["describe_vocabulary", "REGISTRIES"]

#: Every registry of attention parts, by the keyword that selects it.
REGISTRIES = {"kernel": KERNELS, "position": POSITIONS, "filter": FILTERS, "backend": BACKENDS}


def describe_vocabulary() -> str:
    """Every registered name with its typed parameters (used by ``--help`` and ``check``)."""
    parts = ["attention vocabulary (Python keyword = config key = CLI override):"]
    for reg in REGISTRIES.values():
        parts.append(reg.describe())
    parts.append("value_positions:\n  " + ", ".join(VALUE_POSITIONS)
                 + "\n      none = f W_v (Eq. 8); absolute = (f + t) W_v (Eq. 7); relative = Shaw's a^V")
    parts.append("symmetric: true | false  (W_q = W_k)")
    parts.append("filters compose: 'causal&local:window=8' (intersection), 'a|b' (union)")
    return "\n".join(parts)
