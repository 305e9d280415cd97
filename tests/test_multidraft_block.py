"""Multi-draft block OT: the LP, the level-wise bound, the exact counterexample, verifiers and schemes."""

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import otspec
from otspec.block import (
    SCHEMES,
    MultiDraftPlanVerifier,
    OneTokenVerifier,
    compare_schemes,
    expected_length,
    level_alphas,
    level_bound,
    multidraft_exact,
    multidraft_ot,
    one_token_optimum,
    theorem1_length,
)
from otspec.models import MemorylessModel, joint_law, random_markov_model, random_table_model
from otspec.testing import chi2_gof

TOL = 1e-9


def _pair(V, seed, c=1.0):
    return (random_markov_model(V, 1, concentration=c, rng=seed),
            random_markov_model(V, 1, concentration=c, rng=seed + 1000))


@pytest.mark.parametrize("V,L", [(2, 1), (2, 2), (2, 3), (3, 2), (2, 4)])
@pytest.mark.parametrize("seed", [0, 1])
def test_k1_is_theorem1(V, L, seed):
    d, t = _pair(V, seed)
    res = multidraft_ot(d, t, L, 1)
    ref = theorem1_length(d, t, L)
    np.testing.assert_allclose(res.value, ref, atol=TOL, rtol=0)
    np.testing.assert_allclose(res.bound, ref, atol=TOL, rtol=0)
    np.testing.assert_allclose(res.plan_value, ref, atol=TOL, rtol=0)


@pytest.mark.parametrize("V,k", [(2, 2), (3, 2), (3, 3), (4, 2), (2, 5)])
@pytest.mark.parametrize("seed", [0, 1])
def test_l1_is_alpha_k(V, k, seed):
    d, t = _pair(V, seed, c=0.5)
    p, q = d.next_dist(()), t.next_dist(())
    res = multidraft_ot(d, t, 1, k)
    np.testing.assert_allclose(res.value, otspec.alpha_k(p, q, k), atol=TOL, rtol=0)
    np.testing.assert_allclose(res.bound, otspec.alpha_k(p, q, k), atol=TOL, rtol=0)


def test_plan_marginals_exact():
    d, t = _pair(2, 3)
    res = multidraft_ot(d, t, 3, 2)
    np.testing.assert_allclose(res.plan.sum(axis=1), res.weights, atol=1e-15, rtol=0)
    np.testing.assert_allclose(res.plan.sum(axis=0), res.target_law, atol=1e-15, rtol=0)
    assert res.plan.min() >= 0.0
    np.testing.assert_allclose(res.plan_value, res.value, atol=TOL, rtol=0)


def test_counterexample_exact():
    """Draft Ber(1/4), target Ber(1/2), L = 2, k = 2: OPT = 231/128 < B = 463/256."""
    d, t = MemorylessModel([3 / 4, 1 / 4]), MemorylessModel([1 / 2, 1 / 2])
    ex = multidraft_exact(d, t, 2, 2)
    assert ex.level_alphas == (Fraction(15, 16), Fraction(223, 256))
    assert ex.bound == Fraction(463, 256)
    assert ex.opt == Fraction(231, 128)
    assert ex.gap == Fraction(1, 256)
    assert ex.gap_proved and ex.upper == ex.opt  # the rounded dual certifies the optimum itself
    res = multidraft_ot(d, t, 2, 2)
    np.testing.assert_allclose(res.value, 231 / 128, atol=TOL, rtol=0)
    np.testing.assert_allclose(level_bound(d, t, 2, 2), 463 / 256, atol=1e-15, rtol=0)


def test_exact_alpha_matches_float():
    d, t = _pair(3, 5)
    ex = multidraft_exact(d, t, 2, 2)
    np.testing.assert_allclose([float(a) for a in ex.level_alphas], level_alphas(d, t, 2, 2), atol=1e-14, rtol=0)
    assert float(ex.upper) >= multidraft_ot(d, t, 2, 2).value - TOL


def test_exact_opt_agrees_with_highs_on_markov():
    d, t = _pair(2, 7)
    ex = multidraft_exact(d, t, 2, 2)
    np.testing.assert_allclose(float(ex.opt), multidraft_ot(d, t, 2, 2).value, atol=TOL, rtol=0)
    assert ex.opt <= ex.upper


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 3), st.integers(1, 3), st.integers(1, 3), st.sampled_from([0.3, 1.0, 3.0]),
       st.integers(0, 2**31))
def test_opt_below_bound_hypothesis(V, L, k, c, seed):
    if V == 3 and L == 3 and k == 3:
        k = 2  # keep the default suite fast
    d = random_markov_model(V, 1, concentration=c, rng=seed)
    t = random_markov_model(V, 1, concentration=c, rng=seed + 1)
    res = multidraft_ot(d, t, L, k)
    assert res.success
    assert res.value <= res.bound + TOL
    # more drafts never hurt; and OPT >= the single-draft optimum (Theorem 1)
    assert res.value >= theorem1_length(d, t, L) - TOL
    if k == 1 or L == 1:
        np.testing.assert_allclose(res.value, res.bound, atol=TOL, rtol=0)


def test_table_models():
    d = random_table_model(2, 3, concentration=0.5, rng=1)
    t = random_table_model(2, 3, concentration=0.5, rng=2)
    res = multidraft_ot(d, t, 3, 2)
    assert res.success and res.value <= res.bound + TOL


def test_bad_input():
    d, t = _pair(2, 0)
    with pytest.raises(ValueError, match="`max_variables`"):
        multidraft_ot(d, t, 4, 4, max_variables=1000)
    with pytest.raises(ValueError, match="`k`"):
        multidraft_ot(d, t, 2, 0)
    with pytest.raises(ValueError, match="`L`"):
        level_bound(d, t, 0, 2)
    with pytest.raises(TypeError, match="`k`"):
        level_alphas(d, t, 2, 2.0)
    with pytest.raises(TypeError, match="`raise_on_failure`"):
        multidraft_ot(d, t, 2, 2, raise_on_failure=1)
    with pytest.raises(ValueError, match="`max_denominator`"):
        multidraft_exact(d, t, 2, 2, max_denominator=0)
    with pytest.raises(ValueError, match="vocab"):
        multidraft_ot(d, random_markov_model(3, 1, rng=0), 2, 2)


# ---------------------------------------------------------------------------
# verifiers and schemes
# ---------------------------------------------------------------------------

#: False-failure rate of each chi-square test below (Pearson, pooled cells with expected count >= 5).
ALPHA_FAIL = 1e-4
#: Samples per chi-square test: detects a TV deviation of about 0.05 on a few cells with
#: probability >= 0.99 at ALPHA_FAIL (non-centrality >= 4 N eps^2); well under 65,536.
N_SAMPLES = 6000


@pytest.mark.parametrize("V,L,k,seed", [(2, 2, 2, 0), (2, 3, 3, 1), (3, 2, 2, 2), (2, 2, 4, 3)])
def test_plan_verifier_exact(V, L, k, seed):
    d, t = _pair(V, seed)
    v = MultiDraftPlanVerifier(d, t, L, k)
    assert v.max_error() <= 1e-12
    np.testing.assert_allclose(v.output_law(bonus=False).ravel(), joint_law(t, L).ravel(), atol=1e-12, rtol=0)
    np.testing.assert_allclose(v.expected_length(), v.result.value, atol=TOL, rtol=0)
    np.testing.assert_allclose(v.expected_length(include_bonus=True), v.result.value + 1, atol=TOL, rtol=0)
    np.testing.assert_allclose(v.tau_law().sum(), 1.0, atol=1e-15, rtol=0)


def _sampled_laws_pass(v, target, seed):
    """``N_SAMPLES`` samples of a binary L = 2 verifier: chi-square of the L + 1 output tokens against the
    target's joint law and of tau against ``v.tau_law()``; returns the samples."""
    gen = np.random.default_rng(seed)
    samples = [v.sample(rng=gen) for _ in range(N_SAMPLES)]
    idx = np.ravel_multi_index(np.array([s.output for s in samples]).T, (2,) * 3)
    res = chi2_gof(np.bincount(idx, minlength=8), joint_law(target, 3).ravel(), alpha_fail=ALPHA_FAIL)
    assert res.passed, res
    taus = np.array([s.tau for s in samples])
    res = chi2_gof(np.bincount(taus, minlength=3), v.tau_law(), alpha_fail=ALPHA_FAIL)
    assert res.passed, res
    return samples


def test_plan_verifier_chi2():
    """Sampled outputs (L + 1 tokens) follow the target's joint law; sampled tau follows tau_law."""
    d, t = _pair(2, 11, c=0.7)
    samples = _sampled_laws_pass(MultiDraftPlanVerifier(d, t, 2, 3), t, 2024)
    # tau is the longest common prefix of the output with a draft
    for s in samples[:200]:
        assert s.tau == max(next((j for j in range(2) if b[j] != s.output[j]), 2) for b in s.drafts)


def test_plan_verifier_conditional_chi2():
    d, t = _pair(2, 12)
    v = MultiDraftPlanVerifier(d, t, 2, 2)
    drafts = ((0, 1), (1, 1))
    law = v.conditional(drafts)
    gen = np.random.default_rng(7)
    outs = [v.verify(drafts, rng=gen).output[:2] for _ in range(N_SAMPLES)]
    idx = np.ravel_multi_index(np.array(outs).T, (2, 2))
    assert chi2_gof(np.bincount(idx, minlength=4), law, alpha_fail=ALPHA_FAIL).passed
    assert v.sample(rng=3) == v.sample(rng=3)


@pytest.mark.parametrize("V,L,k,seed", [(2, 2, 2, 0), (2, 3, 3, 1), (3, 2, 2, 2), (2, 3, 4, 3), (2, 2, 1, 4)])
def test_one_token_verifier_exact(V, L, k, seed):
    d, t = _pair(V, seed, c=0.6)
    v = OneTokenVerifier(d, t, L, k)
    assert v.max_error() <= 1e-12
    np.testing.assert_allclose(v.output_law(bonus=False).ravel(), joint_law(t, L).ravel(), atol=1e-12, rtol=0)
    np.testing.assert_allclose(v.expected_length(), one_token_optimum(d, t, L, k).value, atol=TOL, rtol=0)
    if k == 1:
        np.testing.assert_allclose(v.expected_length(), expected_length(d, t, L, "block-onestep"), atol=TOL, rtol=0)


def test_one_token_verifier_chi2():
    """Sampled outputs (L + 1 tokens) follow the target; sampled tau follows tau_law; tau <= lcp with a draft."""
    d, t = _pair(2, 13, c=0.7)
    samples = _sampled_laws_pass(OneTokenVerifier(d, t, 2, 3), t, 77)
    for s in samples[:300]:
        assert any(tuple(b[: s.tau]) == s.output[: s.tau] for b in s.drafts)


@pytest.mark.parametrize("V,L,seed", [(2, 2, 0), (2, 3, 1), (3, 2, 2)])
def test_one_token_k1_is_onestep_block(V, L, seed):
    """k = 1: the one-token optimum is the one-step block verification (published Sun et al.)."""
    d, t = _pair(V, seed)
    np.testing.assert_allclose(one_token_optimum(d, t, L, 1).value, expected_length(d, t, L, "block-onestep"),
                               atol=TOL, rtol=0)


@pytest.mark.parametrize("V,k", [(2, 2), (3, 3)])
def test_one_token_l1_is_alpha_k(V, k):
    d, t = _pair(V, 4)
    np.testing.assert_allclose(one_token_optimum(d, t, 1, k).value,
                               otspec.alpha_k(d.next_dist(()), t.next_dist(()), k), atol=TOL, rtol=0)


def test_counterexample_schemes():
    d, t = MemorylessModel([3 / 4, 1 / 4]), MemorylessModel([1 / 2, 1 / 2])
    c = compare_schemes(d, t, 2, 2)
    expect = {"bound": 463 / 256, "optimum": 231 / 128, "multidraft-plan": 231 / 128,
              "one-token-optimum": 227 / 128, "one-token-verifier": 227 / 128,
              "spectr-optimal": 447 / 256, "block": 23 / 16, "token": 21 / 16}
    for name, value in expect.items():
        np.testing.assert_allclose(c.length(name), value, atol=TOL, rtol=0)
    for r in c.rows:
        if r.kind == "verifier":
            assert r.max_error <= 1e-12, r
    with pytest.raises(KeyError):
        c.length("nope")


@settings(max_examples=6, deadline=None)
@given(st.integers(2, 3), st.integers(1, 2), st.integers(1, 3), st.integers(0, 2**31))
def test_scheme_order_hypothesis(V, L, k, seed):
    d = random_markov_model(V, 1, concentration=0.7, rng=seed)
    t = random_markov_model(V, 1, concentration=0.7, rng=seed + 1)
    c = compare_schemes(d, t, L, k)
    g = c.length
    for r in c.rows:
        if r.kind == "verifier":
            assert r.max_error <= 1e-12, r
    chain = ["token", "spectr-dp", "one-token-optimum", "optimum", "bound"]
    for a, b in zip(chain, chain[1:]):
        assert g(a) <= g(b) + TOL, (a, b)
    for rule in ("spectr-lp", "spectr-optimal", "spectr-kseq", "spectr-multiround"):
        assert g("token") - TOL <= g(rule) <= g("spectr-dp") + TOL
    assert g("block-onestep") <= g("one-token-optimum") + TOL
    np.testing.assert_allclose(g("multidraft-plan"), g("optimum"), atol=TOL, rtol=0)
    np.testing.assert_allclose(g("one-token-verifier"), g("one-token-optimum"), atol=TOL, rtol=0)


def test_verifier_bad_input():
    d, t = _pair(2, 0)
    res = multidraft_ot(d, t, 2, 2)
    with pytest.raises(ValueError, match="`result` was solved"):
        MultiDraftPlanVerifier(d, t, 2, 3, result=res)
    with pytest.raises(TypeError, match="`result`"):
        MultiDraftPlanVerifier(d, t, 2, 2, result=object())
    v = MultiDraftPlanVerifier(d, t, 2, 2, result=res)
    with pytest.raises(ValueError, match="`drafts`"):
        v.conditional(((0, 1),))
    with pytest.raises(ValueError, match="`drafts`"):
        v.conditional(((0, 1), (0, 5)))
    with pytest.raises(TypeError, match="`bonus`"):
        v.output_law(bonus=1)
    with pytest.raises(ValueError, match="`schemes`"):
        compare_schemes(d, t, 2, 2, schemes=["nope"])
    with pytest.raises(TypeError, match="`check`"):
        compare_schemes(d, t, 2, 2, check="yes")
    assert set(SCHEMES) >= {"optimum", "bound", "token"}


def _pattern_lp(d, t, L, k):
    """The one-token optimum as an LP over acceptance patterns only (the lemma of the theory page)."""
    import itertools

    from otspec.models import conditional_tables
    from otspec.otm import set_weights
    from otspec.otm._highs import solve_lp

    V = d.vocab_size
    PL = joint_law(d, L).ravel()
    keys, w = set_weights(PL / PL.sum(), k)
    cb = conditional_tables(t, L, name="target")
    prefixes = [u for s in range(L + 1) for u in itertools.product(range(V), repeat=s)]
    cols = []  # (key index, prefix)
    for a, key in enumerate(keys):
        blocks = [tuple(int(x) for x in np.unravel_index(b, (V,) * L)) for b in key]
        cols += [(a, u) for u in sorted({b[:s] for b in blocks for s in range(L + 1)})]
    cons = [(u, z) for u in prefixes if len(u) < L for z in range(V)]
    A = np.zeros((len(keys) + len(cons), len(cols)))
    for j, (a, u) in enumerate(cols):
        A[a, j] = 1.0
        for r, (v, z) in enumerate(cons):
            if u[: len(v) + 1] == v + (z,):
                A[len(keys) + r, j] += 1.0
            if u[: len(v)] == v:
                A[len(keys) + r, j] -= cb[len(v)][v][z] if v else cb[0][z]
    starts = [0]
    index, values = [], []
    for j in range(len(cols)):
        nz = np.flatnonzero(A[:, j])
        index += nz.tolist()
        values += A[nz, j].tolist()
        starts.append(len(index))
    sol = solve_lp(np.array([float(len(u)) for _, u in cols]), np.array(starts), np.array(index),
                   np.array(values), np.full(A.shape[0], -np.inf), np.concatenate([w, np.zeros(len(cons))]))
    assert sol.success, sol.message
    return sol.objective


@pytest.mark.parametrize("V,L,k,seed", [(2, 2, 2, 0), (2, 3, 2, 1), (3, 2, 2, 2), (2, 2, 3, 3)])
def test_one_token_two_formulations(V, L, k, seed):
    """LP over emitted strings (one_token_optimum) = LP over acceptance patterns (independent build)."""
    d, t = _pair(V, seed, c=0.6)
    np.testing.assert_allclose(one_token_optimum(d, t, L, k).value, _pattern_lp(d, t, L, k), atol=TOL, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("V,L,k,gap", [(3, 3, 3, 0.00838273240442211), (2, 4, 4, 0.10955740716816553)])
def test_largest_sizes(V, L, k, gap):
    """The sizes the symmetrised LP is built for (3-4 s each on one core), with their gaps B - OPT."""
    d, t = random_markov_model(V, 1, rng=1), random_markov_model(V, 1, rng=2)
    res = multidraft_ot(d, t, L, k)
    assert res.success
    np.testing.assert_allclose(res.gap, gap, atol=1e-8, rtol=0)
    np.testing.assert_allclose(res.plan.sum(axis=0), res.target_law, atol=1e-15, rtol=0)
