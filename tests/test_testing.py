"""The chi-square goodness-of-fit helper: calibrated, strict on impossible draws, clear on too few samples."""

import numpy as np
import pytest

from otspec.testing import chi2_gof


def test_detects_a_wrong_law():
    rng = np.random.default_rng(0)
    counts = np.bincount(rng.choice(3, size=20_000, p=[0.2, 0.3, 0.5]), minlength=3)
    assert chi2_gof(counts, [0.2, 0.3, 0.5]).passed
    assert not chi2_gof(counts, [0.25, 0.25, 0.5]).passed


def test_false_failure_rate_is_calibrated():
    # under H0 the p-value is ~uniform: with alpha_fail=0.1 about 10% of 400 runs fail
    rng = np.random.default_rng(1)
    law = np.array([0.1, 0.2, 0.3, 0.4])
    fails = sum(
        not chi2_gof(np.bincount(rng.choice(4, size=2000, p=law), minlength=4), law, alpha_fail=0.1).passed
        for _ in range(400)
    )
    assert 20 <= fails <= 65  # binomial(400, 0.1): mean 40, sd 6


def test_draw_outside_support_fails():
    res = chi2_gof(np.array([50, 50, 1]), [0.5, 0.5, 0.0])
    assert not res.passed and res.outside_support == 1


def test_pooling_and_errors():
    law = np.array([0.5, 0.494, 0.003, 0.003])
    res = chi2_gof(np.array([500, 494, 3, 3]), law)
    assert res.n_cells == 3
    with pytest.raises(ValueError, match=r"too few samples"):
        chi2_gof(np.array([1, 1]), [0.5, 0.5])
    with pytest.raises(ValueError, match=r"`counts` must have the shape"):
        chi2_gof(np.array([1, 1, 1]), [0.5, 0.5])
    with pytest.raises(ValueError, match=r"non-negative integers"):
        chi2_gof(np.array([1.5, 1.0]), [0.5, 0.5])
    with pytest.raises(ValueError, match=r"`alpha_fail` must lie in \(0, 1\)"):
        chi2_gof(np.array([10, 10]), [0.5, 0.5], alpha_fail=0.0)
