"""Draft processes beyond i.i.d. (without replacement, greedy, top-k) and Khisti et al.'s two-step verifier.

Every acceptance is checked three ways where it can be: the exact route, the
LP over the draft process's tuples or sets (HiGHS), and exact enumeration of
the verifier (``otspec.check_lossless`` with the verifier's ``draft_law_of``).
"""

import itertools
import math

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import otspec
from otspec.otm import membership_plan, uncovered_prefixes, wor_draft_prob
from otspec.testing import chi2_gof
from tests.gof import assert_end_to_end_sampler
from tests.strategies import pairs

# False-failure rate of each chi-square test; this file runs 8 of them, so it fails
# spuriously with probability <= 8e-4 (seeds are fixed, so the outcome is deterministic).
ALPHA_FAIL = 1e-4
TOL = 1e-9

BUILDERS = {
    "without_replacement": otspec.without_replacement_verifier,
    "greedy": otspec.greedy_draft_verifier,
    "top_k": otspec.top_k_verifier,
    "khisti": otspec.khisti_verifier,
}


def _wor_within(p, A, k):
    """P(all k draws without replacement lie in A), by enumerating ordered tuples inside A."""
    return math.fsum(wor_draft_prob(p, x) for x in itertools.permutations(sorted(A), k))


def _brute_alpha(p, q, within):
    """min over every subset of 1 + q(A) - within(A): the min-cut of docs/theory/without_replacement.rst by brute force."""
    n = len(p)
    return min(1 + q[list(A)].sum() - within(A) for r in range(n + 1) for A in itertools.combinations(range(n), r))


def _support(p):
    return int(np.count_nonzero(p > 0))


# ----------------------------------------------------------------------------- alpha without replacement
@given(pq=pairs(min_n=1, max_n=6), k=st.integers(1, 4))
def test_alpha_without_replacement_equals_lp_and_brute_force(pq, k):
    p, q = pq
    assume(_support(p) >= k)
    a = otspec.alpha_k(p, q, k, replacement=False)
    assert abs(a - otspec.alpha_k(p, q, k, replacement=False, method="lp")) <= TOL
    assert abs(a - _brute_alpha(p, q, lambda A: _wor_within(p, A, k))) <= 1e-12
    # distinct drafts cover at least as much as i.i.d. ones (docs/theory/without_replacement.rst)
    assert a >= float(otspec.alpha_k(p, q, k)) - 1e-12


@given(pq=pairs(min_n=2, max_n=7), k=st.integers(1, 5))
def test_race_integral_matches_enumeration_on_every_prefix(pq, k):
    p, _ = pq
    assume(_support(p) >= k)
    order = np.argsort(p)
    unc = uncovered_prefixes(p[order], k)
    exact = [1.0 - _wor_within(p, order[:j], k) for j in range(len(p) + 1)]
    assert np.max(np.abs(unc - exact)) <= 1e-12


def test_alpha_without_replacement_k1_is_tv_and_k_equal_support_is_q_of_support():
    p, q = np.array([0.5, 0.3, 0.2, 0.0]), np.array([0.1, 0.2, 0.3, 0.4])
    assert otspec.alpha_k(p, q, 1, replacement=False) == pytest.approx(np.minimum(p, q).sum(), abs=1e-13)
    assert otspec.alpha_k(p, q, 3, replacement=False) == pytest.approx(0.6, abs=1e-13)
    assert np.allclose(otspec.alpha_k(p, q, [1, 3], replacement=False), [0.5, 0.6], atol=1e-13)


def test_alpha_without_replacement_errors():
    with pytest.raises(ValueError, match="`k`=3 distinct drafts need at least k tokens with p > 0"):
        otspec.alpha_k([0.5, 0.5, 0.0], [0.2, 0.3, 0.5], 3, replacement=False)
    with pytest.raises(ValueError, match="`method`"):
        otspec.alpha_k([0.5, 0.5], [0.5, 0.5], 1, replacement=False, method="nope")
    with pytest.raises(TypeError, match="`k`"):
        otspec.alpha_k([0.5, 0.5], [0.5, 0.5], 1.0, replacement=False)
    with pytest.raises(ValueError, match="`k`=2 distinct drafts"):
        otspec.without_replacement_verifier([1.0, 0.0], [0.5, 0.5], 2)


def test_alpha_without_replacement_large_vocabulary_accuracy():
    """n = 2,000 LLM-like pair: halving the quadrature step changes nothing above 1e-12."""
    rng = np.random.default_rng(3)
    logits = rng.normal(0, 3, 2000)
    q = np.exp(logits - logits.max())
    q /= q.sum()
    p = np.exp(logits + rng.normal(0, 1, 2000) - logits.max())
    p /= p.sum()
    order = np.argsort(q / p)
    for k in (2, 8):
        a = uncovered_prefixes(p[order], k)
        b = uncovered_prefixes(p[order], k, step=0.125)
        assert np.max(np.abs(a - b)) <= 1e-12
        assert otspec.alpha_k(p, q, k, replacement=False) >= float(otspec.alpha_k(p, q, k)) - 1e-12


# ----------------------------------------------------------------------------- every verifier: lossless, exact, optimal
def _optimum(name, v, p, q, k):
    if name == "without_replacement":
        return otspec.alpha_k(p, q, k, replacement=False)
    if name == "khisti":
        return float(otspec.alpha_k(p, q, k))
    if name == "greedy":  # the generic set LP over the greedy process: an independent route
        keys = [v.top + (x,) for x in range(len(p)) if v.last_law[x] > 0]
        return membership_plan(keys, [v.last_law[x] for x in range(len(p)) if v.last_law[x] > 0], q)[0]
    cand = v.candidates  # top-k: brute force over subsets
    return _brute_alpha(p, q, lambda A: float(set(cand) <= set(A)))


@pytest.mark.parametrize("name", sorted(BUILDERS))
@given(pq=pairs(min_n=1, max_n=5), k=st.integers(1, 3))
def test_lossless_by_enumeration_and_acceptance_is_the_optimum(name, pq, k):
    p, q = pq
    assume(_support(p) >= k)
    v = BUILDERS[name](p, q, k)
    chk = otspec.check_lossless(v)
    assert chk.passed and chk.max_error <= TOL
    assert chk.max_row_error <= 1e-12
    assert chk.acceptance_error <= TOL
    opt = _optimum(name, v, p, q, k)
    assert v.acceptance() <= opt + TOL
    assert v.acceptance() >= opt - TOL  # each of these verifiers is optimal for its draft process


@given(pq=pairs(min_n=2, max_n=5), k=st.integers(1, 4))
def test_draft_processes_order(pq, k):
    """Acceptances never exceed the optimum of their own process; top-k's optimum is q(C)."""
    p, q = pq
    assume(_support(p) >= k)
    g = otspec.greedy_draft_verifier(p, q, k)
    t = otspec.top_k_verifier(p, q, k)
    assert t.acceptance() == pytest.approx(q[list(t.candidates)].sum(), abs=1e-15)
    assert g.acceptance() <= 1.0 and t.acceptance() <= 1.0
    if k == 1:
        assert g.acceptance() == pytest.approx(np.minimum(p, q).sum(), abs=1e-12)


def test_khisti_closed_form_and_condition_match_alpha_2():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(2, 8))
        p, q = rng.dirichlet(np.ones(n)), rng.dirichlet(np.ones(n))
        a2 = float(otspec.alpha_k(p, q, 2))
        assert abs(otspec.khisti_alpha2(p, q) - a2) <= 1e-12
        assert otspec.khisti_acceptance_one(p, q) == (a2 >= 1 - 1e-12)
    assert otspec.khisti_acceptance_one([0.5, 0.5], [0.5, 0.5])
    with pytest.raises(ValueError, match="n <= 20"):
        otspec.khisti_alpha2(np.full(21, 1 / 21), np.full(21, 1 / 21))


# ----------------------------------------------------------------------------- samplers (chi-square)
P5 = np.array([0.35, 0.25, 0.2, 0.15, 0.05])
Q5 = np.array([0.1, 0.3, 0.15, 0.05, 0.4])


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_sampler_end_to_end_chi2(name):
    """Drafts from the verifier's own process, outputs from its sampler: law q, hit rate = acceptance."""
    v = BUILDERS[name](P5, Q5, 3)
    assert_end_to_end_sampler(v, 30_000, seed=11, alpha_fail=ALPHA_FAIL)


def test_without_replacement_draws_follow_the_draft_law_chi2():
    v = otspec.without_replacement_verifier(P5, Q5, 2)
    gen = np.random.default_rng(5)
    tuples = list(itertools.permutations(range(5), 2))
    index = {x: i for i, x in enumerate(tuples)}
    counts = np.zeros(len(tuples), dtype=np.int64)
    for _ in range(30_000):
        counts[index[v.sample_drafts(rng=gen)]] += 1
    law = np.array([v.draft_law_of(x) for x in tuples])
    assert chi2_gof(counts, law, alpha_fail=ALPHA_FAIL).passed


def test_registry_entries():
    for name, process in [("without-replacement", "without_replacement"), ("greedy-drafts", "greedy"),
                          ("top-k", "deterministic"), ("khisti", "iid")]:
        spec = otspec.multidraft.get_verifier(name)
        assert spec.draft_process == process and spec.lossless
        v = spec.build(P5, Q5, 2)
        assert otspec.check_lossless(v).passed
        # SpecTr over sequences draws i.i.d. drafts: only i.i.d. lossless verifiers are offered there
        assert (name in otspec.spectr.VERIFIER_NAMES) == (process == "iid")
    assert "typical" not in otspec.spectr.VERIFIER_NAMES and "ensemble" not in otspec.spectr.VERIFIER_NAMES


def test_guards_refuse_before_allocating():
    n = 49_152
    p = np.full(n, 1.0 / n)
    with pytest.raises(ValueError, match="draft multisets, above the limit"):
        otspec.khisti_verifier(p, p, 2)
    with pytest.raises(ValueError, match="draft sets, above the limit"):
        otspec.without_replacement_verifier(p, p, 2)
    with pytest.raises(ValueError, match="race pass would take"):
        otspec.alpha_k(p, p, 5_000, replacement=False)
    with pytest.raises(TypeError, match="`replacement` must be a bool"):
        otspec.alpha_k(p, p, 2, replacement="no")


class _ZeroUniform(np.random.Generator):
    """A generator whose uniforms are all 0: the boundary case of the strict coin u * p(x) < q(x)."""

    def random(self, *args, **kwargs):
        return 0.0


def test_strict_coins_never_emit_a_zero_target_draft():
    """With u = 0 a non-strict coin (u p <= q) would accept a draft of target mass 0 (docs/guide/testing.rst)."""
    p = np.array([0.4, 0.3, 0.2, 0.1])
    q = np.array([0.0, 0.5, 0.5, 0.0])
    gen = _ZeroUniform(np.random.PCG64(0))
    assert otspec.greedy_draft_verifier(p, q, 2).sample((0, 3), rng=gen) != 3
    assert otspec.top_k_verifier(p, q, 2).sample((0, 1), rng=gen) != 0
    assert otspec.khisti_verifier(p, q, 1).sample((0,), rng=gen) != 0
    assert otspec.ensemble_verifier(p, q, 1.0).sample((0,), rng=gen) != 0


@given(st.integers(0, 2**32 - 1), st.integers(1, 3), st.integers(1, 14))
def test_top_tokens_are_the_first_of_the_full_stable_sort(seed, levels, V):
    # the partition route of the greedy and top-k drafters: the first m of the full stable sort (ties by lower id),
    # for every m from 0 to beyond V, on laws with many ties and zeros
    from otspec.multidraft._greedy_drafts import top_tokens

    rng = np.random.default_rng(seed)
    p = rng.integers(0, levels + 1, size=V).astype(np.float64)
    p[0] += 1.0
    p /= p.sum()
    full = np.argsort(-p, kind="stable")
    for m in range(V + 2):
        np.testing.assert_array_equal(top_tokens(p, m), full[:m])


@pytest.mark.parametrize("n,k", [(4097, 1), (40_000, 1), (600, 2)])
def test_dense_selection_plans_are_refused_before_allocation(n, k):
    import tracemalloc

    from otspec.otm._lp import MAX_PLAN_ENTRIES
    from otspec.otm._multisets import n_multisets

    assert n_multisets(n, k) * n > MAX_PLAN_ENTRIES
    p = np.full(n, 1.0 / n)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"dense \(\d+, \d+\) float64 array.*above the limit"):
            otspec.khisti_verifier(p, p, k)
        if k == 1:
            with pytest.raises(ValueError, match=r"the membership plan is a dense"):
                membership_plan([(i,) for i in range(n)], p, p)
        assert tracemalloc.get_traced_memory()[1] < 64 * 2**20  # nothing near the plan's size was allocated
    finally:
        tracemalloc.stop()
