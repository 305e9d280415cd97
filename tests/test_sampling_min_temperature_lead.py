"""A positive temperature so small that ``logits / T`` overflows float64 gave no law at all (every row NaN), found
only after the models were loaded; it is now refused when the sampling is built, and at the smallest temperature
taken every float32 logit still gives a law (the greedy one where the largest logit is unique)."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from otspec.decoding import Sampling  # noqa: E402
from otspec.decoding._sampling import MIN_TEMPERATURE  # noqa: E402
from otspec.profile import ProfileSettings  # noqa: E402


@pytest.mark.parametrize("t", [MIN_TEMPERATURE / 2, 1e-300, 1e-320, 5e-324])
def test_temperatures_that_overflow_are_refused_by_name(t):
    with pytest.raises(ValueError, match=r"`temperature` must be 0 \(greedy decoding\) or at least MIN_TEMPERATURE"):
        Sampling(temperature=t)
    with pytest.raises(ValueError, match=r"`temperature`"):
        ProfileSettings(temperature=t)


def test_the_smallest_temperature_gives_a_law_for_every_float32_logit():
    assert MIN_TEMPERATURE == 2.0**-896
    f32 = float(np.finfo(np.float32).max)
    assert math.isfinite(f32 / MIN_TEMPERATURE) and math.isinf(f32 / (MIN_TEMPERATURE / 2))
    rng = np.random.default_rng(0)
    for _ in range(20):
        row = rng.choice([f32, -f32, 1.0, 0.0, -1e30, 1e30], size=7).astype(np.float32)
        p = Sampling(temperature=MIN_TEMPERATURE).probs(torch.from_numpy(row))
        assert torch.isfinite(p).all() and abs(float(p.sum()) - 1.0) <= 1e-15
        top = np.flatnonzero(row == row.max())
        if top.size == 1:                       # the T -> 0 limit: the greedy law
            assert p.tolist() == Sampling(temperature=0).probs(torch.from_numpy(row)).tolist()
    assert Sampling(temperature=0).greedy and Sampling(temperature=MIN_TEMPERATURE).temperature == MIN_TEMPERATURE
