"""Adversarial fuzzing of every public entry point (issue 15).

Each property draws adversarial laws -- zeros, subnormals (5e-324), 1e-300,
entries like 1 - 1e-16, ties, point masses, near-equal pairs, float32
arrays, plain lists -- and asserts one of two outcomes:

* the result is finite and right by an *independent route* (enumeration of
  the verifier's kernel, an LP, exact rational arithmetic, the same problem
  with the negligible entries at exactly zero), or
* a ``ValueError`` / ``TypeError`` whose message names the parameter in
  backticks;

and, always, that no input was mutated.

Runs: a few seconds by default (``FUZZ_EXAMPLES`` examples per property,
derandomized). The long profile runs ``FUZZ_EXAMPLES_LONG`` per property:
``pytest -m slow tests/test_fuzz.py`` or ``HYPOTHESIS_PROFILE=thorough pytest
tests/test_fuzz.py``. docs/reliability.rst reports the counts.
"""

from __future__ import annotations

import itertools
import math
import os
import re
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import otspec
from otspec import speculative
from otspec.models import MemorylessModel
from otspec.multidraft import VERIFIERS

LONG = os.environ.get("HYPOTHESIS_PROFILE") == "thorough"
#: examples per property in the default run, and in the long profile
FUZZ_EXAMPLES = 25
FUZZ_EXAMPLES_LONG = 600
TOL = 1e-9  # the package's stated tolerance (SIMPLEX_TOL) on probabilities


def _settings(n):
    return settings(max_examples=n, derandomize=True, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


DEFAULT = _settings(FUZZ_EXAMPLES_LONG if LONG else FUZZ_EXAMPLES)
SLOW = _settings(FUZZ_EXAMPLES_LONG)

TINY = (5e-324, 1e-310, 1e-300, 1e-200, 1e-16)


# ----------------------------------------------------------------------------- strategies
@st.composite
def laws(draw, n):
    """An adversarial law on ``n`` tokens (float64, sums to 1 within 1e-15)."""
    kind = draw(st.sampled_from(["mixed", "point", "uniform", "near-one", "tiny"]))
    if kind == "point":
        return np.eye(n)[draw(st.integers(0, n - 1))]
    if kind == "uniform":
        return np.full(n, 1.0 / n)
    elems = st.one_of(
        st.floats(0.01, 1.0),
        st.sampled_from([1.0, 0.5, 0.25]),  # ties
        st.sampled_from(TINY),
        st.just(0.0),
    )
    w = np.array(draw(st.lists(elems, min_size=n, max_size=n)), dtype=np.float64)
    big = w >= 1e-6
    if not big.any():
        w[draw(st.integers(0, n - 1))] = 1.0
        big = w >= 1e-6
    if kind == "near-one" and n >= 2:
        # one entry 1 - 1e-16 (rounds to 1 - 2**-53), the rest tiny or zero
        i = draw(st.integers(0, n - 1))
        w = np.where(w >= 1e-6, 0.0, w)
        w[i] = 1.0 - 1e-16
        return w
    # normalise the meaningful entries, keep the tiny ones as drawn (sum stays 1 within 1e-15)
    w[big] /= w[big].sum()
    return w


@st.composite
def law_pairs(draw, min_n=1, max_n=4):
    n = draw(st.integers(min_n, max_n))
    p = draw(laws(n))
    kind = draw(st.sampled_from(["independent", "equal", "near-equal", "swapped-tiny"]))
    if kind == "equal":
        return p, p.copy()
    if kind == "near-equal":
        q = p.copy()
        i = int(np.argmax(q))
        j = (i + 1) % n
        eps = draw(st.sampled_from([1e-16, 1e-13, 1e-10]))
        if n >= 2 and q[i] > eps:
            q[i] -= eps
            q[j] += eps
        return p, q
    q = draw(laws(n))
    if kind == "swapped-tiny":
        return q, p
    return p, q


def _flush(x):
    """The same law with its subnormal entries at exactly zero."""
    x = np.array(x, dtype=np.float64)
    x[x < np.finfo(np.float64).tiny] = 0.0
    return x


def _frozen(*arrays):
    return [np.array(a, copy=True) for a in arrays]


def _unchanged(before, after):
    for b, a in zip(before, after):
        np.testing.assert_array_equal(b, a)


def _names_parameter(exc: Exception) -> bool:
    return re.search(r"`[A-Za-z_][\w.\[\]()+*]*`", str(exc)) is not None


def _enumerate(v):
    """Output law and acceptance of a k-draft verifier by enumerating its kernel (independent route)."""
    p = np.asarray(v.p)
    support = np.flatnonzero(p > 0).tolist()
    law = np.zeros(v.n)
    acc = []
    for x in itertools.product(support, repeat=v.k):
        w = float(v.draft_law_of(x))
        if w == 0.0:
            continue
        c = np.asarray(v.conditional(x), dtype=np.float64)
        assert np.all(c >= -1e-15) and abs(c.sum() - 1.0) <= 1e-12
        law += w * c
        acc.append(w * float(c[sorted(set(x))].sum()))
    return law, math.fsum(acc)


def _check_lossless_verifier(v, q):
    law, acc = _enumerate(v)
    np.testing.assert_allclose(law, q, atol=TOL, rtol=0)
    assert abs(acc - v.acceptance()) <= TOL
    return acc


# ----------------------------------------------------------------------------- token level
def prop_maximal_coupling(pq):
    p, q = pq
    before = _frozen(p, q)
    v = otspec.maximal_coupling(p, q)
    _unchanged(before, (p, q))
    acc = _check_lossless_verifier(v, _flush(q))
    assert abs(acc - math.fsum(np.minimum(_flush(p), _flush(q)))) <= TOL


def prop_kseq(pqk):
    (p, q), k = pqk
    before = _frozen(p, q)
    v = otspec.kseq(p, q, k)
    _unchanged(before, (p, q))
    _check_lossless_verifier(v, _flush(q))
    # the negligible entries change nothing: the same problem with them at zero
    w = otspec.kseq(_flush(p), _flush(q), k)
    assert v.acceptance() == w.acceptance()


def prop_multiround(pqk):
    (p, q), k = pqk
    v = otspec.multiround(p, q, k)
    _check_lossless_verifier(v, _flush(q))
    if k <= np.count_nonzero(_flush(p)):
        u = otspec.multiround(p, q, k, replacement=False)
        _check_lossless_verifier(u, _flush(q))


def prop_optimal_verifier(pqk):
    (p, q), k = pqk
    before = _frozen(p, q)
    v = otspec.optimal_verifier(p, q, k)
    _unchanged(before, (p, q))
    acc = _check_lossless_verifier(v, _flush(q))
    # optimal: its acceptance is alpha_k, which the OTM LP computes independently
    lp = otspec.otm_lp(p, q, k)
    assert lp.success
    assert abs(acc - lp.alpha) <= 1e-8


def prop_alpha_k(pqk):
    (p, q), k = pqk
    a = otspec.alpha_k(p, q, k)
    assert np.isfinite(a) and 0.0 <= a <= 1.0
    lp = otspec.otm_lp(p, q, k)
    assert abs(a - lp.alpha) <= 1e-8


def prop_lenient(pql):
    (p, q), l = pql
    v = otspec.lenient_verifier(p, q, l)
    law, acc = _enumerate(v)
    np.testing.assert_allclose(law, v.output_law(), atol=TOL, rtol=0)
    fp, fq = _flush(p), _flush(q)
    assert abs(acc - math.fsum(np.minimum(fp, fq / l))) <= TOL  # Leviathan et al. App. A.5


def prop_mentored(pqd):
    (p, q), D = pqd
    before = _frozen(p, q)
    r = otspec.mentored(p, q, D)
    _unchanged(before, (p, q))
    assert np.isfinite(r.acceptance) and not np.isnan(r.kl)
    fp, fq = _flush(p), _flush(q)
    r0 = otspec.mentored(fp, fq, D)
    assert abs(r.acceptance - r0.acceptance) <= TOL
    # feasibility: the KL budget holds (to rounding) and the law is p r + s (1 - R)
    assert r.kl <= D * (1 + 1e-9) + 1e-12 or r.kl == r0.kl
    np.testing.assert_allclose(r.law.sum(), 1.0, atol=1e-12)
    # an independent algorithm (the note's bisection) reaches the same optimum
    R0 = math.fsum(np.minimum(fp, fq))
    assert r.acceptance >= R0 - TOL
    if 0 < D < r.D + 1 and np.isfinite(D):
        try:
            b = otspec.mentored(p, q, D, method="bisection", tol=1e-9, max_iter=5000)
        except RuntimeError:
            return  # bisection's documented non-convergence, not a wrong answer
        assert abs(b.acceptance - r.acceptance) <= 1e-6


def prop_float32_and_lists(pqk):
    (p, q), k = pqk
    p32, q32 = np.asarray(p, np.float32), np.asarray(q, np.float32)
    if p32.sum() <= 0 or q32.sum() <= 0:
        return
    p32 = p32 / p32.sum(dtype=np.float32)
    q32 = q32 / q32.sum(dtype=np.float32)
    # float32 is accepted and computed in float64 on the rescaled simplex
    ref_p = p32.astype(np.float64) / p32.astype(np.float64).sum()
    ref_q = q32.astype(np.float64) / q32.astype(np.float64).sum()
    assert otspec.kseq(p32, q32, k).acceptance() == otspec.kseq(ref_p, ref_q, k).acceptance()
    assert otspec.maximal_coupling(p32, q32).acceptance() == otspec.maximal_coupling(ref_p, ref_q).acceptance()
    assert otspec.alpha_k(list(p), list(q), k) == otspec.alpha_k(np.asarray(p), np.asarray(q), k)


def prop_registry(case):
    """Every token verifier of the registry: its kernel, enumerated, gives its stated law and acceptance."""
    (p, q), k, name = case
    spec = VERIFIERS[name]
    kk = 1 if spec.single_draft else k
    try:
        v = spec.build(p, q, kk, **{o: {"D": 0.05, "w": 0.5}[o] for o in spec.required})
    except (ValueError, TypeError) as exc:  # e.g. more drafts than tokens without replacement
        assert _names_parameter(exc), str(exc)
        return
    law, acc = _enumerate(v)
    np.testing.assert_allclose(law, v.output_law(), atol=TOL, rtol=0)
    if spec.lossless:
        np.testing.assert_allclose(law, _flush(q), atol=TOL, rtol=0)
    assert abs(acc - v.acceptance()) <= TOL


# ----------------------------------------------------------------------------- models, block, SpecTr
def prop_block_models(pqL):
    (p, q), L = pqL
    d, t = MemorylessModel(p), MemorylessModel(q)
    tok = otspec.block.expected_length(d, t, L, "token")
    blk = otspec.block.expected_length(d, t, L, "block")
    # independent routes: Sun et al.'s (arXiv:2403.10444) Theorems 2 and 1 in closed form over the tables
    assert abs(tok - otspec.block.theorem2_length(d, t, L)) <= 1e-9
    assert abs(blk - otspec.block.theorem1_length(d, t, L)) <= 1e-9
    assert tok <= blk + 1e-12
    assert otspec.block.check_lossless(d, t, L, "block").max_error <= 1e-9
    # SpecTr with K = 1 is token-level speculative decoding: 1 + E[tau_token]
    be = otspec.spectr.block_efficiency(d, t, 1, L)
    assert abs(be - 1.0 - tok) <= 1e-9


def prop_spectr(pqKL):
    (p, q), K, L = pqKL
    d, t = MemorylessModel(p), MemorylessModel(q)
    best = otspec.spectr.optimal_block_efficiency(d, t, K, L)
    for name in ("lp", "kseq", "multiround"):
        be = otspec.spectr.block_efficiency(d, t, K, L, verifier=name)
        assert be >= 1.0 - 1e-12 and be <= L + 1 + 1e-12
        assert be <= best + 1e-12, (name, be, best)  # the DP value is a certified upper bound
    chk = otspec.spectr.check_lossless(d, t, K, L, verifier="kseq")
    assert chk.max_error <= 1e-9


# ----------------------------------------------------------------------------- speculative economics
def prop_optimal_gamma(ac):
    a, c, G = ac
    got = speculative.optimal_gamma(a, c, max_gamma=G)
    # independent route: every walltime factor (1 + a + ... + a^g) / (g c + 1) compared exactly,
    # in integers: a = A / 2**E, c = C / 2**F (doubles are dyadic rationals)
    A, E = Fraction(a).numerator, Fraction(a).denominator.bit_length() - 1
    C, F = Fraction(c).numerator, Fraction(c).denominator.bit_length() - 1
    num, den, power = 1, 1, 1  # sum_{i<=g} a^i = num / den
    best = None
    for g in range(1, G + 1):
        power *= A
        num, den = (num << E) + power, den << E
        value = (num << F, den * (g * C + (1 << F)))  # the factor as a fraction (top, bottom)
        if best is None or value[0] * best[1][1] > best[1][0] * value[1]:
            best = (g, value)
    assert got == best[0]  # the smallest maximiser (strictly larger values replace it)


def _binomial(i, p):
    # the pmf term by term in plain floats (scipy's pmf overflows for p near 1e-307)
    return np.array([math.comb(i, j) * p**j * (1.0 - p) ** (i - j) for j in range(i + 1)])


def prop_bernoulli(pqL):
    p, q, L = pqL
    got = otspec.block.bernoulli_block_length(p, q, L)
    p, q = (0.0 if v < np.finfo(np.float64).tiny else v for v in (p, q))  # subnormals are 0
    # independent route: the O(L^2) sum over i of sum_j min(Bin(i, p)_j, Bin(i, q)_j)
    ref = math.fsum(math.fsum(np.minimum(_binomial(i, p), _binomial(i, q))) for i in range(1, L + 1))
    assert abs(got - ref) <= 1e-12 * max(1.0, ref)
    tok = otspec.block.bernoulli_token_length(p, q, L)
    assert abs(tok - math.fsum((1 - abs(p - q)) ** i for i in range(1, L + 1))) <= 1e-12 * L


# ----------------------------------------------------------------------------- invalid input
BAD_LAWS = st.sampled_from([
    [0.5, 0.6], [-0.1, 1.1], [np.nan, 1.0], [np.inf, 0.0], [], [[0.5, 0.5]], "ab", None, [0.3, 0.3],
    [1 + 0j, 0], [1e-300, 1e-300],
])


def prop_bad_input(case):
    law, which, call = case
    p, q = ([0.5, 0.5], law) if which == "q" else (law, [0.5, 0.5])
    try:
        call(p, q)
    except (ValueError, TypeError) as exc:
        assert _names_parameter(exc), str(exc)
    else:
        raise AssertionError("accepted an invalid law")


CALLS = st.sampled_from([
    lambda p, q: otspec.alpha_k(p, q, 2),
    lambda p, q: otspec.kseq(p, q, 2),
    lambda p, q: otspec.multiround(p, q, 2),
    lambda p, q: otspec.maximal_coupling(p, q),
    lambda p, q: otspec.optimal_verifier(p, q, 2),
    lambda p, q: otspec.lenient_verifier(p, q, 0.5),
    lambda p, q: otspec.mentored(p, q, 0.1),
    lambda p, q: otspec.otm_lp(p, q, 2),
    lambda p, q: otspec.block.expected_length(MemorylessModel(p), MemorylessModel(q), 2),
])

BAD_SCALARS = st.sampled_from([0, -1, 1.5, 2.0, True, None, "2", np.float64(2.0)])


def prop_bad_scalars(case):
    value, call = case
    try:
        call(value)
    except (ValueError, TypeError) as exc:
        assert _names_parameter(exc), str(exc)
    else:
        raise AssertionError(f"accepted {value!r}")


SCALAR_CALLS = st.sampled_from([
    lambda k: otspec.alpha_k([0.5, 0.5], [0.2, 0.8], k),
    lambda k: otspec.kseq([0.5, 0.5], [0.2, 0.8], k),
    lambda k: otspec.multiround([0.5, 0.5], [0.2, 0.8], k),
    lambda k: otspec.otm_lp([0.5, 0.5], [0.2, 0.8], k),
    lambda L: otspec.block.bernoulli_block_length(0.5, 0.2, L),
    lambda L: otspec.spectr.block_efficiency(MemorylessModel([0.5, 0.5]), MemorylessModel([0.2, 0.8]), 1, L),
    lambda g: speculative.optimal_gamma(0.5, 0.1, max_gamma=g),
])

SEED_CALLS = st.sampled_from([
    lambda s: otspec.kseq([0.5, 0.5], [0.2, 0.8], 2).sample((0, 1), rng=s),
    lambda s: otspec.kseq([0.5, 0.5], [0.2, 0.8], 2).sample_drafts(rng=s),
    lambda s: otspec.mentored_verifier([0.5, 0.5], [0.2, 0.8], 0.1).sample((0,), rng=s),
    lambda s: otspec.models.random_table_model(2, 2, rng=s).tables[1].tolist(),
    lambda s: otspec.block.make_verifier(MemorylessModel([0.5, 0.5]), MemorylessModel([0.2, 0.8]), 2).sample(rng=s),
    lambda s: otspec.spectr.iid_drafts(MemorylessModel([0.5, 0.5]), 3, 2, rng=s).tokens.tolist(),
])


def prop_seeds(case):
    """Any integral seed is the same seed as the int; anything else is refused, naming `rng`."""
    value, call = case
    if isinstance(value, (np.integer, int)) and not isinstance(value, bool) and int(value) >= 0:
        assert call(value) == call(int(value))
        return
    try:
        call(value)
    except (ValueError, TypeError) as exc:
        assert "`rng`" in str(exc), str(exc)
    else:
        raise AssertionError(f"accepted the seed {value!r}")


# ----------------------------------------------------------------------------- the runs
PROPERTIES = {
    "maximal_coupling": (prop_maximal_coupling, law_pairs()),
    "registry": (prop_registry, st.tuples(law_pairs(), st.integers(1, 3),
                                          st.sampled_from(sorted(n for n, s in VERIFIERS.items() if s.kind == "token")))),
    "kseq": (prop_kseq, st.tuples(law_pairs(), st.integers(1, 3))),
    "multiround": (prop_multiround, st.tuples(law_pairs(), st.integers(1, 3))),
    "optimal_verifier": (prop_optimal_verifier, st.tuples(law_pairs(), st.integers(1, 3))),
    "alpha_k": (prop_alpha_k, st.tuples(law_pairs(), st.integers(1, 4))),
    "lenient_verifier": (prop_lenient, st.tuples(law_pairs(), st.sampled_from([1e-300, 0.01, 0.5, 1 - 1e-16, 1.0]))),
    "mentored": (prop_mentored, st.tuples(law_pairs(), st.sampled_from([0.0, 1e-300, 1e-12, 0.01, 0.5, 50.0]))),
    "float32_and_lists": (prop_float32_and_lists, st.tuples(law_pairs(), st.integers(1, 3))),
    "block": (prop_block_models, st.tuples(law_pairs(max_n=3), st.integers(1, 3))),
    "spectr": (prop_spectr, st.tuples(law_pairs(max_n=3), st.integers(1, 3), st.integers(1, 2))),
    "optimal_gamma": (prop_optimal_gamma, st.tuples(
        st.one_of(st.floats(0.0, 1.0), st.sampled_from([0.0, 0.5, 0.7, 1.0, 1 - 1e-16, 1e-300])),
        st.one_of(st.floats(0.0, 2.0), st.sampled_from([0.0, 1e-300, 1e-12, 0.2, 0.25, 1.0])),
        st.one_of(st.integers(1, 40), st.sampled_from([120, 200])))),
    "bernoulli": (prop_bernoulli, st.tuples(
        st.one_of(st.floats(0.0, 1.0), st.sampled_from([0.0, 1.0, 0.5, 1e-300])),
        st.one_of(st.floats(0.0, 1.0), st.sampled_from([0.0, 1.0, 0.5, 1 - 1e-16])),
        st.integers(1, 40))),
    "bad_laws": (prop_bad_input, st.tuples(BAD_LAWS, st.sampled_from(["p", "q"]), CALLS)),
    "bad_scalars": (prop_bad_scalars, st.tuples(BAD_SCALARS, SCALAR_CALLS)),
    "seeds": (prop_seeds, st.tuples(
        st.sampled_from([3, np.int64(3), np.uint8(3), np.int32(0), -1, np.int64(-2), 1.5, True, "3", np.float64(3.0)]),
        SEED_CALLS)),
}


def _run(name, profile):
    prop, strategy = PROPERTIES[name]
    profile(given(strategy)(prop))()


@pytest.mark.parametrize("name", sorted(PROPERTIES))
def test_fuzz(name):
    """Default run: a few examples per entry point (derandomized)."""
    _run(name, DEFAULT)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PROPERTIES))
def test_fuzz_long(name):
    """The long profile (``pytest -m slow``): FUZZ_EXAMPLES_LONG examples per entry point."""
    _run(name, SLOW)
