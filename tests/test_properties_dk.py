"""Extreme laws at the tree verifiers, block verification, the test harness and the profile's intervals.

The laws are those of :mod:`tests.test_properties_db` (subnormal entries, ``1e-300`` and ``1e-200`` beside entries
near 1, ``2**-53``, exact zeros in one law and not the other, one-hot laws, ties), here the rows of two-level and
three-level table models, so that path probabilities reach ``1e-900`` (below the float range) and the draft and the
target disagree on supports along a path. Each quantity is compared with a route that does not share its code:

* exact rational arithmetic (:class:`fractions.Fraction` of every float64 input): every realised draft tree
  enumerated from the process's definition and every acceptance path of a per-node rule followed from the published
  rule (:mod:`tests.test_properties_cr`'s references: SpecInfer, Miao et al., arXiv:2305.09781, §4; Sequoia, Chen
  et al., arXiv:2402.12374, §3.2; the target-only rule); Sun et al.'s block optimum (arXiv:2403.10444, Theorem 1)
  summed over every block;
* enumeration of the package's own exact laws (:func:`otspec.tree.check_lossless`,
  :func:`otspec.block.check_lossless`) for the rules without a rational reference here (Traversal Verification,
  greedy block verification, hierarchical verification, SpecTr's rule on a tree);
* the exact law of Pearson's statistic under the null (every count vector of a multinomial enumerated) for the
  harness's stated false-failure rate.

Tolerances: a float64 sum or product of ``m`` terms in ``[0, 1]`` is within ``m * eps`` of its exact value (``eps =
2**-52``); the bounds are ``64 * m * eps`` relative on expected lengths (values of 1e-300 exact too), ``1e-12``
absolute on enumerated laws (the package's stated lossless tolerance is 1e-9). pyproject's filterwarnings turns
every RuntimeWarning of otspec into a failure, so a division by zero or an overflow on these laws fails its test.
"""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from scipy import stats

from otspec.decoding._metrics import min_runs
from otspec.testing import chi2_gof

EPS = 2.0**-52
FAST = settings(max_examples=12, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
SLOW = settings(max_examples=200, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


# ----------------------------------------------------------------------------- the harness's chi-square test


def _exact_false_failure_rate(law, N: int, alpha_fail: float) -> float:
    """``P(chi2_gof(counts, law).passed is False)`` for ``counts ~ Multinomial(N, law)`` on three cells, exact.

    For each count ``c2`` of the last cell, Pearson's statistic (any pooling: a sum of squares of affine functions
    of ``c1``) is convex in the count ``c1`` of the middle cell, so the passing ``c1`` form an interval around the
    statistic's minimum: found by bisection on chi2_gof's own results (a few hundred calls, not every vector)."""
    law = np.asarray(law, dtype=np.float64)

    def gof(c1: int, c2: int):
        return chi2_gof(np.array([N - c1 - c2, c1, c2]), law, alpha_fail=alpha_fail)

    total = 0.0
    for c2 in range(N + 1):
        w2 = float(stats.binom.pmf(c2, N, law[2]))
        if w2 < 1e-30:  # left out: below (N + 1) * 1e-30 in all
            continue
        n = N - c2
        lo, hi = 0, n  # the statistic's minimum over c1 in [0, n]: the first c1 where it stops decreasing
        while lo < hi:
            mid = (lo + hi) // 2
            if gof(mid + 1, c2).statistic >= gof(mid, c2).statistic:
                hi = mid
            else:
                lo = mid + 1
        if not gof(lo, c2).passed:
            total += w2  # every c1 fails
            continue
        a, b = 0, lo  # the first passing c1
        while a < b:
            mid = (a + b) // 2
            a, b = (a, mid) if gof(mid, c2).passed else (mid + 1, b)
        left = a
        a, b = lo, n  # the last passing c1
        while a < b:
            mid = (a + b + 1) // 2
            a, b = (mid, b) if gof(mid, c2).passed else (a, mid - 1)
        right = a
        r = law[1] / (law[0] + law[1])
        passing = float(stats.binom.cdf(right, n, r) - stats.binom.cdf(left - 1, n, r))
        total += w2 * (1.0 - passing)
    return total


def test_chi2_gof_false_failure_rate_is_at_most_alpha_fail_with_a_rare_cell():
    # A cell of expected count 0.2 (N = 200, mass 1e-3), pooled alone, gave Pearson's statistic a tail far heavier
    # than chi-square: the exact false-failure rate was 3.4e-3 at alpha_fail = 1e-4 (34 times the stated rate;
    # 1.0e-3 at N = 1000). Pooled with the next smallest cells until its expected count is 5 (as check_sampler
    # already did) it is 9.1e-5. Fails on the plain pooling. Exact (an enumeration): no false-failure rate here.
    law = [0.5, 0.499, 0.001]
    assert _exact_false_failure_rate(law, 200, 1e-4) <= 1e-4


def test_min_runs_leaves_two_tested_cells():
    # the fewest runs for which chi2_gof has two cells of expected count >= 5: the likeliest and the rest together
    # (fails on ceil(5 / max law) alone: 6 runs for (0.999, 0.001), where the rest's expected count is 0.006);
    # exact in rationals, also where 5 / rest overflows (a rest of 2e-300 needs 2.5e300 runs)
    for law in ([0.999, 0.001], [0.5, 0.5], [0.01] * 100, [1.0 - 2e-300, 1e-300, 1e-300], [0.9, 0.05, 0.05],
                [1.0 - 2.0**-53, 2.0**-53], [0.25, 0.75]):
        law = np.asarray(law)
        n = min_runs(law)
        top, rest = Fraction(float(law.max())), Fraction(float(np.sort(law)[:-1].sum()))
        assert n * top >= 5 and n * rest >= 5 and not ((n - 1) * top >= 5 and (n - 1) * rest >= 5), (law, n)
        if n < 10**6:  # chi2_gof runs at that count (no "too few samples")
            counts = np.zeros(law.shape[0], dtype=np.int64)
            counts[np.argmax(law)] = n
            chi2_gof(counts, law)
    assert min_runs(np.array([1.0])) == 1
