"""SpecTr over sequences: draft sets, DraftSelection, exact law and block efficiency.

Independent routes: the decoded-sequence law by enumeration against the
target's joint law (Theorem 2), the K = 1 block efficiency against the block
module's TokenVerify length and against a brute-force sum over prefixes,
memoised recursions against un-memoised ones (a Markov model copied into a
TableModel), the polynomial step law of sequential verifiers against tuple
enumeration, Monte Carlo intervals and the sampler (chi-square) against the
exact values.

Chi-square tests in this file: 4, each with false-failure rate 1e-4 (fixed
seeds), so a spurious failure has probability below 4e-4 (union bound).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import otspec
from otspec import spectr
from otspec.models import (
    MarkovModel,
    MemorylessModel,
    TableModel,
    conditional_tables,
    joint_law,
    random_markov_model,
    random_table_model,
)
from otspec.testing import chi2_gof

ALPHA_FAIL = 1e-4

AVAILABLE = [name for name, attr in [("lp", "otm_lp"), ("kseq", "kseq"), ("multiround", "multiround"),
                                     ("optimal", "optimal_verifier")] if hasattr(otspec, attr)]


def _pairs(V, length, n_pairs, seed):
    out = []
    for i in range(n_pairs):
        c = [0.3, 1.0, 3.0][i % 3]
        out.append((random_table_model(V, length, concentration=c, rng=seed + 2 * i),
                    random_table_model(V, length, concentration=c, rng=seed + 2 * i + 1)))
    return out


class _Tiny:
    """A user model (duck-typed): next distribution depends on the parity of the prefix sum."""

    vocab_size = 3

    def next_dist(self, prefix):
        return np.array([0.6, 0.3, 0.1]) if sum(prefix) % 2 == 0 else np.array([0.1, 0.2, 0.7])


# ----------------------------------------------------------------------------- Theorem 2
@pytest.mark.parametrize("verifier", AVAILABLE)
@pytest.mark.parametrize("K,L,branching", [(1, 1, None), (1, 3, None), (2, 2, None), (3, 3, None),
                                           (2, 3, None), (4, 2, (2, 2)), (2, 3, (1, 2, 1)), (3, 2, (1, 3))])
def test_lossless_by_enumeration(verifier, K, L, branching):
    for draft, target in _pairs(3, L + 1, 3, seed=10 * K + L):
        res = spectr.check_lossless(draft, target, K, L, verifier=verifier, branching=branching)
        assert res.max_error <= 1e-12, (verifier, K, L, branching, res.max_error)
        np.testing.assert_allclose(res.length_law.sum(), 1.0, atol=1e-12)


@pytest.mark.parametrize("verifier", AVAILABLE)
def test_lossless_markov_user_model_and_prefix(verifier):
    d, t = random_markov_model(3, 1, rng=5), random_markov_model(3, 2, concentration=0.5, rng=6)
    for prefix in [(), (2,), (0, 1)]:
        assert spectr.check_lossless(d, t, 3, 2, verifier=verifier, prefix=prefix).max_error <= 1e-12
    assert spectr.check_lossless(_Tiny(), MemorylessModel([0.2, 0.3, 0.5]), 2, 3,
                                 verifier=verifier).max_error <= 1e-12


def test_lossless_edge_models():
    # zeros, disjoint supports, draft == target, point masses
    cases = [
        (MemorylessModel([1.0, 0.0, 0.0]), MemorylessModel([0.0, 0.5, 0.5])),  # disjoint: never accepted
        (MemorylessModel([0.5, 0.5, 0.0]), MemorylessModel([0.2, 0.3, 0.5])),
        (MemorylessModel([0.2, 0.3, 0.5]), MemorylessModel([0.2, 0.3, 0.5])),
        (MemorylessModel([1.0]), MemorylessModel([1.0])),
    ]
    for d, t in cases:
        for verifier in AVAILABLE:
            res = spectr.check_lossless(d, t, 2, 2, verifier=verifier)
            assert res.max_error <= 1e-12
    d, t = cases[0]
    assert spectr.block_efficiency(d, t, 3, 3) == 1.0  # every first token is corrected
    d, t = cases[2]
    assert spectr.block_efficiency(d, t, 3, 3, verifier="kseq") == pytest.approx(4.0, abs=1e-12)


def test_arxiv_theorem2_wording_is_false_conference_wording_holds():
    # One draft, p = (1, 0), q = (1/2, 1/2), L = 1: tau = 1 exactly when Y = 1 (the correction),
    # so P(Y = 1 | tau = 1) = 1, not q(1) = 1/2; the completed law is exactly q x q.
    d, t = MemorylessModel([1.0, 0.0]), MemorylessModel([0.5, 0.5])
    res = spectr.check_lossless(d, t, 1, 1)
    assert res.max_error <= 1e-15
    assert res.max_conditional_error == pytest.approx(0.5, abs=1e-15)
    np.testing.assert_allclose(res.length_law, [0.5, 0.5], atol=1e-15)
    law = spectr.decoded_law(d, t, 1, 1)
    assert law == pytest.approx({(1,): 0.5, (0, 0): 0.25, (0, 1): 0.25}, abs=1e-15)


# ----------------------------------------------------------------------------- block efficiency
def _token_length_bruteforce(draft, target, L):
    """1 + sum_{l<=L} sum_{x^l} prod_i min(M_s, M_b)(x_i | x^{i-1}) (SpecTr / Leviathan), by brute force."""
    V = draft.vocab_size
    total = 1.0
    for ell in range(1, L + 1):
        for x in itertools.product(range(V), repeat=ell):
            w = 1.0
            for i in range(ell):
                w *= min(draft.next_dist(x[:i])[x[i]], target.next_dist(x[:i])[x[i]])
            total += w
    return total


@pytest.mark.parametrize("verifier", AVAILABLE)
def test_K1_equals_token_verification(verifier):
    for L in (1, 2, 4):
        for draft, target in _pairs(3, L + 1, 3, seed=40 + L):
            be = spectr.block_efficiency(draft, target, 1, L, verifier=verifier)
            np.testing.assert_allclose(be, _token_length_bruteforce(draft, target, L), rtol=0, atol=1e-12)
            if hasattr(otspec, "block"):
                ref = otspec.block.expected_length(draft, target, L, verifier="token", include_bonus=True)
                np.testing.assert_allclose(be, ref, rtol=0, atol=1e-12)


def test_block_efficiency_routes_agree():
    draft, target = random_table_model(3, 4, rng=1), random_table_model(3, 4, rng=2)
    for name in AVAILABLE:
        verifier = spectr.resolve_verifier(name)  # one memo for the three routes (each computes its own law)
        for K, br in [(2, None), (4, None), (4, (2, 2, 1)), (4, (1, 2, 2))]:
            be = spectr.block_efficiency(draft, target, K, 3, verifier=verifier, branching=br)
            res = spectr.check_lossless(draft, target, K, 3, verifier=verifier, branching=br)
            law = spectr.decoded_law(draft, target, K, 3, verifier=verifier, branching=br)
            mean = math.fsum(len(s) * w for s, w in law.items())
            np.testing.assert_allclose([res.expected_tokens, mean], be, rtol=0, atol=1e-12)
            assert be >= 1.0 and be <= 4.0


def test_memoised_markov_equals_table_copy():
    # the Markov recursion is memoised by context; a TableModel copy is not: both routes must agree
    L = 4
    d, t = random_markov_model(3, 1, rng=11), random_markov_model(3, 2, rng=12)
    dt, tt = TableModel(conditional_tables(d, L + 1)), TableModel(conditional_tables(t, L + 1))
    for verifier in AVAILABLE:
        for K, br in [(3, None), (4, (2, 1, 2, 1))]:
            a = spectr.length_law(d, t, K, L, verifier=verifier, branching=br)
            b = spectr.length_law(dt, tt, K, L, verifier=verifier, branching=br)
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-13)


def test_iid_is_the_tree_with_branching_K_1_1():
    d, t = random_markov_model(3, 1, rng=3), random_markov_model(3, 1, rng=4)
    for verifier in AVAILABLE:
        a = spectr.block_efficiency(d, t, 3, 3, verifier=verifier)
        b = spectr.block_efficiency(d, t, 3, 3, verifier=verifier, branching=(3, 1, 1))
        assert a == b


def test_first_position_acceptance_is_the_verifiers_acceptance():
    # P(tau >= 2) = P(Y in S(X)) at the first position: alpha_K for the LP plan (and the optimal
    # verifier), KSeq.acceptance() for k-Seq; alpha_K increases with K (SpecTr Lemma 1)
    for d, t in _pairs(3, 3, 4, seed=90):
        p, q = d.next_dist(()), t.next_dist(())
        for K in (1, 2, 3, 5):
            first = {v: 1 - spectr.length_law(d, t, K, 2, verifier=v)[0] for v in AVAILABLE}
            alpha = otspec.alpha_k(p, q, K)
            np.testing.assert_allclose(first["lp"], alpha, rtol=0, atol=1e-9)
            if "optimal" in first:
                np.testing.assert_allclose(first["optimal"], alpha, rtol=0, atol=1e-9)
            if "kseq" in first:
                np.testing.assert_allclose(first["kseq"], otspec.kseq(p, q, K).acceptance(), rtol=0, atol=1e-12)
                assert first["kseq"] <= alpha + 1e-12


@pytest.mark.parametrize("verifier", [v for v in ("lp", "optimal") if v in AVAILABLE])
def test_monotone_in_K_optimal_verifiers(verifier):
    """Block efficiency rises with K on these fixed pairs.

    Not a theorem: the plan is optimal per position, not for the sequence (the number of
    drafts that agree with Y also matters), and a search over 150 random 3-token tables found
    one pair where the LP plan's block efficiency drops from K = 3 to K = 4 (see the guide).
    Only the first-position acceptance is provably monotone (test above).
    """
    for i, (d, t) in enumerate(_pairs(3, 4, 6, seed=70)):
        be = [spectr.block_efficiency(d, t, K, 3, verifier=verifier) for K in (1, 2, 3, 4)]
        assert np.all(np.diff(be) >= -1e-12), (i, be)


def test_sweep_shape_on_markov_pair():
    # the sweep's claims on one small pair: rises with K and L; k-Seq above K = 1; LP above k-Seq
    d, t = random_markov_model(4, 1, concentration=2.0, rng=21), random_markov_model(4, 1, concentration=2.0, rng=22)
    kseq = {(K, L): spectr.block_efficiency(d, t, K, L, verifier="kseq") for K in (1, 2, 4) for L in (2, 4)}
    lp = {(K, L): spectr.block_efficiency(d, t, K, L, verifier="lp") for K in (1, 2, 4) for L in (2, 4)}
    for L in (2, 4):
        assert kseq[1, L] < kseq[2, L] < kseq[4, L]
        assert lp[1, L] == pytest.approx(kseq[1, L], abs=1e-12)
        assert lp[2, L] >= kseq[2, L] - 1e-12 and lp[4, L] >= kseq[4, L] - 1e-12
    for K in (1, 2, 4):
        assert kseq[K, 2] < kseq[K, 4]


def test_sequence_optimal_dp_dominates_every_verifier():
    # the DP optimum over per-position plans: equals token verification at K = 1, is at least every
    # verifier's block efficiency, and is non-decreasing in K (K + 1 drafts can ignore one)
    for d, t in _pairs(3, 4, 4, seed=120) + [(random_table_model(3, 4, rng=118), random_table_model(3, 4, rng=5118))]:
        best = [spectr.optimal_block_efficiency(d, t, K, 3) for K in (1, 2, 3, 4)]
        np.testing.assert_allclose(best[0], _token_length_bruteforce(d, t, 3), rtol=0, atol=1e-9)
        assert np.all(np.diff(best) >= -1e-9), best
        factories = {v: spectr.resolve_verifier(v) for v in AVAILABLE}  # one memo per pair: K = 1..4 share step laws
        for K, b in zip((1, 2, 3, 4), best):
            for v in AVAILABLE:
                assert spectr.block_efficiency(d, t, K, 3, verifier=factories[v]) <= b + 1e-9
    # the last pair (seeds 118 / 5118) is one where the LP plan's block efficiency drops from K = 3 to 4
    # prefix trees too: the DP dominates every verifier on the same tree
    tree = spectr.optimal_block_efficiency(d, t, 4, 3, branching=(2, 2, 1))
    for v in AVAILABLE:
        assert spectr.block_efficiency(d, t, 4, 3, verifier=v, branching=(2, 2, 1)) <= tree + 1e-9
    with pytest.raises(TypeError, match="`cache` must be a dict"):
        spectr.optimal_block_efficiency(d, t, 2, 2, cache=[])


# ----------------------------------------------------------------------------- step law
@pytest.mark.parametrize("name", [v for v in ("kseq", "multiround") if v in AVAILABLE])
def test_polynomial_step_law_equals_tuple_enumeration(name):
    rng = np.random.default_rng(0)
    f = spectr.resolve_verifier(name)
    for t in range(30):
        n, k = int(rng.integers(1, 5)), int(rng.integers(1, 6))
        p, q = rng.dirichlet(np.full(n, 0.5)), rng.dirichlet(np.full(n, 0.5))
        if t % 4 == 0 and n > 1:
            p[0] = 0.0
            p /= p.sum()
        fast, slow = f.step_law(p, q, k), f.step_law(p, q, k, fast=False)
        np.testing.assert_allclose(fast, slow, rtol=0, atol=1e-14)
        np.testing.assert_allclose(fast.sum(axis=1), q, rtol=0, atol=1e-14)


@pytest.mark.parametrize("name", [v for v in ("lp", "optimal") if v in AVAILABLE])
def test_symmetric_step_law_equals_tuple_enumeration(name):
    # the multiset enumeration assumes the conditional depends on the drafts only through their set
    rng = np.random.default_rng(1)
    sym = spectr.resolve_verifier(name)
    tup = spectr.resolve_verifier(name, symmetric=False)
    for _ in range(10):
        n, k = int(rng.integers(2, 5)), int(rng.integers(1, 5))
        p, q = rng.dirichlet(np.ones(n)), rng.dirichlet(np.ones(n))
        np.testing.assert_allclose(sym.step_law(p, q, k), tup.step_law(p, q, k), rtol=0, atol=1e-14)


# ----------------------------------------------------------------------------- samplers
def test_mc_interval_covers_exact_value():
    d, t = random_markov_model(3, 1, rng=31), random_markov_model(3, 1, rng=32)
    for verifier, K, L, br in [("lp", 2, 3, None), ("kseq", 4, 2, (2, 2))]:
        exact = spectr.block_efficiency(d, t, K, L, verifier=verifier, branching=br)
        est = spectr.block_efficiency_mc(d, t, K, L, verifier=verifier, branching=br, n_samples=3000,
                                         confidence=1 - ALPHA_FAIL, rng=7)
        assert est.ci_low < exact < est.ci_high, (exact, est)
        assert est.length_counts.sum() == 3000
        np.testing.assert_allclose(est.mean, np.dot(est.length_counts, np.arange(1, L + 2)) / 3000)


def _chi2_sampler(d, t, K, L, verifier, branching, n, seed):
    law = spectr.decoded_law(d, t, K, L, verifier=verifier, branching=branching)
    seqs = sorted(law)
    index = {s: i for i, s in enumerate(seqs)}
    probs = np.array([law[s] for s in seqs])
    factory = spectr.resolve_verifier(verifier)  # one cache for all draws
    gen = np.random.default_rng(seed)
    counts = np.zeros(len(seqs), dtype=np.int64)
    for _ in range(n):
        counts[index[spectr.spectr_step(d, t, K, L, verifier=factory, branching=branching, rng=gen)]] += 1
    return chi2_gof(counts, probs / probs.sum(), alpha_fail=ALPHA_FAIL)


# ("lp", 3, 2, None) under -m slow: the LP verifier keeps its default chi-square at ("lp", 4, 2, (2, 2)) and the
# unbranched draft sets theirs at ("kseq", 2, 2, None)
@pytest.mark.parametrize("verifier,K,L,branching", [pytest.param("lp", 3, 2, None, marks=pytest.mark.slow),
                                                    ("kseq", 2, 2, None), ("lp", 4, 2, (2, 2)),
                                                    ("multiround", 3, 2, (1, 3))])
def test_decoded_sequence_sampler_chi2(verifier, K, L, branching):
    if verifier not in AVAILABLE:
        pytest.skip(f"{verifier} not available")
    d, t = random_table_model(3, L + 1, rng=51), random_table_model(3, L + 1, rng=52)
    res = _chi2_sampler(d, t, K, L, verifier, branching, 6000, seed=K + 10 * L)
    assert res.passed, res


def test_draft_selection_by_hand():
    # draft == target: every draft token is accepted (k-Seq accepts the first draft with certainty)
    m = MemorylessModel([0.5, 0.25, 0.25])
    out = spectr.draft_selection(m, m, [[1, 2, 0], [2, 2, 2]], verifier="kseq", rng=0)
    assert out[:3] == (1, 2, 0) and len(out) == 4
    # disjoint supports: the first token is always the correction, and no draft survives
    d, t = MemorylessModel([1.0, 0.0]), MemorylessModel([0.0, 1.0])
    assert spectr.draft_selection(d, t, [[0, 0], [0, 0]], rng=1) == (1,)
    # a DraftSet is accepted as is, and a prefix continues the context
    ds = spectr.DraftSet([[0, 1], [0, 0], [1, 1], [1, 0]], branching=(2, 2))
    out = spectr.draft_selection(m, m, ds, verifier="lp", prefix=(2, 2), rng=3)
    assert len(out) == 3 and list(out[:2]) in ds.tokens.tolist()


# ----------------------------------------------------------------------------- draft sets
def test_prefix_tree_structure_and_law():
    d = MarkovModel([[0.7, 0.2, 0.1], [0.1, 0.6, 0.3], [0.3, 0.3, 0.4]])
    ds = spectr.prefix_tree_drafts(d, (2, 3, 1), rng=0)
    assert ds.tokens.shape == (6, 3) and ds.branching == (2, 3, 1)
    assert ds.nodes(0) == 2 and ds.nodes(1) == 6 and ds.nodes(2) == 6
    assert np.all(ds.tokens[:3, 0] == ds.tokens[0, 0]) and np.all(ds.tokens[3:, 0] == ds.tokens[3, 0])
    iid = spectr.iid_drafts(d, 4, 3, rng=1)
    assert iid.branching == (4, 1, 1) and iid.tokens.shape == (4, 3)
    assert not iid.tokens.flags.writeable
    # every i.i.d. draft sequence follows the draft model's joint law (chi-square, 3 tokens)
    gen = np.random.default_rng(2)
    counts = np.zeros(27, dtype=np.int64)
    for _ in range(1500):
        for row in spectr.iid_drafts(d, 4, 3, rng=gen).tokens:
            counts[int(row[0]) * 9 + int(row[1]) * 3 + int(row[2])] += 1
    assert chi2_gof(counts, joint_law(d, 3).ravel(), alpha_fail=ALPHA_FAIL).passed


def test_draft_tokens_never_outside_support():
    d = MemorylessModel([0.0, 1.0, 0.0])
    assert np.all(spectr.prefix_tree_drafts(d, (3, 2), rng=0).tokens == 1)


# ----------------------------------------------------------------------------- bad input
def test_bad_input():
    d, t = MemorylessModel([0.5, 0.5]), MemorylessModel([0.3, 0.7])
    with pytest.raises(ValueError, match="`branching` must multiply to k=4"):
        spectr.block_efficiency(d, t, 4, 2, branching=(2, 3))
    with pytest.raises(ValueError, match="`branching` must have L=3 entries"):
        spectr.block_efficiency(d, t, 4, 3, branching=(2, 2))
    with pytest.raises(ValueError, match="`k` must be an integer >= 1, got 0"):
        spectr.block_efficiency(d, t, 0, 2)
    with pytest.raises(ValueError, match="`L` must be an integer >= 1, got 0"):
        spectr.check_lossless(d, t, 2, 0)
    with pytest.raises(TypeError, match="`k` must be an integer"):
        spectr.spectr_step(d, t, 2.0, 2)
    with pytest.raises(ValueError, match="`branching"):
        spectr.prefix_tree_drafts(d, (2, 0))
    with pytest.raises(ValueError, match="at least one entry"):
        spectr.prefix_tree_drafts(d, ())
    with pytest.raises(ValueError, match="`draft` and `target` must share one vocabulary"):
        spectr.block_efficiency(d, MemorylessModel([0.2, 0.3, 0.5]), 2, 2)
    with pytest.raises(TypeError, match="`draft` must be a model"):
        spectr.block_efficiency(object(), t, 2, 2)
    with pytest.raises(ValueError, match="`verifier` must be one of"):
        spectr.block_efficiency(d, t, 2, 2, verifier="best")
    with pytest.raises(TypeError, match=r"instance, built for one fixed \(p, q\).*otspec\.kseq"):
        spectr.block_efficiency(d, t, 2, 2, verifier=otspec.maximal_coupling([0.5, 0.5], [0.3, 0.7]))
    with pytest.raises(ValueError, match="`prefix` must hold token ids in"):
        spectr.block_efficiency(d, t, 2, 2, prefix=(5,))
    with pytest.raises(ValueError, match="`drafts` must hold token ids in"):
        spectr.draft_selection(d, t, [[0, 3]])
    with pytest.raises(ValueError, match="not the leaves of a prefix tree"):
        spectr.DraftSet([[0, 1], [1, 1]], branching=(1, 2))
    with pytest.raises(ValueError, match="non-empty"):
        spectr.DraftSet(np.zeros((0, 2), dtype=int))
    with pytest.raises(ValueError, match="`n_samples` must be an integer >= 2"):
        spectr.block_efficiency_mc(d, t, 2, 2, n_samples=1)
    with pytest.raises(ValueError, match="`confidence` must lie in"):
        spectr.block_efficiency_mc(d, t, 2, 2, confidence=1.0)


def test_verifier_k_mismatch():
    d, t = MemorylessModel([0.5, 0.5]), MemorylessModel([0.3, 0.7])

    def always_one_draft(p, q, k):
        return otspec.maximal_coupling(p, q)

    with pytest.raises(ValueError, match="returned a verifier for k=1 drafts, but 2 draft tokens"):
        spectr.block_efficiency(d, t, 2, 2, verifier=always_one_draft)
    with pytest.raises(ValueError, match="returned a verifier for k=1 drafts, but 2 draft tokens"):
        spectr.spectr_step(d, t, 2, 2, verifier=always_one_draft, rng=0)
    # fine when exactly one draft is verified at every depth
    assert spectr.check_lossless(d, t, 1, 2, verifier=always_one_draft).max_error <= 1e-15

    def wrong_pair(p, q, k):
        return otspec.otm_lp(q, p, k).verifier

    with pytest.raises(ValueError, match="different \\(p, q\\) pair"):
        spectr.block_efficiency(d, t, 2, 2, verifier=wrong_pair)

    def not_a_verifier(p, q, k):
        return 3

    with pytest.raises(TypeError, match="must build an otspec Verifier"):
        spectr.block_efficiency(d, t, 2, 2, verifier=not_a_verifier)


def test_enumeration_limits():
    d, t = random_markov_model(6, 1, rng=0), random_markov_model(6, 1, rng=1)
    with pytest.raises(ValueError, match="above `max_enum`=100"):
        spectr.block_efficiency(d, t, 4, 2, verifier="lp", max_enum=100)
    # the same size refused for an order-dependent callable, which enumerates ordered tuples (6**4)
    with pytest.raises(ValueError, match="1296 ordered draft tuples"):
        spectr.block_efficiency(d, t, 4, 2, verifier=lambda p, q, k: otspec.otm_lp(p, q, k).verifier,
                                max_enum=1000)
    # k-Seq has a polynomial step law: no enumeration limit applies
    be = spectr.block_efficiency(d, t, 8, 2, verifier="kseq", max_enum=10)
    assert be >= 1 and be <= 3
    with pytest.raises(ValueError, match="above `max_nodes`=10"):
        spectr.block_efficiency(random_table_model(3, 5, rng=0), random_table_model(3, 5, rng=1), 2, 4,
                                max_nodes=10)
    with pytest.raises(ValueError, match="V\\*\\*\\(L\\+1\\) = 6\\*\\*4"):
        spectr.check_lossless(d, t, 2, 3, max_sequences=1000)


def test_inputs_not_mutated_and_results_frozen():
    tokens = np.array([[0, 1], [1, 1]])
    before = tokens.copy()
    ds = spectr.DraftSet(tokens)
    tokens[0, 0] = 1
    assert ds.tokens[0, 0] == 0 and np.array_equal(before[1], ds.tokens[1])
    res = spectr.check_lossless(MemorylessModel([0.5, 0.5]), MemorylessModel([0.3, 0.7]), 2, 2)
    with pytest.raises(AttributeError):
        res.max_error = 0.0


def test_spectr_takes_package_builders_and_registry_entries_like_the_decoder():
    d, t = MemorylessModel([0.5, 0.3, 0.2]), MemorylessModel([0.2, 0.3, 0.5])
    for builder, name in [(otspec.otm_lp, "lp"), (otspec.kseq, "kseq"), (otspec.optimal_verifier, "optimal")]:
        f = spectr.resolve_verifier(builder)
        assert f.name == name and f.sequential == otspec.get_verifier(name).sequential
        np.testing.assert_allclose(spectr.block_efficiency(d, t, 2, 2, verifier=builder),
                                   spectr.block_efficiency(d, t, 2, 2, verifier=name), rtol=0, atol=1e-12)
    assert spectr.resolve_verifier(otspec.get_verifier("multiround")).name == "multiround"
    with pytest.raises(ValueError, match=r"stands for the registered 'mentored', which SpecTr cannot run"):
        spectr.block_efficiency(d, t, 1, 2, verifier=otspec.mentored_verifier)
    with pytest.raises(ValueError, match=r"got 'kseg' \(did you mean 'kseq'\?\)"):
        spectr.block_efficiency(d, t, 2, 2, verifier="kseg")
