"""The backend tests run on small inputs; the CPU policy's minimum length for blockwise's slice loops
(``sliced_min_keys``, a speed rule) is lowered for them so that the loops run at these sizes.
``test_sliced_path_minimum_keys`` checks the rule at its real value."""

import dataclasses

import pytest

from kernel_attention.backends.policy import POLICIES


@pytest.fixture(autouse=True)
def _sliced_at_any_length(monkeypatch):
    monkeypatch.setitem(POLICIES, "cpu", dataclasses.replace(POLICIES["cpu"], sliced_min_keys=1))
