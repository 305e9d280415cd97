"""Audit of the entry points no earlier audit covered, for their non-law parameters, and of the runtime guards
(task CN).

Table-driven as task BX: each public callable of ``otspec.otm``, ``otspec.closed_form``, ``otspec.speculative``,
``otspec.testing``, ``otspec.models``, ``otspec.plotting``, ``otspec.spectr.block_efficiency_mc``, the registries'
listings, the batched multi-draft acceptances and the decoding model adapters was called with a matrix of odd
non-law arguments (floats and bools for ints, ``2**63``, ``10**12``, ``0``, negatives, ``None``, text, NaN and
infinities, NumPy scalars, huge grids). Every call must end in the reference answer (an independent route) or in a
``ValueError`` / ``TypeError`` whose message names the parameter in backticks and says what came -- without a
warning, without changing its inputs, in bounded time and memory.

Runtime guards: every public function whose time or memory grows with an integer or a grid refuses, before any
work, a size above a stated module constant, naming the parameter, the value received and the cap
(``test_guard_refuses_before_allocating``: one child process whose address space is capped, each probe timed).

The tables hold every odd value tried: the rows of the findings below fail on main 7e357af (188 of this file's
tests there; tests marked ``regression`` hold such rows), the other rows pass there and keep that behaviour.

Findings on main 7e357af:

* ``spectr.block_efficiency_mc(n_samples=10**9)`` was accepted (0.44 ms per iteration on a 2-token pair: days);
  now at most ``MAX_MC_SAMPLES`` = 10**5;
* ``synthetic_llm_pair(10**12)`` / ``uniform_pair(10**12, 3)`` a MemoryError, ``10**8`` ran for a minute;
  ``acceptance_curves`` / ``plot_spectr_fig4/5/6`` / ``plot_acceptance_vs_b`` / ``plot_expected_tokens`` took any
  grid (``range(1, 10**5)``: minutes); ``plot_lossy_frontier(n_points=2**63)`` an IndexError, ``10**12`` a
  MemoryError; now every grid is at most ``MAX_CURVE_POINTS`` points, refused before any work;
* ``check_sampler(k=10**8)`` a MemoryError (``k = 10**5``: minutes); ``check_block_sampler(L=10**5)`` an
  "Exceeds the limit (4300 digits)" ValueError, ``L = 10**8`` a hang (the big integer ``V**(L+1)``);
* ``bernoulli_alpha_k(Fraction(1, 3), ..., k=10**12)`` and ``uniform_alpha_k(5, 3, 10**6)`` built a bignum of
  ``k`` bits (hours); now the float route answers at once and an exact result above ``MAX_EXACT_BITS`` is refused;
* ``lemma3_constant(2**63)`` was ``0.0`` and ``lemma3_constant(10**12)`` 1e-5 off (the power's rounding);
* ``uniform_alpha_k(exact=...)``, the otm functions' ``normalize`` / ``validate`` / ``raise_on_failure``, the
  batched acceptances' ``validate`` and the registries' ``block`` were read by truthiness (``validate=0`` skipped
  the checks of the laws; ``replacement=np.False_`` was refused);
* ``expected_tokens(alpha, 1e19)`` a RuntimeWarning and a wrong value (the int64 cast wrapped);
* ``processed_law(temperature=1e-320)`` an overflow warning and NaN;
* ``synthetic_llm_pair(sigma=inf)`` a warning, ``sigma=nan`` NaN laws, ``sigma=True`` accepted;
* ``plot_expected_tokens((1.5,))`` drew gamma = 1, ``("3",)`` gamma = 3; ``plot_optimal_gamma(cs=("0.1",))`` read
  the text; ``figure2_data`` took any number of ``ps`` (seconds each at ``L_max = 16``);
* ``seed_for(None)`` (any object) a seed that changed from run to run (the bytes of an object array are addresses);
  lists nested 5,000 deep a RecursionError;
* ``membership_plan`` read the key ``(0.7,)`` as token 0 and the weights ``["0.5", "0.5"]`` as numbers;
* ``khisti_acceptance_one(tol=nan)`` False and ``tol=inf`` True for every pair;
* ``MarkovModel(initial=3)``, ``check_length(None)``, ``CallableLM(device="nodev")`` and
  ``HFCausalLM(torch.nn.Linear(2, 2))`` ended in errors that named no parameter (or answered ``nan``);
  ``CallableLM(name=5)`` was accepted.
"""

from __future__ import annotations

import contextlib
import math
import reprlib
import signal
import subprocess
import sys
import threading
import time
import warnings
from fractions import Fraction

import numpy as np
import pytest

import otspec
from otspec import closed_form as cf
from otspec import models, otm, speculative, testing
from otspec import multidraft as md
from tests.probe import HEADROOM, run_probes

P = np.array([0.5, 0.25, 0.25])
Q = np.array([0.25, 0.25, 0.5])
D3, T3 = models.MemorylessModel(P), models.MemorylessModel(Q)
SECONDS = 5.0


def regression(f):
    """Marks (for the reader) a test that fails on main 7e357af."""
    return f


@pytest.fixture(autouse=True)
def _no_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


class Hang(Exception):
    """A call ran past its time limit."""


@contextlib.contextmanager
def _time_limit(seconds: float):
    """Raise :class:`Hang` inside the block after ``seconds`` (SIGALRM; no limit where there is none): a hang is a
    failure, not a stuck suite."""
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(*_):
        raise Hang(f"no answer in {seconds} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _refused(thunk, name: str):
    """``thunk()`` raises ValueError/TypeError naming ``name`` in backticks, in under SECONDS, inputs unchanged."""
    before = (P.copy(), Q.copy())
    t0 = time.perf_counter()
    with pytest.raises((ValueError, TypeError)) as exc, _time_limit(2 * SECONDS):
        thunk()
    assert time.perf_counter() - t0 < SECONDS
    assert f"`{name}" in str(exc.value), str(exc.value)
    assert np.array_equal(P, before[0]) and np.array_equal(Q, before[1])
    return str(exc.value)


def _step(p, q, drafts, rng):
    return drafts[0]


# ------------------------------------------------------------------------------------------------------------
# 1. odd non-law arguments: refused naming the parameter (each row failed on main: accepted, another exception,
#    a warning, or a message without the parameter)
# ------------------------------------------------------------------------------------------------------------
#: (id, call of the odd value, parameter named, odd values)
BOOL_OPTIONS = [
    ("alpha_k.normalize", lambda v: otm.alpha_k(P, Q, 2, normalize=v), "normalize"),
    ("alpha_k.validate", lambda v: otm.alpha_k(P, Q, 2, validate=v), "validate"),
    ("alpha_k.replacement", lambda v: otm.alpha_k(P, Q, 2, replacement=v), "replacement"),
    ("min_cut.normalize", lambda v: otm.min_cut(P, Q, 2, normalize=v), "normalize"),
    ("otm_lp.normalize", lambda v: otm.otm_lp(P, Q, 2, normalize=v), "normalize"),
    ("otm_lp.raise_on_failure", lambda v: otm.otm_lp(P, Q, 2, raise_on_failure=v), "raise_on_failure"),
    ("otm_lp_tuples.raise_on_failure", lambda v: otm.otm_lp_tuples(P, Q, 2, raise_on_failure=v), "raise_on_failure"),
    ("alpha_k_without_replacement.normalize", lambda v: otm.alpha_k_without_replacement(P, Q, 2, normalize=v),
     "normalize"),
    ("alpha_k_upper_bound.normalize", lambda v: cf.alpha_k_upper_bound(P, Q, 2, normalize=v), "normalize"),
    ("uniform_alpha_k.exact", lambda v: cf.uniform_alpha_k(3, 5, 2, exact=v), "exact"),
    ("batched_kseq_acceptance.validate", lambda v: md.batched_kseq_acceptance(P, Q, 2, validate=v), "validate"),
    ("batched_maximal_coupling_acceptance.validate",
     lambda v: md.batched_maximal_coupling_acceptance(P, Q, validate=v), "validate"),
    ("verifier_names.block", lambda v: md.verifier_names(block=v), "block"),
    ("get_verifier.block", lambda v: md.get_verifier("kseq", block=v), "block"),
    ("plot_expected_tokens.include_limit", lambda v: _plot("plot_expected_tokens", (1,), include_limit=v),
     "include_limit"),
]
NOT_BOOLS = [0, 1, None, "no", 0.0]


def _plot(fn, *args, **kw):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from otspec.plotting import lossy, multidraft

    f = getattr(lossy, fn, None) or getattr(multidraft, fn)
    try:
        return f(*args, **kw)
    finally:
        plt.close("all")


@regression
@pytest.mark.parametrize("value", NOT_BOOLS, ids=repr)
@pytest.mark.parametrize("case", BOOL_OPTIONS, ids=[c[0] for c in BOOL_OPTIONS])
def test_bool_options_take_no_truthiness(case, value):
    _, call, name = case
    _refused(lambda: call(value), name)


@pytest.mark.parametrize("case", [c for c in BOOL_OPTIONS if not c[0].startswith("otm_lp_tuples")],
                         ids=[c[0] for c in BOOL_OPTIONS if not c[0].startswith("otm_lp_tuples")])  # (cvxpy: slow)
def test_bool_options_take_numpy_bools(case):
    """``np.True_`` / ``np.False_`` give the answer of ``True`` / ``False`` (the registries' and plots' too)."""
    _, call, name = case
    for np_b, b in ((np.True_, True), (np.False_, False)):
        try:
            want = call(b)
        except (ValueError, TypeError) as exc:  # e.g. validate=False on a numpy pair: the same refusal
            with pytest.raises(type(exc)):
                call(np_b)
            continue
        got = call(np_b)
        if isinstance(want, (float, tuple, Fraction)):
            assert got == want
        elif hasattr(want, "alpha"):
            assert got.alpha == want.alpha


def _nested(depth: int):
    x = "a"
    for _ in range(depth):
        x = [x, "b"]
    return x


#: (id, call, parameter, odd values that must be refused)
REFUSED = [
    ("lemma3_constant.k", cf.lemma3_constant, "k", [0, -1, 2.0, True, None, "3"]),
    ("expected_tokens.gamma", lambda v: speculative.expected_tokens(0.5, v), "gamma",
     [1e19, 2.0**63, 2**63, 2**64, [2**64, 3], 1.5, float("inf"), float("nan"), True, None, "3", 0]),
    ("walltime_improvement.gamma", lambda v: speculative.walltime_improvement(0.5, v, 0.1), "gamma", [1e19, 2**64]),
    ("synthetic_llm_pair.sigma", lambda v: _lossy_pair(10, sigma=v), "sigma",
     [float("inf"), float("nan"), True, np.True_, None, "3"]),
    ("synthetic_llm_pair.perturbation", lambda v: _lossy_pair(10, perturbation=v), "perturbation",
     [float("-inf"), float("nan"), False, None]),
    ("synthetic_llm_pair.overflow", lambda v: _lossy_pair(10, sigma=v), "sigma", [1.7e308]),
    ("synthetic_llm_pair.n", lambda v: _lossy_pair(v), "n", [2**63, 0, 2.0, True]),
    ("uniform_pair.d", lambda v: _uniform_pair(v, 3), "d", [2**63, 0, 2.0, True]),
    ("uniform_pair.d_q", lambda v: _uniform_pair(3, v), "d_q", [2**63]),
    ("acceptance_curves.ks", lambda v: _acceptance_curves(P, Q, v), "ks", [[2**63], [0], [1.5], None, "12", 3]),
    ("plot_expected_tokens.gammas", lambda v: _plot("plot_expected_tokens", v), "gammas",
     [(1.5,), ("3",), (True,), (float("inf"),), (None,), (), None]),
    ("plot_optimal_gamma.cs", lambda v: _plot("plot_optimal_gamma", v), "cs", [("0.1",), (True,), (float("nan"),)]),
    ("plot_lossy_frontier.n_points", lambda v: _plot("plot_lossy_frontier", P, Q, n_points=v), "n_points",
     [2**63, 10**12, 0, 2.0, None]),
    ("khisti_acceptance_one.tol", lambda v: md.khisti_acceptance_one(P, Q, tol=v), "tol",
     [float("nan"), float("inf"), -1e-3, True, None, "0"]),
    ("membership_plan.keys", lambda v: otm.membership_plan(v, [0.5, 0.5], Q), "keys",
     [[(0.7,), (1,)], [(True,), (1,)], ["ab", (1,)], 5, None]),
    ("membership_plan.w", lambda v: otm.membership_plan([(0,), (1,)], v, Q), "w", [["0.5", "0.5"], None]),
    ("MarkovModel.initial", lambda v: models.MarkovModel(np.full((3, 3), 1 / 3), initial=v), "initial",
     [3, 0.5, True, "ab"]),
    ("check_length.L", models.check_length, "L", [None, "3", float("nan"), -1, 0.5, True]),
    ("seed_for.parts", lambda v: testing.seed_for("a", v), "parts",
     [None, {}, object(), [None], np.array([1, None], dtype=object), _nested(5000), _nested(201)]),
    ("check_sampler.k", lambda v: testing.check_sampler(_step, P, Q, k=v, n_samples=100, rng=0), "k",
     [10**8, 65, 2**63]),
    ("check_block_sampler.k", lambda v: testing.check_block_sampler(_step, D3, T3, 1, k=v, n_samples=100, rng=0),
     "k", [10**12, 65]),
    ("check_block_sampler.L", lambda v: testing.check_block_sampler(_step, D3, T3, v, n_samples=100, rng=0), "L",
     [10**5, 10**8]),
    ("bernoulli_alpha_k.k", lambda v: cf.bernoulli_alpha_k(Fraction(1, 3), Fraction(1, 2), v), "k", [10**12]),
    ("uniform_alpha_k.exact_k", lambda v: cf.uniform_alpha_k(5, 3, v, exact=True), "k", [10**12, 10**6]),
    ("block_efficiency_mc.n_samples",
     lambda v: otspec.spectr.block_efficiency_mc(D3, T3, 1, 2, n_samples=v, rng=0), "n_samples",
     [10**9, 100_001, 1, 2.0, True]),
]
REFUSED_ROWS = [(i, c, n, v) for i, c, n, vs in REFUSED for v in vs]


def _value_id(v) -> str:
    """A test id that is the same in every process (no addresses: pytest-xdist compares the workers' ids)."""
    return type(v).__name__ if type(v).__repr__ is object.__repr__ else reprlib.repr(v)[:20]


def _lossy_pair(*args, **kw):
    from otspec.plotting.lossy import synthetic_llm_pair

    return synthetic_llm_pair(*args, **kw)


def _uniform_pair(*args):
    from otspec.plotting.multidraft import uniform_pair

    return uniform_pair(*args)


def _acceptance_curves(*args):
    from otspec.plotting.multidraft import acceptance_curves

    return acceptance_curves(*args)


@regression
@pytest.mark.parametrize("case_id, call, name, value", REFUSED_ROWS,
                         ids=[f"{r[0]}={_value_id(r[3])}" for r in REFUSED_ROWS])
def test_odd_arguments_refused_naming_the_parameter(case_id, call, name, value):
    _refused(lambda: call(value), name)


def test_size_messages_state_the_value_and_the_cap():
    """A size refusal names the parameter, the value received, the cap's constant and how to get more."""
    from otspec.spectr._mc import MAX_MC_SAMPLES

    msg = _refused(lambda: otspec.spectr.block_efficiency_mc(D3, T3, 1, 2, n_samples=10**9, rng=0), "n_samples")
    assert "1,000,000,000" in msg and f"MAX_MC_SAMPLES = {MAX_MC_SAMPLES:,}" in msg and "chunks" in msg
    msg = _refused(lambda: testing.check_sampler(_step, P, Q, k=10**8, rng=0), "k")
    assert "100,000,000" in msg and "MAX_HARNESS_DRAFTS = 64" in msg


# ------------------------------------------------------------------------------------------------------------
# 2. odd arguments accepted: the reference answer of an independent route
# ------------------------------------------------------------------------------------------------------------
def _lemma3_series(k: int) -> float:
    """``1 - (1 - 1/k)**k = 1 - exp(k log(1 - 1/k))``, ``k log(1 - 1/k) = -1 - 1/(2k) - 1/(3k^2) - ...`` (the
    terms left off are below 1/(4k^3): under 1e-19 from k = 10**6)."""
    return 1.0 - math.exp(-1.0 - 1.0 / (2 * k) - 1.0 / (3 * k * k))


@regression
@pytest.mark.parametrize("k", [10**6, 10**9, 10**12, 2**53 + 1, 2**63, 10**30, 10**400])
def test_lemma3_constant_at_large_k(k):
    """main: 1 - (1 - 1/k)**k in floats (1e-5 off at 10**12, 0.0 at 2**63)."""
    with _time_limit(2 * SECONDS):
        got = cf.lemma3_constant(k)
    assert abs(got - _lemma3_series(min(k, 10**18))) <= 4e-16


@pytest.mark.parametrize("k", list(range(1, 40)) + [500, 1023, 1024, 1025, 2000, 4096])
def test_lemma3_constant_exact_rational_route(k):
    """Against the exact rational ``1 - (1 - 1/k)**k`` (Fraction), and below k = 1024 the value of main bit for
    bit."""
    exact = float(1 - (1 - Fraction(1, k)) ** k)
    got = cf.lemma3_constant(k)
    assert abs(got - exact) <= 2e-15
    if k < 1024:
        assert got == 1.0 - (1.0 - 1.0 / k) ** k


@regression
@pytest.mark.parametrize("d_p, d_q, k", [(5, 3, 10**6), (5, 3, 10**12), (10**6 + 1, 10**6, 10**9),
                                         (10**9, 1, 10**9), (2**70, 2**69, 2**80), (7, 1, 2**63)])
def test_uniform_alpha_k_at_large_k(d_p, d_q, k):
    """main: the exact Fraction ``(1 - d_q/d_p)**k`` (hours at k = 10**12); the float route against
    ``1 - exp(k log(1 - d_q/d_p))`` evaluated with mpmath-free series where d_q/d_p is small, and the exact
    rational below the bits limit."""
    with _time_limit(2 * SECONDS):
        got = cf.uniform_alpha_k(d_p, d_q, k)
    x = Fraction(d_q, d_p)
    if k * max(d_p.bit_length(), 1) <= 50_000:
        want = float(1 - (1 - x) ** k)
    else:
        # log(1 - x) = -x - x^2/2 - x^3/3 - ... in exact rationals (x small) or the float log (x >= 1/2: then
        # (1 - x)**k underflows and the answer is 1.0)
        if x < Fraction(1, 1000):
            log_t = -sum(float(x**j / j) for j in range(1, 8))
        else:
            log_t = math.log(float(1 - x))
        want = -math.expm1(float(min(k, 2**1000)) * log_t)
    assert abs(got - want) <= 1e-15, (got, want)


@pytest.mark.parametrize("d_p, d_q, k", [(4, 2, 2), (5, 3, 7), (120, 5, 30), (3, 5, 10**12), (6, 6, 10**12)])
def test_uniform_alpha_k_unchanged_below_the_limit(d_p, d_q, k):
    """The float and the Fraction of main, bit for bit (``d_q >= d_p`` needs no power at any k)."""
    x = Fraction(d_q, d_p)
    exact = 1 - (1 - x) ** k if d_q <= d_p else Fraction(d_p, d_q)
    assert cf.uniform_alpha_k(d_p, d_q, k, exact=True) == exact
    assert cf.uniform_alpha_k(d_p, d_q, k) == float(exact)


def test_bernoulli_alpha_k_floats_and_trivial_rationals_at_large_k():
    """Float inputs round (no limit); the rationals 0 and 1 have powers of 1 bit (no limit either)."""
    k = 10**12
    with _time_limit(2 * SECONDS):
        cf.bernoulli_alpha_k(Fraction(1), Fraction(1, 2), k)
    assert cf.bernoulli_alpha_k(1 / 3, 0.5, k) == min(0.5, 1 - (2 / 3) ** k) + min(0.5, 1 - (1 / 3) ** k) == 1.0
    assert cf.bernoulli_alpha_k(Fraction(1), Fraction(1, 2), k) == Fraction(1, 2)
    assert cf.bernoulli_alpha_k(Fraction(1, 4), Fraction(3, 4), 2) == Fraction(11, 16)


@pytest.mark.parametrize("gamma", [np.float32(3), 3.0, np.uint64(3), np.array([3.0, 2.0**62])])
def test_gamma_integral_floats_give_the_int_answer(gamma):
    g = np.asarray(gamma)
    want = speculative.expected_tokens(0.5, g.astype(np.int64) if g.ndim else int(g))
    assert np.array_equal(speculative.expected_tokens(0.5, gamma), want)


@regression
@pytest.mark.parametrize("T", [1e-320, 1e-300, 2.0**-896, 1e-30])
def test_processed_law_tiny_temperature_is_the_greedy_limit(T):
    """main: ``x / T`` overflowed (a warning, NaN). The limit T -> 0 of softmax(x / T) is the uniform law on the
    maximal logits; with logits 1e300 apart every finite T here is already that limit in float64."""
    for logits, want in (
        (np.log([0.5, 0.25, 0.25]), [1.0, 0.0, 0.0]),
        (np.array([3.0, 3.0, 1.0]), [0.5, 0.5, 0.0]),
        (np.array([1e308, -1e308, -np.inf]), [1.0, 0.0, 0.0]),
    ):
        x = logits.copy()
        assert testing.processed_law(logits, temperature=T).tolist() == want
        assert testing.processed_law(logits, temperature=T, top_k=1).tolist() == want  # ties at the k-th all kept
        assert np.array_equal(logits, x)


def test_processed_law_unchanged_without_overflow():
    """Where ``x / T`` is finite the law is main's: softmax of ``x / T`` (the formula, bit for bit)."""
    x = np.array([0.3, -1.2, 2.5, 0.0])
    for T in (0.05, 0.7, 1.0, 3.0):
        z = x / T
        w = np.exp(z - z.max())
        assert np.array_equal(testing.processed_law(x, temperature=T), w / w.sum())


def test_synthetic_llm_pair_unchanged():
    """The default pair is the docstring's formula on the seed-0 normals, bit for bit."""
    p, q = _lossy_pair(1000)
    g = np.random.default_rng(0)
    z, e = g.standard_normal(1000), g.standard_normal(1000)

    def sm(v):
        w = np.exp(v - v.max())
        return w / w.sum()

    assert np.array_equal(p, sm(3.0 * z + 1.0 * e)) and np.array_equal(q, sm(3.0 * z))


def test_synthetic_llm_pair_huge_scale_is_the_argmax():
    """``sigma = 1e308`` (logits finite, their spread not): both laws are the point mass on the largest normal
    (the noise, of size 1, is absorbed), without a warning."""
    p, q = _lossy_pair(10, sigma=1e308)
    z = np.random.default_rng(0).standard_normal(10)
    want = np.zeros(10)
    want[int(np.argmax(z))] = 1.0
    assert np.array_equal(p, want) and np.array_equal(q, want)


def test_acceptance_curves_numpy_ks_and_ranges():
    """``ks`` as numpy ints, a range or a generator: the values of the list of Python ints."""
    want = _acceptance_curves(P, Q, [1, 2, 3])
    for ks in (np.array([1, 2, 3]), range(1, 4), (k for k in (1, 2, 3)), [np.int64(1), 2, np.uint8(3)]):
        got = _acceptance_curves(P, Q, ks)
        assert got.ks.tolist() == [1, 2, 3]
        for m in want.values:
            assert np.array_equal(got.values[m], want.values[m])
    big = _acceptance_curves(P, Q, [2**63 - 1])
    assert big.values["otm"].tolist() == [otm.alpha_k(P, Q, 2**63 - 1)]


def test_membership_plan_keys_of_any_integer_kind():
    """Tuples, lists, sets, numpy rows and numpy ints: the optimum of the tuples (an independent value: the
    membership LP of single-token keys is the maximal coupling, ``sum min(w, q)``)."""
    want = otm.membership_plan([(0,), (1,)], [0.5, 0.5], [0.25, 0.75])[0]
    assert abs(want - 0.75) <= 1e-9
    for keys in ([[0], [1]], np.array([[0], [1]]), [{0}, (np.int64(1),)]):
        assert otm.membership_plan(keys, np.array([0.5, 0.5]), [0.25, 0.75])[0] == want


def test_seed_for_is_the_same_in_another_process():
    """The seeds of every accepted kind of part are reproducible across processes (main: ``None`` was not)."""
    code = ("from otspec.testing import seed_for; import numpy as np; "
            "print(seed_for(1, 2.5, 'a', [0.5, 0.5], (1, 'b'), np.int64(3), np.arange(3), True))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert int(out) == testing.seed_for(1, 2.5, "a", [0.5, 0.5], (1, "b"), np.int64(3), np.arange(3), True)
    testing.seed_for(_nested(199))  # deep, but within the limit


def test_khisti_acceptance_one_tolerances():
    """Finite non-negative tolerances answer as before; ints and numpy floats as the float they equal."""
    p, q = [0.5, 0.5], [0.4, 0.6]
    assert md.khisti_acceptance_one(p, q) is True
    assert md.khisti_acceptance_one([0.9, 0.1], [0.5, 0.5]) is False
    assert md.khisti_acceptance_one([0.9, 0.1], [0.5, 0.5], tol=1) is True
    assert md.khisti_acceptance_one(p, q, tol=np.float32(0.0)) == md.khisti_acceptance_one(p, q, tol=0.0)


@regression
def test_decoding_adapters_name_their_parameters():
    torch = pytest.importorskip("torch")
    from otspec.decoding import CallableLM, HFCausalLM

    def fn(ids):
        return torch.zeros(ids.shape + (3,), dtype=torch.float64)

    _refused(lambda: CallableLM(fn, 3, device="nodev"), "device")
    _refused(lambda: CallableLM(fn, 3, device=object()), "device")
    _refused(lambda: CallableLM(fn, 3, name=5), "name")
    lin = torch.nn.Linear(2, 2).train()
    _refused(lambda: HFCausalLM(lin), "model")
    assert lin.training  # refused before model.eval(): the module is left as it was
    assert CallableLM(fn, 3, device="cpu", name="toy").name == "toy"


# ------------------------------------------------------------------------------------------------------------
# 3. runtime guards: refused before any work, in a child process whose address space is capped
# ------------------------------------------------------------------------------------------------------------

#: (name, code evaluated in the child, fragments the message must contain)
GUARDS = [
    ("block_efficiency_mc n_samples=10**9", "spt.block_efficiency_mc(M2, T2, 1, 2, n_samples=10**9, rng=0)",
     ("`n_samples`", "MAX_MC_SAMPLES")),
    ("synthetic_llm_pair n=10**12", "PL.synthetic_llm_pair(10**12)", ("`n`", "MAX_SYNTHETIC_VOCAB")),
    ("synthetic_llm_pair n=10**8", "PL.synthetic_llm_pair(10**8)", ("`n`", "MAX_SYNTHETIC_VOCAB")),
    ("uniform_pair d=10**12", "PM.uniform_pair(10**12, 3)", ("`d`", "MAX_UNIFORM_SUPPORT")),
    ("uniform_pair d_q=10**8", "PM.uniform_pair(3, 10**8)", ("`d_q`", "MAX_UNIFORM_SUPPORT")),
    ("acceptance_curves ks=range(1, 10**12)", "PM.acceptance_curves(U(3), D(3), range(1, 10**12))",
     ("`ks`", "MAX_CURVE_POINTS")),
    ("acceptance_curves ks=generator", "PM.acceptance_curves(U(3), D(3), (k for k in range(1, 10**12)))",
     ("`ks`", "MAX_CURVE_POINTS")),
    ("plot_spectr_fig4 ks", "PM.plot_spectr_fig4(ks=range(1, 10**12))", ("`ks`", "MAX_CURVE_POINTS")),
    ("plot_spectr_fig6 bs x ks", "PM.plot_spectr_fig6(bs=[0.5] * 1000, ks=range(1, 100))",
     ("`bs`", "`ks`", "MAX_CURVE_POINTS")),
    ("plot_spectr_fig5 d", "PM.plot_spectr_fig5(d=10**12, d_qs=(5,), ks=(1,))", ("`d`", "MAX_UNIFORM_SUPPORT")),
    ("plot_spectr_fig5 d_qs", "PM.plot_spectr_fig5(d_qs=range(1, 10**12))", ("`d_qs`", "MAX_CURVE_POINTS")),
    ("plot_acceptance_vs_b bs", "PM.plot_acceptance_vs_b(bs=range(10**12))", ("`bs`", "MAX_CURVE_POINTS")),
    ("plot_acceptance_vs_b bs x ks", "PM.plot_acceptance_vs_b(bs=np.zeros(5000), ks=range(1, 5))",
     ("`bs`", "`ks`", "MAX_CURVE_POINTS")),
    ("plot_expected_tokens gammas", "PL.plot_expected_tokens(range(1, 10**12))", ("`gammas`", "MAX_CURVE_POINTS")),
    ("plot_optimal_gamma cs", "PL.plot_optimal_gamma(cs=range(1, 10**12))", ("`cs`", "MAX_CURVE_POINTS")),
    ("figure2_data ps", "PB.figure2_data(ps=[0.5] * 10**6)", ("`ps`", "MAX_CURVE_POINTS")),
    ("figure2_data ps x 2**L_max", "PB.figure2_data(ps=[0.5] * 17, L_max=16)", ("`ps`", "`L_max`", "MAX_FIGURE2_BLOCKS")),
    ("plot_lossy_frontier n_points", "PL.plot_lossy_frontier(U(3), D(3), n_points=10**12)",
     ("`n_points`", "MAX_CURVE_POINTS")),
    ("plot_lossy_frontier ls", "PL.plot_lossy_frontier(U(3), D(3), ls=range(10**12))", ("`ls`", "MAX_CURVE_POINTS")),
    ("plot_lossy_rules weights", "PL.plot_lossy_rules(U(3), D(3), weights=range(10**12))",
     ("`weights`", "MAX_CURVE_POINTS")),
    ("check_sampler k=10**8", "otspec.testing.check_sampler(lambda p, q, d, r: d[0], U(3), D(3), k=10**8, rng=0)",
     ("`k`", "MAX_HARNESS_DRAFTS")),
    ("check_block_sampler L=10**8", "otspec.testing.check_block_sampler(lambda b, r: b, M2, T2, 10**8, rng=0)",
     ("`L`",)),
    ("check_block_sampler k=10**12", "otspec.testing.check_block_sampler(lambda b, r: b, M2, T2, 1, k=10**12)",
     ("`k`", "MAX_HARNESS_DRAFTS")),
    ("bernoulli_alpha_k Fraction k=10**12", "cf.bernoulli_alpha_k(Fraction(1, 3), Fraction(1, 2), 10**12)",
     ("`k`", "MAX_EXACT_BITS")),
    ("uniform_alpha_k exact k=10**12", "cf.uniform_alpha_k(5, 3, 10**12, exact=True)", ("`k`", "MAX_EXACT_BITS")),
]

SETUP = """
from fractions import Fraction
import numpy as np
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import otspec, otspec.testing
import otspec.closed_form as cf
import otspec.spectr as spt
import otspec.plotting.block as PB
import otspec.plotting.lossy as PL
import otspec.plotting.multidraft as PM
from otspec.models import MemorylessModel

def U(n):
    return np.full(n, 1.0 / n)

def D(n):
    return np.random.default_rng(0).dirichlet(np.ones(n))

def AFTER_EACH():
    plt.close("all")

M2, T2 = MemorylessModel([0.5, 0.5]), MemorylessModel([0.25, 0.75])
PL.plot_lossy_frontier(U(3), D(3), n_points=3); PM.plot_spectr_fig4(bs=(0.5,), ks=(1,)); plt.close("all")
spt.block_efficiency_mc(M2, T2, 1, 2, n_samples=2, rng=0)  # scipy loaded before the cap
"""


@pytest.fixture(scope="module")
def guard_results():
    pytest.importorskip("resource")
    pytest.importorskip("matplotlib")
    # each probe is also limited in the child (SIGALRM): a hang is one failed row, not a stuck suite
    return run_probes(GUARDS, SETUP, headroom=HEADROOM, alarm=2 * SECONDS)


@regression
@pytest.mark.parametrize("name, code, fragments", GUARDS, ids=[g[0] for g in GUARDS])
def test_guard_refuses_before_allocating(guard_results, name, code, fragments):
    status, msg, secs = guard_results[name]
    assert status == "refused", f"{code}: {status} {msg}"
    for f in fragments:
        assert f in msg, msg
    assert secs < SECONDS, f"{code} took {secs:.1f} s to refuse"


def test_caps_allow_the_documented_uses():
    """Every default and documented use is below its cap (docs/guide/spectr.rst: n_samples=2000; experiments:
    4000; SpecTr Figure 5: d = 120, 30 ks; the plots' default grids; the harness's k <= 4)."""
    from otspec.plotting._common import MAX_CURVE_POINTS
    from otspec.plotting.lossy import MAX_SYNTHETIC_VOCAB
    from otspec.plotting.multidraft import MAX_UNIFORM_SUPPORT
    from otspec.spectr._mc import MAX_MC_SAMPLES

    assert MAX_MC_SAMPLES >= 4000 and MAX_SYNTHETIC_VOCAB >= 2**18 and MAX_UNIFORM_SUPPORT >= 120
    assert MAX_CURVE_POINTS >= 201 * 4 and testing.MAX_HARNESS_DRAFTS >= 4 and cf.MAX_EXACT_BITS >= 10**5
    assert otspec.spectr.block_efficiency_mc(D3, T3, 1, 2, n_samples=2, rng=0).n_samples == 2
