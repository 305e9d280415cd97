"""Drafts without replacement: the race integral against exact rationals, at every k up to n.

References independent of the quadrature:

* uniform draft: the drafted set is a uniform k-subset, so
  ``P(S inside A) = C(|A|, k) / C(n, k)``; with a point target the optimum is
  exactly ``k / n``, with a uniform target on ``m`` tokens a min over
  prefixes of exact fractions;
* two mass classes: the chance that every draw stays inside ``A`` by a
  recursion over how many tokens of each class were drawn, in ``Fraction``;
* the membership LP over ordered distinct tuples (HiGHS) on small inputs.

Both passes of the race (compiled by numba, and numpy over the nodes) are
checked.
"""

import math
import time
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import otspec
from otspec.otm import _race_kernel as rk
from otspec.otm import _without_replacement as wr
from otspec.otm import prob_within_without_replacement, uncovered_prefixes


def _bound(n):
    """The bound the docstrings state, 1e-13 + 4 n eps."""
    return 1e-13 + 4 * n * np.finfo(float).eps


@pytest.fixture(params=["compiled", "numpy"])
def race_pass(request, monkeypatch):
    """Run a test with the compiled pass (numba, when installed) and with the numpy pass."""
    if request.param == "numpy":
        monkeypatch.setattr(rk, "race_pass", rk.race_pass_np)
    return request.param


def _classes_within(masses, counts_in, k):
    """P(k draws without replacement all lie in A), A holding counts_in[i] tokens of mass masses[i] (exact)."""
    layer = {tuple(0 for _ in masses): Fraction(1)}
    for _ in range(k):
        nxt = {}
        for d, pr in layer.items():
            rest = 1 - sum(di * mi for di, mi in zip(d, masses))
            for i, mi in enumerate(masses):
                if d[i] < counts_in[i]:
                    e = d[:i] + (d[i] + 1,) + d[i + 1:]
                    nxt[e] = nxt.get(e, 0) + pr * (counts_in[i] - d[i]) * mi / rest
        layer = nxt
    return sum(layer.values(), Fraction(0))


# ----------------------------------------------------------------------------- uniform draft
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 160), data=st.data())
def test_uniform_draft_point_target_is_k_over_n(race_pass, n, data):
    k = data.draw(st.integers(1, n))
    p = np.full(n, 1.0 / n)
    q = np.zeros(n)
    q[data.draw(st.integers(0, n - 1))] = 1.0
    assert abs(otspec.alpha_k(p, q, k, replacement=False) - k / n) <= _bound(n)


def test_uniform_draft_point_target_issue_cases(race_pass):
    """The cases a fixed quadrature step got wrong (errors 1e-4, 3.8e-5, 2.6e-9, 8e-12)."""
    for n, k in [(100, 64), (1000, 64), (40, 16), (200, 8), (100, 99), (1000, 999)]:
        p = np.full(n, 1.0 / n)
        q = np.zeros(n)
        q[0] = 1.0
        assert abs(otspec.alpha_k(p, q, k, replacement=False) - k / n) <= 1e-13


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 120), data=st.data())
def test_uniform_draft_every_prefix_is_a_binomial_ratio(race_pass, n, data):
    k = data.draw(st.integers(1, n))
    u = uncovered_prefixes(np.full(n, 1.0 / n), k)
    exact = [1 - math.comb(j, k) / math.comb(n, k) for j in range(n + 1)]
    np.testing.assert_allclose(u, exact, rtol=0, atol=_bound(n))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(2, 120), data=st.data())
def test_uniform_draft_uniform_target_on_a_subset(race_pass, n, data):
    m = data.draw(st.integers(1, n))
    k = data.draw(st.integers(1, n))
    perm = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1))).permutation(n)
    p = np.full(n, 1.0 / n)
    q = np.zeros(n)
    q[perm[:m]] = 1.0 / m
    # prefixes of the ratio order: the n - m tokens with q = 0, then the subset
    exact = min(1 + Fraction(max(0, j - (n - m)), m) - Fraction(math.comb(j, k), math.comb(n, k)) for j in range(n + 1))
    assert abs(otspec.alpha_k(p, q, k, replacement=False) - float(exact)) <= _bound(n)


# ----------------------------------------------------------------------------- two mass classes
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(2, 22), data=st.data())
def test_two_mass_classes_every_prefix(race_pass, n, data):
    m = data.draw(st.integers(1, n - 1))  # tokens of the first class
    k = data.draw(st.integers(1, n))
    share = Fraction(data.draw(st.integers(1, 999)), 1000)  # mass of the first class in all
    a, b = share / m, (1 - share) / (n - m)
    labels = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1))).permutation(np.arange(n) < m)
    p = np.where(labels, float(a), float(b))
    u = uncovered_prefixes(p, k)
    first = np.concatenate([[0], np.cumsum(labels)])
    for j in sorted({0, n, *data.draw(st.lists(st.integers(0, n), min_size=1, max_size=4))}):
        exact = 1 - _classes_within([a, b], [int(first[j]), j - int(first[j])], k)
        assert abs(u[j] - float(exact)) <= _bound(n), (j, u[j], float(exact))


def test_two_mass_classes_large_vocabulary(race_pass):
    """n = 4,096, 60 heavy tokens among light ones, k = 8 and 40: every sampled prefix to 1e-13."""
    rng = np.random.default_rng(7)
    n, m = 4096, 60
    a = Fraction(1, 2 * m)
    b = (1 - m * a) / (n - m)
    labels = rng.permutation(np.arange(n) < m)
    p = np.where(labels, float(a), float(b))
    first = np.concatenate([[0], np.cumsum(labels)])
    u = uncovered_prefixes(p, [8, 40])
    for j in sorted({n - 1, *rng.integers(40, n, 6).tolist()}):
        for row, k in enumerate((8, 40)):
            exact = 1 - _classes_within([a, b], [int(first[j]), j - int(first[j])], k)
            assert abs(u[row, j] - float(exact)) <= 1e-13


@pytest.mark.slow
def test_two_mass_classes_full_vocabulary():
    """n = 49,152 (the real vocabulary size), k = 2, 8, 32: sampled prefixes to 1e-13 (measured ~1e-15)."""
    rng = np.random.default_rng(1)
    n, m = 49_152, 100
    a = Fraction(1, 200)
    b = (1 - m * a) / (n - m)
    labels = rng.permutation(np.arange(n) < m)
    p = np.where(labels, float(a), float(b))
    first = np.concatenate([[0], np.cumsum(labels)])
    u = uncovered_prefixes(p, [2, 8, 32])
    for j in sorted({n - 1, n - 2, *rng.integers(32, n, 8).tolist()}):
        for row, k in enumerate((2, 8, 32)):
            exact = 1 - _classes_within([a, b], [int(first[j]), j - int(first[j])], k)
            assert abs(u[row, j] - float(exact)) <= 1e-13


# ----------------------------------------------------------------------------- other routes
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(2, 7), data=st.data())
def test_equals_the_tuple_lp(race_pass, n, data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    p, q = rng.dirichlet(np.full(n, 0.5)), rng.dirichlet(np.full(n, 0.5))
    k = data.draw(st.integers(1, n))
    exact = otspec.alpha_k(p, q, k, replacement=False)
    assert abs(exact - otspec.alpha_k(p, q, k, replacement=False, method="lp")) <= 1e-9


def test_prob_within_uniform_is_a_binomial_ratio(race_pass):
    n = 300
    for size, k in [(250, 64), (299, 200), (40, 40), (10, 1)]:
        got = prob_within_without_replacement(np.full(n, 1.0 / n), list(range(size)), k)
        assert abs(got - math.comb(size, k) / math.comb(n, k)) <= _bound(size)


def test_compiled_and_numpy_passes_agree():
    rng = np.random.default_rng(11)
    logits = rng.normal(0, 3, 3000)
    p = np.exp(logits - logits.max())
    p /= p.sum()
    a, _ = wr._race(p, np.array([2, 8, 33]))
    saved = rk.race_pass
    try:
        rk.race_pass = rk.race_pass_np
        b, _ = wr._race(p, np.array([2, 8, 33]))
    finally:
        rk.race_pass = saved
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-13)


def test_refinement_is_used_and_settles():
    """k = 64 on 1,000 equal masses: the first pass does not settle, one halving does (and to k / n)."""
    n = 1000
    u, info = wr._race(np.full(n, 1.0 / n), np.array([64]))
    assert info["halvings"] >= 1
    np.testing.assert_allclose(u[0], [1 - math.comb(j, 64) / math.comb(n, 64) for j in range(n + 1)], rtol=0, atol=1e-13)


def test_race_guard_refuses_fast():
    n = 20_000
    p = np.full(n, 1.0 / n)
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"race pass would take n \* k \* M = 20000 \* 5000 \* \d+ steps, above the limit"):
        otspec.alpha_k(p, p, 5000, replacement=False)
    assert time.perf_counter() - t0 < 0.5


def test_uncovered_prefixes_errors():
    with pytest.raises(ValueError, match="`step` must lie in"):
        uncovered_prefixes(np.array([0.5, 0.5]), 1, step=2.0)
    with pytest.raises(ValueError, match="`p_sorted` must be"):
        uncovered_prefixes(np.array([0.5, -0.5]), 1)


# ----------------------------------------------------------------------------- the verifier's plan over sets
def test_set_weights_equal_the_sum_over_orderings():
    import itertools

    rng = np.random.default_rng(2)
    for n, k in [(6, 3), (7, 5), (5, 1), (5, 5)]:
        p = rng.dirichlet(np.ones(n))
        sets = np.array(list(itertools.combinations(range(n), k)))
        got = wr.set_weights_without_replacement(p, sets)
        ref = [math.fsum(wr._wor_draft_prob(p, o) for o in itertools.permutations(s)) for s in sets]
        np.testing.assert_allclose(got, ref, rtol=1e-14, atol=0)
        assert abs(got.sum() - 1) <= 1e-14


def test_verifier_at_k_near_n_is_fast_and_lossless():
    """n = 12, k = 11 took about 80 minutes by orderings; now well under a few seconds, still lossless."""
    rng = np.random.default_rng(4)
    p, q = rng.dirichlet(np.ones(12)), rng.dirichlet(np.ones(12))
    t0 = time.perf_counter()
    v = otspec.without_replacement_verifier(p, q, 11)
    assert time.perf_counter() - t0 < 5.0
    assert abs(v.acceptance() - v.alpha) <= 1e-9
    assert v.acceptance() <= 1.0


@pytest.mark.parametrize("build", [otspec.without_replacement_verifier,
                                   lambda p, q, k: otspec.multidraft.VERIFIERS["without-replacement"].build(p, q, k)])
def test_verifier_guard_refuses_fast(build):
    p = np.full(20, 0.05)
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"C\(20, 16\) \* 2\^16 \* 16 = 5\.08e\+09 steps, above the limit 2e\+08 \(`k`=16"):
        build(p, p, 16)
    with pytest.raises(ValueError, match=r"C\(40, 20\) = 137846528820 draft sets, above the limit 200000 \(`k`=20"):
        build(np.full(40, 0.025), np.full(40, 0.025), 20)
    assert time.perf_counter() - t0 < 0.1
