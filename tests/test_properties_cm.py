"""Property tests for public quantities that were only checked on hand-picked examples (CM coverage campaign).

Each output law or exact quantity is compared with an independent route on the SAME float64 inputs: exact
rational arithmetic (:class:`fractions.Fraction` of every float64 input), enumeration, the LP (HiGHS through the
package's own LP helpers) or another verifier's closed form. Every law is also checked for the invariants that
hold whatever the rounding: entries ``>= 0`` (never ``-1e-17``), a sum of 1 within a stated bound, acceptance
``<= 1``, monotonicity in ``k`` or ``L`` where theory says so.

The inputs are adversarial: weights exactly 1 (``q(x) = p(x)`` along a block), ``p == q``, point masses,
ties, subnormal entries (``5e-324``), entries ``1 - 2**-53``, vocabularies of 1 and 2, ``k = 1`` and huge.

Error bounds: a float64 sum or product of ``m`` terms in ``[0, 1]`` is within ``m * eps`` of its exact value
(``eps = 2**-52``, every operation's relative error at most ``eps / 2``); the bounds below are that count
times a small factor, stated at each test.
"""

from __future__ import annotations

import math
from fractions import Fraction

import array_api_compat
import numpy as np
import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from otspec import alpha_k, khisti_acceptance_one, khisti_alpha2
from otspec.block import (
    bernoulli_block_length,
    bernoulli_token_length,
    expected_length,
    make_verifier,
    tau_law_on_path,
    theorem2_length,
)
from otspec.closed_form import bernoulli_alpha_k, uniform_alpha_k
from otspec.lossy import kl_divergence
from otspec.models import MarkovModel, MemorylessModel
from otspec.otm import alpha_k_without_replacement, prob_within_without_replacement
from otspec.profile._quantities import block_path_laws
from otspec.profile._quantities_batched import kl_rows
from otspec.spectr import block_efficiency, decoded_law, length_law
from otspec.tree import acceptance_vector, spechub_optimum, spechub_pair_law
from tests.test_fuzz_cj import _exact_onestep_law  # the one-step rule in rationals

EPS = 2.0**-52
ONE_MINUS = 1.0 - 2.0**-53  # the largest double below 1
SUBNORMAL = 5e-324

# ----------------------------------------------------------------------------- strategies


def _normalise(w) -> np.ndarray:
    w = np.asarray(w, dtype=np.float64)
    return w / w.sum()


_RAW = st.one_of(
    st.floats(min_value=0.01, max_value=1.0),
    st.sampled_from([0.0, SUBNORMAL, 1e-300, 1e-17, 0.25, 0.5, 1.0, ONE_MINUS, 3.0]),
)


@st.composite
def laws(draw, n: int):
    """A law on ``n`` tokens: mixed scales with zeros, subnormals and ties, or a structured case."""
    kind = draw(st.sampled_from(["mixed", "mixed", "mixed", "point", "near-point", "uniform"]))
    if kind == "point":
        return np.eye(n)[draw(st.integers(0, n - 1))]
    if kind == "near-point" and n >= 2:
        i, j = draw(st.permutations(range(n)))[:2]
        out = np.zeros(n)
        out[i], out[j] = ONE_MINUS, 2.0**-53  # sums to 1 exactly
        return out
    if kind == "uniform":
        return np.full(n, 1.0 / n)
    w = draw(st.lists(_RAW, min_size=n, max_size=n))
    if not sum(w) > 0:
        w[draw(st.integers(0, n - 1))] = 1.0
    return _normalise(w)


@st.composite
def law_pairs(draw, min_n: int = 1, max_n: int = 4, *, near: bool = False):
    """``(p, q)`` on one vocabulary; one draw in four has ``q == p`` (``near=True``: or ``q`` equal to ``p`` up to
    a relative perturbation of 1e-15 .. 1e-4 on its support, renormalised)."""
    n = draw(st.integers(min_n, max_n))
    p = draw(laws(n))
    kind = draw(st.integers(0, 4 if near else 3))
    if kind == 4:
        scale = draw(st.sampled_from([1e-15, 1e-12, 1e-8, 1e-4]))
        signs = np.array(draw(st.lists(st.sampled_from([-1.0, 1.0]), min_size=n, max_size=n)))
        return p, _normalise(p * (1.0 + scale * signs))
    q = p.copy() if kind == 0 else draw(laws(n))
    return p, q


@st.composite
def block_paths(draw, max_v: int = 4, max_l: int = 4):
    """A block and the draft/target conditionals along it, with weights of exactly 1 in one draw in three
    (``q_i(x_i) = p_i(x_i)`` at the drafted token) and ``q_i == p_i`` rows."""
    V = draw(st.integers(1, max_v))
    L = draw(st.integers(1, max_l))
    cs, cb, block = [], [], []
    for _ in range(L):
        p = draw(laws(V))
        support = np.flatnonzero(p > 0)
        x = int(draw(st.sampled_from(support.tolist())))
        mode = draw(st.sampled_from(["free", "free", "equal-row", "equal-at-x"]))
        if mode == "equal-row":
            q = p.copy()
        else:
            q = draw(laws(V))
            if mode == "equal-at-x" and V >= 2 and p[x] <= 0.5:
                # q(x) = p(x) exactly; the rest of q's mass spread over the other tokens
                rest = np.delete(q, x)
                rest = rest / rest.sum() if rest.sum() > 0 else np.full(V - 1, 1.0 / (V - 1))
                q = np.insert(rest * (1.0 - p[x]), x, p[x])
        cs.append(p)
        cb.append(q)
        block.append(x)
    return tuple(block), cs, cb


def _F(x) -> Fraction:
    return Fraction(float(x))


# ----------------------------------------------------------------------------- exact references


def _exact_tau_law(name: str, block, cs, cb) -> list[Fraction]:
    """``P(tau = t | X^L)`` of a block verifier in rationals, from its definition (Sun et al.,
    arXiv:2403.10444, Algorithms 2 and 3 and the published one-correction-token variant)."""
    L = len(block)
    F = [[_F(v) for v in row] for row in cs]
    G = [[_F(v) for v in row] for row in cb]
    ratio = [G[i][x] / F[i][x] if F[i][x] > 0 else Fraction(1) for i, x in enumerate(block)]
    if name == "token":
        out, alive = [], Fraction(1)
        for i in range(L):
            a = min(Fraction(1), ratio[i])
            out.append(alive * (1 - a))
            alive *= a
        return out + [alive]
    if name == "block":
        w = [Fraction(1)]
        for r in ratio:
            w.append(w[-1] * r)
        out = [Fraction(0)] * (L + 1)
        out[L] = min(Fraction(1), w[L])
        left = 1 - out[L]
        for k in range(L - 1, -1, -1):
            if k == 0:
                r = Fraction(1)
            else:
                remain = sum(max(w[k] * g - f, Fraction(0)) for f, g in zip(F[k], G[k]))
                rej = sum(max(f - w[k] * g, Fraction(0)) for f, g in zip(F[k], G[k]))
                r = min(Fraction(1), remain / rej) if rej > 0 else Fraction(1)
            out[k] = left * r
            left *= 1 - r
        return out
    # block-onestep: the fuzz tests' rational reference (the same definition, every float64 input exactly)
    return _exact_onestep_law(block, cs, cb)[0]


# ----------------------------------------------------------------------------- block verification along a path


# found by this test (hypothesis seed 1): a ratio q/p over a subnormal p overflowed to inf; the block weight
# 1 * 0 * inf was nan and main accepted the whole block surely (P(tau = 3) = 1 where exactly 0, the target giving
# X_2 probability 0); one-step gave nan; token verification warned (RuntimeWarning: overflow)
_SUBNORMAL_PATH = ((0, 0, 0), [np.array([1.0, 0.0]), np.array([0.5, 0.5]), np.array([SUBNORMAL, 1.0])],
                   [np.array([1.0, 0.0]), np.array([0.0, 1.0]), np.array([0.5, 0.5])])
# the block weight w_4 = (5e199)^2 (2e-250)^2 = 1e-100 overflowed on the way (inf): main accepted surely
_HUGE, _TINY = [np.array([1e-200, 1.0]), np.array([0.5, 0.5])], [np.array([0.5, 0.5]), np.array([1e-250, 1.0])]
_OVERFLOW_PATH = ((0, 0, 0, 0), [_HUGE[0], _HUGE[0], _TINY[0], _TINY[0]], [_HUGE[1], _HUGE[1], _TINY[1], _TINY[1]])
# w_4 = (2e-200)^2 (5e299)^2 = 1e200 underflowed on the way (0): main never accepted the whole block
_UNDERFLOW_PATH = ((0, 0, 0, 0), [_TINY[0], _TINY[0], np.array([1e-300, 1.0]), np.array([1e-300, 1.0])],
                   [np.array([1e-200, 1.0]), np.array([1e-200, 1.0]), _HUGE[1], _HUGE[1]])

# the one-step chain p_i = min(1, p_{i-1} r_i) underflowed (4e-600 -> 0) while the block weight stayed normal:
# exactly p_5 = 1 (tau = 5 surely), main p_5 = 0
_H, _T = (np.array([1e-300, 1.0]), np.array([0.5, 0.5])), (np.array([0.5, 0.5]), np.array([1e-300, 1.0]))
_CAPPED_UNDERFLOW_PATH = ((0,) * 5, [s[0] for s in (_H, _T, _T, _H, _H)], [s[1] for s in (_H, _T, _T, _H, _H)])


@pytest.mark.parametrize("name", ["token", "block", "block-onestep"])
@given(path=block_paths())
@example(path=_CAPPED_UNDERFLOW_PATH)
@example(path=_SUBNORMAL_PATH)
@example(path=_OVERFLOW_PATH)
@example(path=_UNDERFLOW_PATH)
def test_tau_law_on_path_is_a_law_and_matches_rationals(name, path):
    block, cs, cb = path
    law = tau_law_on_path(name, block, cs, cb)
    L = len(block)
    assert law.shape == (L + 1,)
    assert np.all(law >= 0.0), law  # never -1e-17
    assert abs(float(law.sum()) - 1.0) <= 4 * (L + 1) * EPS
    exact = _exact_tau_law(name, block, cs, cb)
    assert abs(sum(exact) - 1) == 0  # the reference is a law exactly (telescoping)
    # each entry is a product of at most L + 1 factors in [0, 1], each factor within a few eps of exact
    # (block: the ratio of two sums of V terms, each relative error <= (V + 2) eps, times the weight's L eps)
    V = len(cs[0])
    bound = 8 * (L + 1) * (V + L + 2) * EPS
    np.testing.assert_allclose(law, [float(e) for e in exact], rtol=0, atol=bound)


@pytest.mark.parametrize("name", ["block", "block-onestep"])
@given(path=block_paths(max_l=3))
def test_profile_block_path_laws_match_tau_law_on_path(name, path):
    """The profile's batched laws of every draft length (numpy route) against the per-path route, on paths whose
    weights stay in the normal range (the profile's laws have subnormals flushed to 0; see the module notes)."""
    block, cs, cb = path
    L, V = len(block), len(cs[0])
    assume(all(cs[i][x] >= 1e-150 for i, x in enumerate(block)))  # no product leaves the normal range
    P = np.stack(cs)[None]
    Q = np.stack(cb + [cb[-1]])[None]
    X = np.array([block], dtype=np.int64)
    got = block_path_laws(name, P, Q, X, L)
    for ell in range(1, L + 1):
        row = got[0, ell - 1]
        assert np.all(row >= 0.0), row
        assert np.all(row[ell + 1 :] == 0.0)
        ref = tau_law_on_path(name, block[:ell], cs[:ell], cb[:ell])
        np.testing.assert_allclose(row[: ell + 1], ref, rtol=0, atol=8 * (ell + 1) * (V + ell + 2) * EPS)


# ----------------------------------------------------------------------------- Bernoulli closed forms


def _exact_token_length(p: Fraction, q: Fraction, L: int) -> Fraction:
    a = 1 - abs(p - q)
    return sum(a**i for i in range(1, L + 1))


def _exact_block_length(p: Fraction, q: Fraction, L: int) -> Fraction:
    """Theorem 1 of Sun et al. (arXiv:2403.10444) summed over the number of ones (enumeration of x^i by count)."""
    return sum(
        math.comb(i, j) * min(p**j * (1 - p) ** (i - j), q**j * (1 - q) ** (i - j))
        for i in range(1, L + 1)
        for j in range(i + 1)
    )


_PROB = st.one_of(
    st.floats(min_value=0.0, max_value=1.0),
    st.sampled_from([0.0, 1.0, 0.5, SUBNORMAL, 1e-300, 2.0**-53, ONE_MINUS, 1e-12, 1.0 - 1e-12]),
)


@given(p=_PROB, q=_PROB, L=st.integers(1, 12))
@example(p=0.5, q=0.5, L=3)
@example(p=ONE_MINUS, q=1.0, L=12)
@example(p=0.0, q=1.0, L=1)
@example(p=1.0, q=1e-16, L=1)  # found by this test's monotone twin: main gave 1.11e-16 (1 - fl(1 - 1e-16)) for 1e-16
@example(p=1.0 - 2.0**-40, q=3e-17, L=5)
def test_bernoulli_lengths_match_rationals(p, q, L):
    tok = bernoulli_token_length(p, q, L)
    blk = bernoulli_block_length(p, q, L)
    # the package reads a subnormal probability as 0 (it carries no mass); so does the reference
    pf, qf = (Fraction(0) if v < 2.2250738585072014e-308 else Fraction(v) for v in (p, q))
    et, eb = _exact_token_length(pf, qf, L), _exact_block_length(pf, qf, L)
    # token: closed form a (1 - a^L) / d with expm1/log1p, each a few eps relative; block: binomial CDFs
    # (scipy, within 1e-14 relative of each term) summed by fsum
    assert abs(tok - float(et)) <= 32 * L * EPS * float(et)  # relative: a small overlap keeps its digits
    assert abs(blk - float(eb)) <= 1e-13 * L * max(1.0, float(eb))
    # theory: 0 <= token <= block <= L (block verification is block-OT optimal), bonus adds exactly 1
    assert 0.0 <= tok <= blk + 4 * L * EPS and blk <= L
    assert bernoulli_token_length(p, q, L, include_bonus=True) == tok + 1.0
    assert bernoulli_block_length(p, q, L, include_bonus=True) == blk + 1.0


@given(p=_PROB, q=_PROB, L=st.sampled_from([1, 2, 50, 10**4, 10**9, 10**15]))
@example(p=1.0, q=1e-16, L=1)  # main: token 1.11e-16 > block 1e-16
@example(p=0.0, q=1.0, L=10**4)  # main: ValueError('math domain error') (log(rho) at rho = 0 past 4096 terms)
@example(p=1.0, q=0.0, L=10**15)  # main: refused as needing 1e15 terms for a sum of zeros
def test_bernoulli_lengths_monotone_in_L_and_bounded(p, q, L):
    d = abs(p - q)
    try:
        blk, blk1 = bernoulli_block_length(p, q, L), bernoulli_block_length(p, q, L + 1)
    except ValueError as exc:  # p and q so close that too many terms are needed: refused, as documented
        assert "MAX_BERNOULLI_TERMS" in str(exc)
        blk = blk1 = None
    tok, tok1 = bernoulli_token_length(p, q, L), bernoulli_token_length(p, q, L + 1)
    assert tok <= tok1 * (1 + 4 * EPS)
    if d > 2.2250738585072014e-308:
        exact_d = abs(Fraction(p) - Fraction(q))
        assert tok <= float((1 - exact_d) / exact_d) * (1 + 16 * EPS)  # the geometric series' limit
    if blk is not None:
        assert blk <= blk1 * (1 + 4 * EPS) and blk <= L and blk1 <= L + 1
        assert tok <= blk * (1 + 1e-13) + 1e-300


# ----------------------------------------------------------------------------- block verifiers on memoryless models


@given(pq=law_pairs(min_n=2, max_n=2), L=st.integers(1, 3))
def test_expected_lengths_on_bernoulli_sources_match_closed_forms(pq, L):
    p, q = pq
    s, b = MemorylessModel(p), MemorylessModel(q)
    tok, one, blk = (expected_length(s, b, L, v) for v in ("token", "block-onestep", "block"))
    # Sun et al. (arXiv:2403.10444), Theorems 1-2 and Section 4: token <= one-step <= block <= L
    slack = 16 * L * EPS
    assert -slack <= tok <= one + slack and one <= blk + slack and blk <= L + slack
    assert abs(tok - bernoulli_token_length(p[1], q[1], L)) <= 64 * L * EPS
    assert abs(blk - bernoulli_block_length(p[1], q[1], L)) <= 1e-13 * L
    for name in ("token", "block-onestep", "block"):
        v = make_verifier(s, b, L, name)
        law = v.tau_law()
        assert np.all(law >= 0.0) and abs(law.sum() - 1.0) <= 8 * (L + 2) * EPS
        out = v.output_law()  # lossless: the law of the L + 1 emitted tokens is the target's joint law
        target = q
        for _ in range(L):
            target = np.multiply.outer(target, q)
        assert np.all(out >= 0.0)
        np.testing.assert_allclose(out, target, rtol=0, atol=64 * (L + 1) * EPS)


# ----------------------------------------------------------------------------- closed forms of alpha_k


@given(p=_PROB, q=_PROB, k=st.one_of(st.integers(1, 6), st.sampled_from([10**6, 10**18])))
@example(p=ONE_MINUS, q=1.0, k=1)
@example(p=0.5, q=0.5, k=10**18)
def test_bernoulli_alpha_k_is_exact_and_monotone(p, q, k):
    got = bernoulli_alpha_k(p, q, k)
    exact = bernoulli_alpha_k(Fraction(p), Fraction(q), min(k, 64))  # the formula itself in rationals
    assert 0.0 <= got <= 1.0
    if k <= 64:
        assert abs(got - float(exact)) <= 8 * k * EPS
    assert got <= bernoulli_alpha_k(p, q, k + 1) + 4 * EPS  # more drafts never hurt
    if k <= 6 and p >= 2.2250738585072014e-308 and 1.0 - p >= 2.2250738585072014e-308:
        # against the LP of the optimal-transport problem (HiGHS)
        lp = float(alpha_k([1.0 - p, p], [1.0 - q, q], k, method="lp"))
        assert abs(got - lp) <= 1e-9


@given(d_p=st.integers(1, 6), d_q=st.integers(1, 6), k=st.integers(1, 4))
def test_uniform_alpha_k_matches_the_lp(d_p, d_q, k):
    n = max(d_p, d_q)
    p = np.zeros(n)
    q = np.zeros(n)
    p[:d_p] = 1.0 / d_p
    q[:d_q] = 1.0 / d_q
    exact = uniform_alpha_k(d_p, d_q, k, exact=True)
    assert 0 <= exact <= 1 and uniform_alpha_k(d_p, d_q, k) == float(exact)
    assert exact <= uniform_alpha_k(d_p, d_q, k + 1, exact=True)
    assert abs(float(alpha_k(p, q, k)) - float(exact)) <= 1e-12


# ----------------------------------------------------------------------------- two drafts, without replacement


@given(pq=law_pairs(min_n=1, max_n=4))
def test_khisti_alpha2_is_alpha_2(pq):
    """Khisti et al. (arXiv:2410.18234): the explicit optimum of two i.i.d. drafts equals alpha_2 (the package's
    exact route); it lies in [0, 1], and acceptance one holds iff it is 1."""
    p, q = pq
    got = khisti_alpha2(p, q)
    assert 0.0 <= got <= 1.0
    ref = float(alpha_k(p, q, 2))
    n = len(p)
    assert abs(got - ref) <= 8 * 2**n * EPS + 1e-15
    if khisti_acceptance_one(p, q, tol=0.0):
        assert got >= 1.0 - 8 * n * EPS


def _exact_within(p, omega0, k: int) -> Fraction:
    """P(S subset of Omega_0) for k draws without replacement, by enumeration of ordered tuples in rationals."""
    P = [_F(v) for v in p]
    inside = set(omega0)

    def walk(prefix, prob):
        if len(prefix) == k:
            return prob if set(prefix) <= inside else Fraction(0)
        rest = sum(P[y] for y in range(len(P)) if y not in prefix)
        return sum(walk(prefix + (x,), prob * P[x] / rest) for x in range(len(P)) if x not in prefix and P[x] > 0)

    return walk((), Fraction(1))


@given(p=st.integers(1, 4).flatmap(laws), data=st.data())
def test_prob_within_without_replacement_matches_enumeration(p, data):
    n = len(p)
    support = int(np.count_nonzero(p >= 2.2250738585072014e-308))
    assume(support >= 1)
    k = data.draw(st.integers(1, support))
    omega0 = data.draw(st.lists(st.integers(0, n - 1), unique=True, max_size=n))
    p = np.where(p < 2.2250738585072014e-308, 0.0, p)  # the package flushes subnormals; so does the reference
    got = prob_within_without_replacement(p, omega0, k)
    exact = _exact_within(p, omega0, k)
    assert 0.0 <= got <= 1.0
    assert abs(got - float(exact)) <= 1e-13 + 4 * n * EPS  # the documented bound


@given(pq=law_pairs(min_n=1, max_n=4))
def test_alpha_k_without_replacement_is_the_lp_and_monotone(pq):
    p, q = pq
    p = np.where(p < 2.2250738585072014e-308, 0.0, p)
    support = int(np.count_nonzero(p))
    prev = 0.0
    for k in range(1, support + 1):
        got = alpha_k_without_replacement(p, q, k)
        assert 0.0 <= got <= 1.0
        assert abs(got - alpha_k_without_replacement(p, q, k, method="lp")) <= 1e-9  # HiGHS, re-checked
        assert got >= prev - 1e-13  # one more distinct draft never hurts
        prev = got


# found by test_khisti_alpha2_is_alpha_2 (hypothesis seed 9; this p from a numpy search of the same class):
# at S = supp(p), p(S) sums to 1 + 2**-52 in float64 and q(S) = 0, so the former
# q(S) + (1 - p(S))**2 + 2 p(S) (1 - p(S)) gave -4.4e-16; p(S^c) is now summed over S's complement, so every
# term is >= 0 (fails on the former `1 - p(S)` form)
def test_khisti_alpha2_never_negative_at_a_subset_sum_past_one():
    p = np.array([0.42311380766287726, 0.004745725631765277, 0.5721404667053576, 0.0])  # a law (validated)
    q = np.array([0.0, 0.0, 0.0, 1.0])
    assert float(alpha_k(p, q, 2)) == 0.0
    assert khisti_alpha2(p, q) >= 0.0


# ----------------------------------------------------------------------------- SpecHub's two drafts


def _exact_hub_pair(p) -> dict:
    """SpecHub's pair law (Sun, Zhou, Chen, Sun, arXiv:2411.05289) in rationals: P(i, a) = p(i), P(a, j) =
    p(a) p(j) / (1 - p(a)), a = argmax p (lowest id); a point mass pairs a with the lowest other id."""
    P = [_F(v) for v in p]
    a = max(range(len(P)), key=lambda i: (P[i], -i))
    rest = sum(P[i] for i in range(len(P)) if i != a)
    out = {}
    for i in range(len(P)):
        if i != a:
            out[(i, a)] = P[i]
            out[(a, i)] = P[a] * P[i] / rest if rest > 0 else Fraction(0)
    if rest == 0:
        out[(a, 1 if a == 0 else 0)] = P[a]
    return out


@given(pq=law_pairs(min_n=2, max_n=5))
def test_spechub_pair_law_and_optimum_match_rationals(pq):
    p, q = pq
    n = len(p)
    p = np.where(p < 2.2250738585072014e-308, 0.0, p)  # validation flushes subnormal entries
    q = np.where(q < 2.2250738585072014e-308, 0.0, q)
    pair = spechub_pair_law(p)
    assert np.all(pair >= 0.0) and abs(pair.sum() - 1.0) <= 4 * n * EPS
    exact = _exact_hub_pair(p)
    ref = np.zeros((n, n))
    for (i, j), v in exact.items():
        ref[i, j] = float(v)
    np.testing.assert_allclose(pair, ref, rtol=0, atol=4 * n * EPS)
    # the optimum by the min-cut of the coupling (Strassen): min over U of q(U) + P({X1, X2} not inside U)
    Q = [_F(v) for v in q]
    best = min(
        sum(Q[i] for i in range(n) if U >> i & 1)
        + sum(v for (i, j), v in exact.items() if not (U >> i & 1 and U >> j & 1))
        for U in range(2**n)
    )
    got = spechub_optimum(p, q)
    assert 0.0 <= got <= 1.0
    assert abs(got - float(best)) <= 8 * n * EPS


# ----------------------------------------------------------------------------- SpecTr's iteration


@given(pq=law_pairs(min_n=1, max_n=3), K=st.integers(1, 2), L=st.integers(1, 2),
       verifier=st.sampled_from(["token", "kseq", "optimal"]))
def test_spectr_iteration_laws(pq, K, L, verifier):
    p, q = pq
    K = 1 if verifier == "token" else K  # token verification takes one draft
    s, b = MemorylessModel(p), MemorylessModel(q)
    law = length_law(s, b, K, L, verifier=verifier)
    assert law.shape == (L + 1,) and np.all(law >= 0.0) and abs(law.sum() - 1.0) <= 16 * (L + 1) * EPS
    eff = block_efficiency(s, b, K, L, verifier=verifier)
    assert abs(eff - float(np.dot(np.arange(1, L + 2), law))) <= 16 * (L + 1) ** 2 * EPS
    assert 1.0 - 16 * EPS <= eff <= L + 1 + 16 * EPS
    if K == 1 and verifier == "token":  # one draft: token-level speculative decoding, bonus included
        assert abs(eff - (1.0 + expected_length(s, b, L, "token"))) <= 32 * (L + 1) * EPS
    dec = decoded_law(s, b, K, L, verifier=verifier)
    vals = np.array(list(dec.values()))
    assert np.all(vals >= 0.0) and abs(math.fsum(vals) - 1.0) <= 16 * len(vals) * EPS
    # lossless: every iteration decodes at least one token, the first from the target's law
    first = np.zeros(len(q))
    for seq, v in dec.items():
        first[seq[0]] += v
    qq = np.where(q < 2.2250738585072014e-308, 0.0, q)
    np.testing.assert_allclose(first, qq / qq.sum(), rtol=0, atol=64 * (L + 1) * len(q) * EPS)


# ----------------------------------------------------------------------------- KL divergence


# found by this test (hypothesis seed 12): pi / q = 5e-324 / 0.22 is a subnormal quotient of a few bits, whose
# log was off by 0.1; main's KL was 164.878 for 164.901 (1.4e-4 relative)
_KL_SUBNORMAL = (np.array([2.0, 2.0, 2.0, 1.0, 2.0]) / 9.0,
                 np.array([2.0 / 7.0, 2.0 / 7.0, 2.0 / 7.0, 1.0 / 7.0, SUBNORMAL]))


@given(pq=law_pairs(min_n=1, max_n=5, near=True))
@example(pq=_KL_SUBNORMAL)
@example(pq=(np.array([0.5, 0.5]), np.array([1.0 - 1e-308, 1e-308])))  # a normal pi, a subnormal quotient
def test_kl_divergence_matches_high_precision(pq):
    """KL(q || pi) in its documented form sum_{q > 0} (pi - q - q ln(pi / q)) + sum_{q = 0} pi (the usual KL when
    both sum to 1), against mpmath at 60 digits on the same float64 inputs: non-negative, 0 at pi == q, and
    relatively accurate (each term has full relative accuracy, so their sum does)."""
    mpmath = pytest.importorskip("mpmath")
    q, pi = pq
    got = kl_divergence(q, pi)
    assert got >= 0.0
    if np.array_equal(q, pi):
        assert got == 0.0
    if np.any((pi <= 0) & (q > 0)):
        assert got == math.inf
        return
    with mpmath.workdps(60):
        ref = mpmath.fsum(
            (mpmath.mpf(b) - mpmath.mpf(a) - mpmath.mpf(a) * mpmath.log(mpmath.mpf(b) / mpmath.mpf(a))) if a > 0
            else mpmath.mpf(b)
            for a, b in zip(q.tolist(), pi.tolist())
        )
        ref = float(ref)
    assert abs(got - ref) <= 64 * len(q) * EPS * ref + 1e-300
    # the profile's batched rows (its numpy route; torch's runs the same operations) within the same bound
    row = float(kl_rows(q[None], pi[None], array_api_compat.array_namespace(q))[0])
    assert abs(row - ref) <= 64 * len(q) * EPS * ref + 1e-300


# ----------------------------------------------------------------------------- huge k in the closed forms
# Both forms raised 1 - x to a huge power: 1 - 1/k and 1 - p round to 1.0 once below 2**-53, so the power was 1
# and the value 0. -expm1(k * log1p(-x)) keeps them (both fail on the power form).


def test_lemma3_constant_at_huge_k_is_near_one_minus_one_over_e():
    from otspec.closed_form import lemma3_constant

    mpmath = pytest.importorskip("mpmath")
    for k in (10**9, 10**16, 10**18):
        with mpmath.workdps(60):
            ref = float(-mpmath.expm1(k * mpmath.log1p(-mpmath.mpf(1) / k)))
        assert abs(lemma3_constant(k) - ref) <= 8 * EPS  # main: 0.0 at k = 1e18, 0.6705 at 1e16


@pytest.mark.parametrize(("p", "q", "k"), [(1e-17, 0.5, 10**18), (1e-20, 0.5, 10**18), (3e-300, 0.25, 2**1000),
                                           (1 - 2**-52, 0.5, 2**40), (0.5, 0.75, 1024), (1e-17, 0.5, 2**2000),
                                           (0.0, 0.5, 10**6), (1.0, 0.5, 10**6)])
def test_bernoulli_alpha_k_at_huge_k_with_a_tiny_p(p, q, k):
    # against 60 digits: (1e-17, 0.5, 1e18) gave 0.5 on the power form (the exact value rounds to 1.0)
    mpmath = pytest.importorskip("mpmath")
    with mpmath.workdps(60):
        kk = mpmath.mpf(min(k, 2**1000))
        drawn = -mpmath.expm1(kk * mpmath.log1p(-mpmath.mpf(p))) if p < 1 else mpmath.mpf(1)
        not_all = -mpmath.expm1(kk * mpmath.log(mpmath.mpf(p))) if p > 0 else mpmath.mpf(1)
        ref = float(min(mpmath.mpf(q), drawn) + min(1 - mpmath.mpf(q), not_all))
    assert abs(bernoulli_alpha_k(p, q, k) - ref) <= 8 * EPS


# ----------------------------------------------------------------------------- trees and Theorem 2


@given(pq=law_pairs(min_n=1, max_n=4), data=st.data())
def test_sequoia_acceptance_vector_is_a_sub_law_below_the_wor_optimum(pq, data):
    """Sequoia's acceptance vector (Chen et al., arXiv:2402.12374, Section 3.1) on a star of ``width`` distinct
    drafts: entries >= 0, total <= 1 and at most the optimal acceptance of ``width`` drafts without replacement
    (Hu et al., arXiv:2502.18779); one child: the maximal coupling's overlap sum min(p, q), in rationals."""
    p, q = pq
    p = np.where(p < 2.2250738585072014e-308, 0.0, p)
    q = np.where(q < 2.2250738585072014e-308, 0.0, q)
    support = int(np.count_nonzero(p))
    width = data.draw(st.integers(1, min(3, support)))
    s, b = MemorylessModel(p), MemorylessModel(q)
    a = acceptance_vector(s, b, width)
    n = len(p)
    assert a.shape == (width,) and np.all(a >= 0.0) and a.sum() <= 1.0 + 8 * n * EPS
    assert a.sum() <= alpha_k_without_replacement(p, q, width) + 1e-13 + 8 * n * EPS
    if width == 1:
        pn, qn = p / p.sum(), q / q.sum()  # the models' laws as read
        exact = sum(min(_F(x), _F(y)) for x, y in zip(pn, qn))
        assert abs(a[0] - float(exact)) <= 8 * n * EPS


@given(V=st.integers(1, 3), data=st.data(), L=st.integers(1, 3))
def test_theorem2_length_is_token_verification_on_markov_models(V, data, L):
    """Sun et al. (arXiv:2403.10444), Theorem 2's closed form against the token verifier's enumerated law (the
    other route), on first-order Markov sources with adversarial rows; and 0 <= token <= block <= L."""
    draft = MarkovModel(np.stack([data.draw(laws(V)) for _ in range(V)]))
    target = MarkovModel(np.stack([data.draw(laws(V)) for _ in range(V)]))
    t2 = theorem2_length(draft, target, L)
    tok = expected_length(draft, target, L, "token")
    blk = expected_length(draft, target, L, "block")
    bound = 16 * L * (V**L + L) * EPS
    assert abs(t2 - tok) <= bound
    assert -bound <= tok <= blk + bound and blk <= L + bound
