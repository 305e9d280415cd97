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


@pytest.mark.parametrize("N,r", [(200, 1e-3), (2000, 1e-3), (20_000, 1.11e-16), (50, 0.05)])
def test_one_dominant_cell_is_tested_by_the_exact_binomial_test(N, r):
    # One cell of expected count >= 5 beside a rest of expected count below 5: growing the pooled cell would leave
    # one cell (the code before raised "too few samples" here). The exact false-failure rate, summed over every
    # count of the rest (two groups: the test sees only that count), stays at most alpha_fail; Pearson's chi-square
    # on the two groups would give 1.7e-2 at (200, 1e-3) (two hits of expected 0.2: X^2 = 16.2).
    from scipy import stats

    law = np.array([1.0 - r, r / 2, r / 2, 0.0])
    alpha = 1e-4
    rate = 0.0
    for hits in range(0, min(N, 60) + 1):
        counts = np.array([N - hits, hits - hits // 2, hits // 2, 0])
        res = chi2_gof(counts, law, alpha_fail=alpha)
        assert res.dof == 1 and res.n_cells == 2
        rate += stats.binom.pmf(hits, N, r) * (not res.passed)
    assert rate <= alpha
    assert not chi2_gof(np.array([N - 40, 20, 20, 0]), law, alpha_fail=alpha).passed or N * r > 10
    assert not chi2_gof(np.array([N - 1, 0, 0, 1]), law, alpha_fail=alpha).passed  # a draw outside the support
