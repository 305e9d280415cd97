"""Property tests for the multi-draft exact functions that were only checked on hand-picked examples (CQ campaign).

Every quantity is compared with an independent route on the SAME float64 inputs:

* brute force in rationals (:class:`fractions.Fraction` of every float64 input): the law of the drafted set by
  enumeration of all ``n**k`` i.i.d. tuples (or all ordered distinct tuples without replacement), and the optimal
  acceptance as the min-cut ``min over ALL 2**n subsets A of 1 + q(A) - P(S inside A)`` (max-flow min-cut, no
  prefix structure assumed);
* the LP written from its definition over ordered draft tuples and solved by scipy's ``linprog`` (not the
  package's LP builders, which work over drafted sets);
* closed forms: Sun et al. (arXiv:2403.10444) Theorem 1 for one draft block, the one-step rule of the published
  version of arXiv:2403.10444 in rationals, ``sum min(p, q / rho)`` for SpecTr's beta;
* invariants: losslessness (the output law is exactly the target's, by enumeration of the drafts), acceptance at
  most the optimum, monotone in ``k``, unchanged under a relabelling of the vocabulary.

Samplers (:func:`iid_drafts`, :func:`spectr_step`, :func:`draft_selection`) are tested by Pearson's chi-square
(:func:`otspec.testing.chi2_gof`) against an exact law: each chi-square test fails spuriously with probability
``ALPHA_FAIL = 1e-4``; the default run makes at most 50 of them and the slow tests 24 more (below 5e-3 and 2.4e-3
in all for random seeds), and the seeds are fixed (hypothesis derandomized, ``rng`` seeded), so a run is
reproducible.

Error bounds: a float64 sum or product of ``m`` terms in ``[0, 1]`` is within ``m * eps`` of its exact value
(``eps = 2**-52``); LP optima are compared within the package's LP re-check tolerance ``1e-9``.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from otspec.block import expected_length, multidraft_exact, multidraft_ot, one_token_optimum, ot_optimum
from otspec.lossy import ensemble_verifier, lenient_verifier
from otspec.models import MarkovModel, MemorylessModel, conditional_tables, joint_from_tables
from otspec.multidraft import greedy_draft_verifier, khisti_verifier, kseq_beta, without_replacement_verifier
from otspec.otm import min_cut_without_replacement, set_weights, wor_lp
from otspec.spectr import (
    VERIFIER_NAMES,
    block_efficiency,
    draft_selection,
    iid_drafts,
    length_law,
    resolve_verifier,
    spectr_step,
)
from otspec.testing import chi2_gof
from tests.test_fuzz_cj import _exact_onestep_law  # the one-step rule in rationals
from tests.test_properties_cm import EPS, law_pairs, laws

TINY = 2.2250738585072014e-308  # the smallest normal double: validation reads subnormal masses as 0
ALPHA_FAIL = 1e-4
LP_TOL = 1e-9  # the package's LP re-check tolerance (otspec.otm._highs)

# ----------------------------------------------------------------------------- references


def _flush(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return np.where(x < TINY, 0.0, x)


def _rat(x) -> list[Fraction]:
    """The float64 law as exact rationals, rescaled to sum to 1 exactly (the floats sum to 1 within ``n eps``)."""
    F = [Fraction(float(v)) for v in x]
    s = sum(F)
    return [f / s for f in F]


def _iid_tuples(P, k: int) -> dict:
    """``P(X = x)`` of every tuple of ``k`` i.i.d. draws on ``supp P`` (rationals)."""
    support = [i for i, v in enumerate(P) if v > 0]
    return {x: math.prod((P[i] for i in x), start=Fraction(1)) for x in itertools.product(support, repeat=k)}


def _wor_tuples(P, k: int) -> dict:
    """``P(X = x)`` of every ordered distinct ``k``-tuple drawn without replacement: ``p`` renormalised over the
    tokens not yet drawn at each draw (rationals)."""
    support = [i for i, v in enumerate(P) if v > 0]
    out = {}
    for x in itertools.permutations(support, k):
        w, rest = Fraction(1), sum(P)
        for t in x:
            w *= P[t] / rest
            rest -= P[t]
        out[x] = w
    return out


def _set_law(tuples: dict) -> dict:
    """The law of the drafted set ``S(X)`` (sorted tuples) from a tuple law."""
    out: dict = {}
    for x, w in tuples.items():
        key = tuple(sorted(set(x)))
        out[key] = out.get(key, Fraction(0)) + w
    return out


def _brute_cut(tuples: dict, Q, n: int) -> Fraction:
    """``min over all 2**n subsets A of 1 + Q(A) - P(S(X) inside A)``: the optimal acceptance (max-flow min-cut)."""
    best = Fraction(1)
    for mask in range(1 << n):
        inside = {i for i in range(n) if mask >> i & 1}
        val = 1 + sum((Q[i] for i in inside), Fraction(0)) - sum(
            (w for x, w in tuples.items() if set(x) <= inside), Fraction(0))
        best = min(best, val)
    return best


def _tuple_lp(tuples: dict, q: np.ndarray, reward) -> float:
    r"""``max sum pi(x, y) reward(x, y)`` over couplings of the tuple law and ``q``, built from the definition over
    ordered tuples and solved by scipy's ``linprog`` (equality marginals)."""
    keys = list(tuples)
    m, n = len(keys), q.shape[0]
    c = -np.array([float(reward(x, y)) for x in keys for y in range(n)])
    A = np.zeros((m + n, m * n))
    for a in range(m):
        A[a, a * n : (a + 1) * n] = 1.0
        A[m + np.arange(n), a * n + np.arange(n)] = 1.0
    b = np.concatenate([[float(tuples[x]) for x in keys], q / q.sum()])
    b[:m] /= b[:m].sum()
    # HiGHS's tightest feasibility tolerances: at its defaults (1e-7) the optimum was off by 2.5e-9 on a q within
    # 1e-8 of p (the marginals are met only to the tolerance, so the value moves by about as much)
    res = linprog(c, A_eq=A, b_eq=b, bounds=(0, None), method="highs",
                  options={"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10})
    assert res.status == 0, res.message
    return -float(res.fun)


def _member(x, y) -> int:
    return int(y in x)


def _permute(p, q, data):
    perm = np.array(data.draw(st.permutations(range(len(p)))))
    return p[perm], q[perm]


# ----------------------------------------------------------------------------- strategies


@st.composite
def dyadic_laws(draw, n: int, bits: int = 4):
    """A law on ``n`` tokens with every mass a multiple of ``2**-bits`` summing to 1 exactly (zeros, ties and point
    masses come often): its rationals are the floats themselves, so exact identities hold with ``==``."""
    total = 1 << bits
    cuts = sorted(draw(st.lists(st.integers(0, total), min_size=n - 1, max_size=n - 1)))
    parts = np.diff([0, *cuts, total])
    return parts / total


@st.composite
def markov_pairs(draw, max_v: int = 3, *, dyadic: bool = False):
    """A first-order Markov draft and target on one vocabulary, each with a drawn law of its first token; one draw
    in four has the target equal to the draft."""
    V = draw(st.integers(1, max_v))
    law = (lambda: dyadic_laws(V)) if dyadic else (lambda: laws(V).map(_flush).map(lambda x: x / x.sum()))

    def model():
        return MarkovModel(np.stack([draw(law()) for _ in range(V)]), initial=[draw(law())])

    s = model()
    b = s if draw(st.integers(0, 3)) == 0 else model()
    return s, b


def _joint(model, L: int):
    return joint_from_tables(conditional_tables(model, L, name="m")).ravel()


def _rat_joint(model, L: int, prefix: tuple = ()) -> list[Fraction]:
    """The law of the next ``L`` tokens after ``prefix`` in rationals (lexicographic order), from the model's float
    conditionals read exactly."""
    V = model.vocab_size
    out = []
    for seq in itertools.product(range(V), repeat=L):
        w = Fraction(1)
        for i in range(L):
            w *= Fraction(float(model.next_dist(prefix + seq[:i])[seq[i]]))
            if w == 0:
                break
        out.append(w)
    return out


def _lcp(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


# ----------------------------------------------------------------------------- set_weights


@settings(max_examples=40, deadline=None)
@given(p=st.integers(1, 5).flatmap(laws), k=st.integers(1, 3))
def test_set_weights_is_the_enumerated_law_of_the_drafted_set(p, k):
    p = _flush(p)
    sets, w = set_weights(p, k)
    n = len(p)
    ref = _set_law(_iid_tuples(_rat(p), k))
    assert len(set(sets)) == len(sets) and all(s == tuple(sorted(set(s))) for s in sets)
    assert set(sets) <= set(ref)  # no set outside supp(p)**k
    assert np.all(w >= 0.0) and abs(math.fsum(w.tolist()) - 1.0) <= 8 * (n**k + k) * EPS
    got = dict(zip(sets, w.tolist()))
    # each weight: at most n**k products of k factors (and a multinomial coefficient), relative error <= (n**k + k) eps
    for key, v in ref.items():
        assert abs(got.get(key, 0.0) - float(v)) <= 8 * (n**k + k) * EPS * float(v) + 1e-300, key


# ----------------------------------------------------------------------------- kseq_beta


_RHO = st.one_of(st.floats(min_value=1e-3, max_value=1e3), st.sampled_from([1.0, 2.0, 3.0, 1.5, 1.0 + 2**-52]))


@given(pq=law_pairs(min_n=1, max_n=6, near=True), rhos=st.lists(_RHO, min_size=1, max_size=4))
def test_kseq_beta_is_the_sum_of_minima_and_monotone(pq, rhos):
    p, q = (_flush(x) for x in pq)
    n = len(p)
    rhos = sorted(rhos)
    got = kseq_beta(p, q, np.array(rhos))
    assert got.shape == (len(rhos),)
    for r, b in zip(rhos, got.tolist()):
        # SpecTr (arXiv:2310.15141) eq. (6): beta(rho) = sum_x min(p(x), q(x) / rho), in rationals
        exact = sum(min(Fraction(float(a)), Fraction(float(c)) / Fraction(r)) for a, c in zip(p, q))
        assert abs(b - float(exact)) <= 4 * n * EPS * float(exact) + 1e-300
        assert b == kseq_beta(p, q, r)  # the scalar route: the same floats
        assert 0.0 <= b <= 1.0 + 4 * n * EPS
    # each term min(p, q / rho) is non-increasing in rho (a correctly rounded division is monotone), and so is their
    # sum in one order: exactly, no slack
    assert np.all(np.diff(got) <= 0.0)
    # rho = 1: the maximal coupling's overlap sum min(p, q)
    assert abs(kseq_beta(p, q, 1.0) - float(sum(min(Fraction(float(a)), Fraction(float(c))) for a, c in zip(p, q)))) \
        <= 4 * n * EPS


# ----------------------------------------------------------------------------- Khisti et al.'s verifier


@settings(max_examples=30, deadline=None)
@given(pq=law_pairs(min_n=1, max_n=6, near=True), k=st.integers(1, 3), data=st.data())
def test_khisti_verifier_is_lossless_and_optimal(pq, k, data):
    """Khisti et al. (arXiv:2410.18234), canonical decomposition with the optimal selection: by enumeration of the
    ``n**k`` draft tuples the output law is ``q`` and ``P(Y in S(X))`` lies between the decomposition's acceptance
    ``sum min(z, q)`` and alpha_k (the brute-force min-cut), and the acceptance is alpha_k to the LP tolerance."""
    p, q = (_flush(x) for x in pq)
    n = len(p)
    v = khisti_verifier(p, q, k)
    tuples = _iid_tuples(_rat(p), k)
    out, inside = np.zeros(n), 0.0
    for x, w in tuples.items():
        row = v.conditional(x)
        assert np.all(row >= 0.0) and abs(row.sum() - 1.0) <= 4 * n * EPS, (x, row)
        out += float(w) * row
        inside += float(w) * row[list(set(x))].sum()
    # lossless to rounding whatever the LP's accuracy (min(z, q) + (q - z)_+ = q): n**k terms of a few eps each
    bound = 16 * (n**k + n) * EPS
    np.testing.assert_allclose(out, q / q.sum(), rtol=0, atol=bound)
    alpha = float(_brute_cut(tuples, _rat(q), n))
    z = v.selection_law
    assert np.all(z >= 0.0) and abs(z.sum() - 1.0) <= 4 * (n**k + n) * EPS
    assert np.all(z[p == 0.0] == 0.0)  # only drafted tokens are selected
    acc = v.acceptance()
    assert acc <= inside + bound and inside <= alpha + bound  # no lossless verifier beats alpha_k
    assert abs(acc - alpha) <= LP_TOL  # and this one attains it
    if k < 3:  # one more draft never hurts
        assert khisti_verifier(p, q, k + 1).acceptance() >= acc - LP_TOL
    # a relabelled vocabulary: the selection LP is solved in a label-free order, so the same acceptance
    pp, qq = _permute(p, q, data)
    assert abs(khisti_verifier(pp, qq, k).acceptance() - acc) <= 8 * n * EPS


# ----------------------------------------------------------------------------- without replacement


@settings(max_examples=30, deadline=None)
@given(pq=law_pairs(min_n=1, max_n=6, near=True), data=st.data())
def test_without_replacement_verifier_is_lossless_and_optimal(pq, data):
    p, q = (_flush(x) for x in pq)
    n = len(p)
    support = int(np.count_nonzero(p))
    k = data.draw(st.integers(1, min(3, support)))
    v = without_replacement_verifier(p, q, k)
    tuples = _wor_tuples(_rat(p), k)
    out, inside = np.zeros(n), 0.0
    for x, w in tuples.items():
        assert abs(v.draft_law_of(x) - float(w)) <= 8 * k * n * EPS * float(w) + 1e-300
        row = v.conditional(x)
        assert np.all(row >= 0.0) and abs(row.sum() - 1.0) <= 4 * n * EPS
        out += float(w) * row
        inside += float(w) * row[list(x)].sum()
    assert v.draft_law_of((0,) * k) == (0.0 if k > 1 else v.draft_law_of((0,)))  # a repeat: probability 0
    # Hu et al. (arXiv:2502.18779): alpha_k without replacement = the min-cut over all subsets, in rationals
    alpha = float(_brute_cut(tuples, _rat(q), n))
    assert abs(v.alpha - alpha) <= 1e-13 + 4 * n * EPS  # the exact route's documented bound
    # the plan is repaired to exact feasibility: lossless to rounding
    np.testing.assert_allclose(out, q / q.sum(), rtol=0, atol=16 * (math.perm(n, k) + n) * EPS)
    assert abs(inside - v.acceptance()) <= 16 * (math.perm(n, k) + n) * EPS
    assert v.acceptance() <= alpha + 1e-13 + 4 * n * EPS and abs(v.acceptance() - alpha) <= LP_TOL


@settings(max_examples=40, deadline=None)
@given(pq=law_pairs(min_n=1, max_n=6, near=True), data=st.data())
def test_min_cut_and_wor_lp_match_the_brute_force_cut(pq, data):
    """The min-cut's set is a minimiser among ALL subsets (not only prefixes), its value is the brute-force optimum,
    the LP over ordered tuples (wor_lp, and scipy's linprog built here) agrees, and more drafts never hurt."""
    p, q = (_flush(x) for x in pq)
    n = len(p)
    support = int(np.count_nonzero(p))
    P, Q = _rat(p), _rat(q)
    prev = -1.0
    for k in range(1, min(3, support) + 1):
        tuples = _wor_tuples(P, k)
        exact = _brute_cut(tuples, Q, n)
        bound = 1e-13 + 4 * n * EPS  # the race integral's documented error
        cut = min_cut_without_replacement(p, q, k)
        assert cut.k == k and cut.size == len(cut.omega0)
        assert abs(cut.alpha - float(exact)) <= bound
        inside = set(cut.omega0.tolist())
        at_cut = 1 + sum((Q[i] for i in inside), Fraction(0)) - sum(
            (w for x, w in tuples.items() if set(x) <= inside), Fraction(0))
        assert float(at_cut) <= float(exact) + bound  # omega0 is a minimiser
        assert sorted(cut.order[: cut.size].tolist()) == cut.omega0.tolist()  # a prefix of the ratio order
        assert abs(cut.p_mass - float(sum((P[i] for i in inside), Fraction(0)))) <= 4 * n * EPS
        assert abs(cut.q_mass - float(sum((Q[i] for i in inside), Fraction(0)))) <= 4 * n * EPS
        if k == 1:  # the maximal coupling's overlap sum min(p, q)
            assert abs(cut.alpha - float(sum(min(a, b) for a, b in zip(P, Q)))) <= bound
        assert abs(wor_lp(p, q, k) - float(exact)) <= LP_TOL
        assert abs(_tuple_lp(tuples, q, _member) - float(exact)) <= LP_TOL
        assert cut.alpha >= prev - bound
        prev = cut.alpha
    pp, qq = _permute(p, q, data)
    k = data.draw(st.integers(1, min(3, support)))
    assert abs(min_cut_without_replacement(pp, qq, k).alpha - min_cut_without_replacement(p, q, k).alpha) <= \
        2e-13 + 8 * n * EPS


# ----------------------------------------------------------------------------- one draft block: block OT


def _relabel(model: MarkovModel, perm: np.ndarray) -> MarkovModel:
    """The same Markov model with token ``i`` renamed ``perm[i]`` (its laws permuted on every axis)."""
    inv = np.argsort(perm)
    T = model.transition[np.ix_(inv, inv)]
    return MarkovModel(T, initial=[model.initial[0][inv]])


@settings(max_examples=25, deadline=None)
@given(models=markov_pairs(max_v=3), L=st.integers(1, 2), data=st.data())
def test_ot_optimum_is_theorem_1_with_a_feasible_plan(models, L, data):
    """Sun et al. (arXiv:2403.10444) eq. (3) solved by HiGHS against Theorem 1's closed form
    ``sum_ell sum_{x^ell} min(P_ell, Q_ell)`` in rationals; the plan is a coupling whose value is the optimum."""
    s, b = models
    res = ot_optimum(s, b, L, raise_on_failure=True)
    V = s.vocab_size
    exact = sum(sum(min(x, y) for x, y in zip(_rat_joint(s, ell), _rat_joint(b, ell))) for ell in range(1, L + 1))
    assert abs(res.value - float(exact)) <= LP_TOL
    assert 0.0 <= res.value <= L + LP_TOL
    plan = res.plan
    assert plan.shape == (V**L, V**L) and np.all(plan >= -LP_TOL)
    np.testing.assert_allclose(plan.sum(axis=1), _joint(s, L), rtol=0, atol=LP_TOL)
    np.testing.assert_allclose(plan.sum(axis=0), _joint(b, L), rtol=0, atol=LP_TOL)
    blocks = list(itertools.product(range(V), repeat=L))
    lcp = np.array([[_lcp(x, y) for y in blocks] for x in blocks], dtype=np.float64)
    assert abs(float((plan * lcp).sum()) - res.value) <= LP_TOL
    perm = np.array(data.draw(st.permutations(range(V))))
    assert abs(ot_optimum(_relabel(s, perm), _relabel(b, perm), L).value - res.value) <= LP_TOL


# ----------------------------------------------------------------------------- k draft blocks: OPT, B and one token


def _alpha_all_subsets(P, Q, k: int) -> Fraction:
    """``alpha_k(P, Q) = min over ALL subsets A of 1 + Q(A) - P(A)**k`` (k i.i.d. drafts all inside A), rationals."""
    n = len(P)
    return min(1 + sum((Q[i] for i in range(n) if m >> i & 1), Fraction(0))
               - sum((P[i] for i in range(n) if m >> i & 1), Fraction(0)) ** k for m in range(1 << n))


def _block_tuple_lp(s, b, L: int, k: int) -> float:
    """OPT by scipy's linprog over ordered ``k``-tuples of draft blocks (reward: the longest common prefix of the
    target block with any draft), from the definition."""
    V = s.vocab_size
    blocks = list(itertools.product(range(V), repeat=L))
    tuples = _iid_tuples(_rat_joint(s, L), k)
    return _tuple_lp(tuples, _joint(b, L), lambda x, y: max(_lcp(blocks[i], blocks[y]) for i in x))


def _check_multidraft_exact(s, b, L: int, k: int) -> None:
    ex = multidraft_exact(s, b, L, k)
    levels = [_alpha_all_subsets(_rat_joint(s, ell), _rat_joint(b, ell), k) for ell in range(1, L + 1)]
    assert ex.level_alphas == tuple(levels) and ex.bound == sum(levels)  # dyadic laws: exact identities
    assert ex.gap_proved == (ex.upper < ex.bound)
    ref = _block_tuple_lp(s, b, L, k)
    assert float(ex.upper) >= ref - LP_TOL  # weak duality, whatever the rounding of the duals
    if ex.opt is None:
        return
    assert ex.opt <= ex.bound and ex.opt <= ex.upper and ex.gap == ex.bound - ex.opt
    assert abs(float(ex.opt) - ref) <= LP_TOL
    # k drafts do at least as well as one (ignore the others): Theorem 1's sum of overlaps, exactly
    one = sum(sum(min(x, y) for x, y in zip(_rat_joint(s, ell), _rat_joint(b, ell))) for ell in range(1, L + 1))
    assert one <= ex.opt <= L
    if k == 1 or L == 1:  # Sun et al. (arXiv:2403.10444) Theorem 1; OTM-k at one level
        assert ex.opt == ex.bound


_MD_SIZES = st.sampled_from([(1, 2), (1, 3), (2, 1), (2, 2), (2, 3)])  # (L, k) with V <= 2; V = 3 below


# found by the slow twin below (hypothesis): sympy's exact simplex on the equality form of the transport LP raised
# InfeasibleLPError ("Oscillating system led to invalid solution") on this degenerate pair (zero-mass target blocks);
# the LP is now solved in its partial form (<= marginals), whose optimum is the same (rewards >= 0)
_OSCILLATING = (
    MarkovModel(np.array([[0.0, 0.0, 1.0], [0.125, 0.75, 0.125], [0.0, 0.0, 1.0]]), initial=[np.array([0.0, 0.75, 0.25])]),
    MarkovModel(np.array([[0.0, 0.0, 1.0], [0.0, 0.75, 0.25], [0.0, 0.0, 1.0]]), initial=[np.array([0.125, 0.125, 0.75])]),
)


@settings(max_examples=6, deadline=None)
@given(models=markov_pairs(max_v=2, dyadic=True), size=_MD_SIZES)
@example(models=_OSCILLATING, size=(2, 1))
def test_multidraft_exact_against_the_tuple_lp_and_subset_cuts(models, size):
    _check_multidraft_exact(*models, *size)


@pytest.mark.parametrize(("p", "q", "L", "k"), [([1 / 3] * 3, [0.1, 0.2, 0.7], 1, 2), ([0.1, 0.9], [0.3, 0.7], 2, 2),
                                                 ([1 / 3] * 3, [0.6, 0.3, 0.1], 2, 1)])
def test_multidraft_exact_on_laws_that_are_not_dyadic(p, q, L, k):
    """Floats such as 1/3 read as rationals do not sum to 1 exactly, so the two marginals' totals differ by an ulp:
    the exact LP is still solved (partial form), within the LP tolerance of the tuple LP."""
    s, b = MemorylessModel(p), MemorylessModel(q)
    ex = multidraft_exact(s, b, L, k)
    assert ex.opt is not None and ex.opt <= ex.upper
    assert abs(float(ex.opt) - _block_tuple_lp(s, b, L, k)) <= LP_TOL


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(models=markov_pairs(max_v=3, dyadic=True), size=_MD_SIZES)
def test_multidraft_exact_against_the_tuple_lp_and_subset_cuts_slow(models, size):
    _check_multidraft_exact(*models, *size)


def _onestep_length(s, b, L: int) -> Fraction:
    """E[tau] of one-step block verification (published version of arXiv:2403.10444): the rule along every block
    in rationals, weighted by the block's law."""
    V = s.vocab_size
    total = Fraction(0)
    for block, w in zip(itertools.product(range(V), repeat=L), _rat_joint(s, L)):
        if w == 0:
            continue
        cs = [s.next_dist(block[:i]) for i in range(L)]
        cb = [b.next_dist(block[:i]) for i in range(L)]
        law = _exact_onestep_law(block, cs, cb)[0]
        total += w * sum(t * v for t, v in enumerate(law))
    return total


@settings(max_examples=20, deadline=None)
@given(models=markov_pairs(max_v=3), L=st.integers(1, 2), data=st.data())
def test_one_token_optimum_bounds_and_the_one_step_rule(models, L, data):
    s, b = models
    V = s.vocab_size
    vals = []
    for k in (1, 2):
        res = one_token_optimum(s, b, L, k)
        assert res.success and 0.0 <= res.value <= L + LP_TOL
        vals.append(res.value)
        # the class holds SpecTr over sequences with the optimal token rule per depth (efficiency counts the bonus)
        assert res.value >= block_efficiency(s, b, k, L, verifier="optimal") - 1.0 - LP_TOL
        # ... and is held by every lossless verifier of k blocks: at most OPT
        assert res.value <= multidraft_ot(s, b, L, k, raise_on_failure=True).value + LP_TOL
    assert vals[1] >= vals[0] - LP_TOL  # a second draft block never hurts
    # k = 1: the one-step rule is the optimum of the class (Sun et al., published version of arXiv:2403.10444)
    assert abs(vals[0] - float(_onestep_length(s, b, L))) <= LP_TOL
    assert vals[0] >= expected_length(s, b, L, "token") - LP_TOL
    perm = np.array(data.draw(st.permutations(range(V))))
    assert abs(one_token_optimum(_relabel(s, perm), _relabel(b, perm), L, 2).value - vals[1]) <= LP_TOL


# ----------------------------------------------------------------------------- SpecTr's samplers


def _index(tokens, V: int) -> int:
    """Lexicographic index of a token sequence (base ``V``)."""
    i = 0
    for t in tokens:
        i = i * V + int(t)
    return i


def _complete(model, prefix: tuple, out: tuple, L: int, gen) -> tuple:
    """``out`` continued by ``model`` to ``L`` tokens (exact draws from its conditionals)."""
    while len(out) < L:
        law = model.next_dist(prefix + out)
        out = out + (int(gen.choice(law.shape[0], p=law / law.sum())),)
    return out


_PREFIX = st.sampled_from([(), (0,), (1,)])


@settings(max_examples=4, deadline=None)
@given(models=markov_pairs(max_v=3), K=st.integers(1, 2), L=st.integers(1, 2), prefix=_PREFIX,
       seed=st.integers(0, 2**32 - 1))
def test_iid_drafts_follow_the_product_law(models, K, L, prefix, seed):
    """SpecTr (arXiv:2310.15141) eq. (7): the K sequences are i.i.d. from the draft model after the prefix; the
    (K * L) drafted tokens by chi-square against the product of the sequences' exact laws (rationals)."""
    s, _ = models
    V = s.vocab_size
    prefix = tuple(t for t in prefix if t < V)
    seq = [float(w) for w in _rat_joint(s, L, prefix)]
    law = np.array([math.prod(seq[i] for i in idx) for idx in itertools.product(range(V**L), repeat=K)])
    gen = np.random.default_rng(seed)
    N = 2000
    counts = np.zeros(law.shape[0], dtype=np.int64)
    for _ in range(N):
        ds = iid_drafts(s, K, L, prefix=prefix, rng=gen)
        assert ds.K == K and ds.L == L and ds.branching == (K,) + (1,) * (L - 1)
        counts[_index(ds.tokens.ravel(), V)] += 1
    assert chi2_gof(counts, law, alpha_fail=ALPHA_FAIL).passed  # a zero-probability cell drawn fails outright


def _selection_law(s, b, drafts, factory, prefix: tuple) -> dict:
    """The exact law of DraftSelection's output (SpecTr, arXiv:2310.15141, Algorithm 3) given i.i.d. draft
    sequences, written here from the algorithm: at depth d the verifier built for the surviving sequences' tokens
    gives the next token by its exact conditional; the survivors are those that drafted it; none left: stop; all L
    depths matched: one bonus token from the target."""
    K, L = len(drafts), len(drafts[0])
    V = s.vocab_size
    out: dict = {}

    def walk(d, alive, decoded, prob):
        ctx = prefix + decoded
        if d == L:
            for y, qy in enumerate(b.next_dist(ctx).tolist()):
                if qy > 0:
                    out[decoded + (y,)] = out.get(decoded + (y,), 0.0) + prob * qy
            return
        x = tuple(drafts[i][d] for i in alive)
        law = factory(s.next_dist(ctx), b.next_dist(ctx), len(x)).conditional(x)
        for y in range(V):
            if law[y] > 0:
                nxt = [i for i in alive if drafts[i][d] == y]
                if nxt:
                    walk(d + 1, nxt, decoded + (y,), prob * law[y])
                else:
                    out[decoded + (y,)] = out.get(decoded + (y,), 0.0) + prob * law[y]

    walk(0, list(range(K)), (), 1.0)
    return out


def _completed(law: dict, b, prefix: tuple, n: int) -> np.ndarray:
    """The law of the decoded tokens completed by the target to ``n`` tokens (lexicographic vector)."""
    V = b.vocab_size
    vec = np.zeros(V**n)
    for o, w in law.items():
        tail = _rat_joint(b, n - len(o), prefix + o) if len(o) < n else [Fraction(1)]
        for j, t in enumerate(tail):
            vec[_index(o, V) * V ** (n - len(o)) + j] += w * float(t)
    return vec


_CHEAP = st.sampled_from(["token", "khisti", "multiround"])


@settings(max_examples=4, deadline=None)
@given(models=markov_pairs(max_v=3), L=st.integers(1, 2), prefix=_PREFIX, verifier=_CHEAP, data=st.data())
def test_draft_selection_is_lossless_and_samples_its_exact_law(models, L, prefix, verifier, data):
    """By enumeration of every draft set, DraftSelection's output completed by the target is the target's law of
    L + 1 tokens (SpecTr Theorem 2); given one draft set, the sampler follows the algorithm's exact law (chi-square)."""
    s, b = models
    V = s.vocab_size
    prefix = tuple(t for t in prefix if t < V)
    K = 1 if verifier == "token" else 2
    factory = resolve_verifier(verifier)
    seq = _rat_joint(s, L, prefix)
    blocks = list(itertools.product(range(V), repeat=L))
    total = np.zeros(V ** (L + 1))
    for idx in itertools.product(range(V**L), repeat=K):
        w = math.prod((seq[i] for i in idx), start=Fraction(1))
        if w > 0:
            total += float(w) * _completed(_selection_law(s, b, [blocks[i] for i in idx], factory, prefix), b,
                                           prefix, L + 1)
    target = np.array([float(t) for t in _rat_joint(b, L + 1, prefix)])
    # the token rules are lossless to rounding: at most V**(K L) draft sets of V**(L + 1) products each
    np.testing.assert_allclose(total, target, rtol=0, atol=64 * V ** (K * L + L + 1) * EPS)
    drafts = [data.draw(st.sampled_from(blocks)) for _ in range(K)]  # any tokens, drafted or not
    law = _selection_law(s, b, drafts, factory, prefix)
    cells = sorted(law)
    gen = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    N = 2000
    pos = {c: i for i, c in enumerate(cells)}
    counts = np.zeros(len(cells) + 1, dtype=np.int64)  # the last cell: outputs of exact probability 0
    for _ in range(N):
        counts[pos.get(draft_selection(s, b, drafts, verifier=factory, prefix=prefix, rng=gen), len(cells))] += 1
    probs = np.array([law[c] for c in cells] + [0.0])
    assert chi2_gof(counts, probs / probs.sum(), alpha_fail=ALPHA_FAIL).passed


def _check_spectr_step(s, b, K, L, verifier, branching, prefix, seed):
    """Two chi-square tests of N iterations: the decoded tokens completed by the target against the target's exact
    law of L + 1 tokens (lossless, SpecTr Theorem 2), and the number decoded against :func:`length_law`."""
    V = s.vocab_size
    factory = resolve_verifier(verifier)
    gen = np.random.default_rng(seed)
    N = 2000
    full = np.zeros(V ** (L + 1), dtype=np.int64)
    lengths = np.zeros(L + 1, dtype=np.int64)
    for _ in range(N):
        out = spectr_step(s, b, K, L, verifier=factory, branching=branching, prefix=prefix, rng=gen)
        assert 1 <= len(out) <= L + 1
        lengths[len(out) - 1] += 1
        full[_index(_complete(b, prefix, out, L + 1, gen), V)] += 1
    target = np.array([float(t) for t in _rat_joint(b, L + 1, prefix)])
    assert chi2_gof(full, target, alpha_fail=ALPHA_FAIL).passed
    exact = length_law(s, b, K, L, verifier=verifier, branching=branching, prefix=prefix)
    assert chi2_gof(lengths, exact, alpha_fail=ALPHA_FAIL).passed


@settings(max_examples=4, deadline=None)
@given(models=markov_pairs(max_v=3), L=st.integers(1, 2), prefix=_PREFIX, verifier=_CHEAP,
       tree=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_spectr_step_is_lossless_with_its_exact_length_law(models, L, prefix, verifier, tree, seed):
    s, b = models
    prefix = tuple(t for t in prefix if t < s.vocab_size)
    K = 1 if verifier == "token" else 2
    branching = (1, 2) if tree and L == 2 and K == 2 else None  # a prefix tree: two children of one first token
    _check_spectr_step(s, b, K, L, verifier, branching, prefix, seed)


@pytest.mark.slow
@settings(max_examples=12, deadline=None)
@given(models=markov_pairs(max_v=3), L=st.integers(1, 2), prefix=_PREFIX,
       verifier=st.sampled_from(["lp", "kseq", "optimal", "khisti", "multiround"]), K=st.integers(2, 3),
       seed=st.integers(0, 2**32 - 1))
def test_spectr_step_is_lossless_with_its_exact_length_law_slow(models, L, prefix, verifier, K, seed):
    prefix = tuple(t for t in prefix if t < models[0].vocab_size)
    _check_spectr_step(*models, K, L, verifier, None, prefix, seed)


# ----------------------------------------------------------------------------- conditional() is the law of sample()
# found by test_draft_selection_is_lossless_and_samples_its_exact_law (a draft of p(x) = 0 = q(x), allowed in a
# draft set handed to draft_selection): the exact conditional of the token, kseq, multiround and optimal verifiers
# (and the lossy ensemble and lenient rules) accepted such a draft with probability 1 -- emitting a token the target
# gives 0 -- while sample() ran the strict coin u p(x) < q(x), which never accepts it. The acceptance of every rule
# now comes from one helper, the coin's probability (otspec._verifier.coin_accept).

_DRAFT_ZERO = (np.array([0.5, 0.0, 0.5]), np.array([0.5, 0.0, 0.5]))  # draft 1: p = q = 0


@settings(max_examples=25, deadline=None)
@given(pq=law_pairs(min_n=2, max_n=3), k=st.integers(1, 2), name=st.sampled_from(VERIFIER_NAMES), data=st.data())
@example(pq=_DRAFT_ZERO, k=1, name="token", data=None)
@example(pq=_DRAFT_ZERO, k=2, name="kseq", data=None)
@example(pq=_DRAFT_ZERO, k=2, name="multiround", data=None)
@example(pq=_DRAFT_ZERO, k=2, name="optimal", data=None)
def test_conditional_is_the_law_of_sample_on_every_draft(pq, k, name, data):
    """On EVERY draft tuple (those of draft probability 0 included) the exact conditional puts no mass where q = 0
    (fails on the former acceptance 1 at p = q = 0) and is the law of sample() (chi-square of one tuple, one with a
    token outside supp(p) when there is one)."""
    p, q = (_flush(x) for x in pq)
    n = len(p)
    k = 1 if name == "token" else k
    v = resolve_verifier(name)(p, q, k)
    tuples = list(itertools.product(range(n), repeat=k))
    for x in tuples:
        row = v.conditional(x)
        assert np.all(row >= 0.0) and abs(row.sum() - 1.0) <= 8 * n * EPS
        assert np.all(row[q == 0.0] == 0.0), (x, row)
    outside = [x for x in tuples if any(p[t] == 0.0 for t in x)]
    x = (outside or tuples)[0 if data is None else data.draw(st.integers(0, len(outside or tuples) - 1))]
    law = v.conditional(x)
    gen = np.random.default_rng(1)
    counts = np.bincount([v.sample(x, rng=gen) for _ in range(2000)], minlength=n)
    assert chi2_gof(counts, law / law.sum(), alpha_fail=ALPHA_FAIL).passed  # any draw where law = 0 fails outright


@pytest.mark.parametrize("build", [lambda p, q: ensemble_verifier(p, q, 0.5), lambda p, q: lenient_verifier(p, q, 0.5)])
def test_lossy_ratio_rules_never_accept_a_draft_the_target_excludes(build):
    p, q = np.array([0.5, 0.0, 0.5]), np.array([0.25, 0.0, 0.75])
    v = build(p, q)
    row = v.conditional((1,))  # a draft of p = q = 0: the strict coin rejects it, the conditional must too
    assert row[1] == 0.0 and abs(row.sum() - 1.0) <= 4 * EPS  # main: row = [0, 1, 0]
    gen = np.random.default_rng(0)
    assert all(v.sample((1,), rng=gen) != 1 for _ in range(200))


def test_greedy_drafts_conditional_is_the_law_of_sample_on_a_draft_it_never_makes():
    # the last draft of p' mass 0 and q mass 0.5: sample's coin u * 0 < 0.5 always accepts it; the exact
    # conditional used to say 0 (the old `last_law[x] > 0` guard), emitting the residual instead
    v = greedy_draft_verifier([0.6, 0.4, 0.0], [0.2, 0.3, 0.5], 2)
    assert v.last_law[2] == 0.0
    rng = np.random.default_rng(0)
    assert {v.sample((0, 2), rng=rng) for _ in range(50)} == {2}
    np.testing.assert_array_equal(v.conditional((0, 2)), [0.0, 0.0, 1.0])
    # and a draft of q mass 0 never drawn by p' is never accepted by either
    w = greedy_draft_verifier([0.6, 0.4, 0.0], [0.5, 0.5, 0.0], 2)
    assert w.conditional((0, 2))[2] == 0.0 and all(w.sample((0, 2), rng=rng) != 2 for _ in range(50))
