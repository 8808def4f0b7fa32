"""The backend tests run on small inputs; the sliced path's minimum length (``SLICED_MIN_KEYS``, a speed rule)
is lowered for them so that its code runs at these sizes.  ``test_sliced_path_minimum_keys`` checks the rule."""

import pytest

from kernel_attention.backends import fused


@pytest.fixture(autouse=True)
def _sliced_at_any_length(monkeypatch):
    monkeypatch.setattr(fused, "SLICED_MIN_KEYS", 1)
