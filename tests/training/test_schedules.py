import math

import pytest

from kernel_attention.registry import SpecError
from kernel_attention.training.schedules import SCHEDULES


def test_inverse_sqrt_matches_fairseq_formula():
    lr, w, w0 = 5e-4, 4000, 1e-7
    s = SCHEDULES.create("inverse_sqrt:warmup=4000,warmup_init_lr=1e-7", lr=lr, max_steps=None)
    assert s(0) == pytest.approx(w0)
    assert s(2000) == pytest.approx(w0 + 2000 * (lr - w0) / w)  # half-way up the linear ramp
    assert s(4000) == pytest.approx(lr)                        # peak at the end of warm-up
    assert s(16000) == pytest.approx(lr / 2)                   # lr * sqrt(4000 / 16000)
    assert s(50000) == pytest.approx(lr * math.sqrt(w) / math.sqrt(50000))


def test_cosine_matches_transformer_xl():
    lr, T = 2.5e-4, 200000
    s = SCHEDULES.create("cosine", lr=lr, max_steps=T)
    assert s(0) == pytest.approx(lr)
    assert s(T // 2) == pytest.approx(lr / 2)
    assert s(T // 4) == pytest.approx(lr * (1 + math.cos(math.pi / 4)) / 2)
    assert s(T) == 0.0 and s(T + 5) == 0.0
    w = SCHEDULES.create({"name": "cosine", "warmup": 100, "eta_min": 1e-6}, lr=lr, max_steps=1000)
    assert w(50) == pytest.approx(lr * 0.5)
    assert w(500) == pytest.approx(1e-6 + (lr - 1e-6) * 0.5)
    total = SCHEDULES.create("cosine:total=10", lr=1.0, max_steps=1000)
    assert total(5) == pytest.approx(0.5)


def test_constant_and_errors():
    c = SCHEDULES.create("constant:warmup=4", lr=0.1, max_steps=10)
    assert [c(i) for i in range(6)] == pytest.approx([0.0, 0.025, 0.05, 0.075, 0.1, 0.1])
    with pytest.raises(SpecError, match="accepted: constant, cosine, inverse_sqrt"):
        SCHEDULES.create("linear", lr=0.1, max_steps=10)
    with pytest.raises(SpecError, match="warmup"):
        SCHEDULES.create("inverse_sqrt:warmup=0", lr=0.1, max_steps=10)
    with pytest.raises(ValueError, match="max_steps"):
        SCHEDULES.create("cosine", lr=0.1, max_steps=None)
