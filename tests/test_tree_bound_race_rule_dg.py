"""The race's trapezoidal rule in log t: its step from a proven error bound, its right end from a proven tail bound.

``otspec.tree._bound._race_rule_error(r, h)`` bounds the rule's relative error over the whole log t line for every
law of rank ``r`` (Trefethen and Weideman, "The exponentially convergent trapezoidal rule", SIAM Review 56(3),
2014, Thm 5.1, with the integrand's bound on the strip |Im log t| < a: cos(a)^-(r+1) times the law itself);
``_race_step(r)`` is the largest step whose bound is at most 1e-15. ``_bound_kernels.race_right_sum`` bounds the
nodes after the rule's last one. Independent routes here: the laws of the draws without replacement in exact
rational arithmetic (``fractions``: the law of the set of the first draws, subset by subset), the Poisson-binomial
law of the count at each left-out node (a recursion over the tokens), and the kernel run from t = 1e-14 (whose
left part, O(t^(r+1)), is below 1e-40 of each law).
"""

from __future__ import annotations

import math
from fractions import Fraction
from itertools import combinations

import numpy as np
import pytest

from otspec.tree import _bound as B
from otspec.tree import _bound_kernels as K
from otspec.tree._bound import _wor_draw_laws

N_TERMS = 48
#: Rows with extreme laws: one token of nearly all the mass, uniform, ties, tiny masses beside large ones, zeros.
ROWS = {
    "near-one-hot": [1.0, 1e-9, 1e-9, 1e-9, 1e-9],
    "near-one-hot-2": [1.0 - 3e-6, 1e-6, 1e-6, 1e-6],
    "uniform": [1.0] * 6,
    "ties": [3.0, 3.0, 1.0, 1.0, 1.0, 0.0, 2.0],
    "tiny": [0.5, 0.3, 1e-12, 0.2, 1e-7, 1e-4],
    "geometric": [2.0**-k for k in range(8)],
}


def _exact_laws(p: np.ndarray, R: int) -> list:
    """``laws[r][y]`` (Fractions) for r < R: P(the draw of rank r is y), from the exact rationals of ``p``: the law
    f(S) of the set of the first |S| draws, f(S) = sum_{x in S} f(S - x) p_x / (1 - p(S - x)), then
    P(draw r = y) = sum_{|S| = r, y not in S} f(S) p_y / (1 - p(S))."""
    q = [Fraction(float(v)) for v in p]
    tot = sum(q)
    q = [v / tot for v in q]
    V = len(q)
    f = {(): Fraction(1)}
    laws = []
    for r in range(R):
        laws.append([Fraction(0)] * V)
        for S, fs in f.items():
            rest = 1 - sum(q[x] for x in S)
            if rest == 0:
                continue
            for y in range(V):
                if y not in S:
                    laws[r][y] += fs * q[y] / rest
        g: dict = {}
        for S in combinations(range(V), r + 1):
            acc = Fraction(0)
            for x in S:
                T = tuple(z for z in S if z != x)
                rest = 1 - sum(q[z] for z in T)
                if rest != 0:
                    acc += f.get(T, Fraction(0)) * q[x] / rest
            g[S] = acc
        f = g
    return laws


def _rule(p: np.ndarray, ranks: np.ndarray, h: float):
    """The kernel's rule with every token in the head (no tail) from t = 1e-14 at step ``h``: ``(HL (ranks, V),
    nodes)``, laws in the row's own order."""
    order = np.argsort(-p, kind="stable")
    kh = int(np.count_nonzero(p))
    ph = p[order][None, :].copy()
    deg = int(ranks.max()) + 1
    nk, V = ranks.size, p.size
    HL, HL2 = np.zeros((1, nk, V)), np.zeros((1, nk, V))
    C, C2, info = np.zeros((1, nk, N_TERMS + 1)), np.zeros((1, nk, N_TERMS + 1)), np.zeros((1, 3))
    K.race_rows(ph, np.array([kh]), np.zeros(1), np.zeros((1, N_TERMS + 1)), ranks, deg, h, math.log(1e-14),
                B._stirling(deg, N_TERMS), 20_000, HL, HL2, C, C2, info, np.array([True]))
    assert info[0, 2] == 1.0, info
    out = np.zeros((nk, V))
    out[:, order] = HL[0]
    return out, int(info[0, 1])


@pytest.mark.parametrize("name", sorted(ROWS))
def test_rule_error_within_the_proven_bound(name):
    """At steps 1/2, 1/3, 1/4 and the chosen step, each law of ranks 2 .. 4 from the whole-line rule lies within
    E_r(h) times the exact law (rationals), plus the rounding of a few hundred positive terms (1e-14 relative) and
    the right end's 1e-17 p_y. The bound is not vacuous: at step 1/2 some law's error is above 1e-7 of it, and at
    step 1/3 above the chosen step's 1e-15 (with the rounding), so the chosen step's check fails for a step too
    large (1/3 or 1/4 at these ranks: measured up to 1.5e-8 and 2.5e-12 of the law, against proven 3.3e-8 and
    7e-12)."""
    p = np.asarray(ROWS[name], dtype=np.float64)
    p = p / p.sum()
    ranks = np.array([r for r in (2, 3, 4) if r < np.count_nonzero(p)], dtype=np.int64)
    ex = _exact_laws(p, int(ranks.max()) + 1)
    worst = {}
    for h in (0.5, 1 / 3, 0.25, B._race_step(int(ranks.max()))):
        got, _ = _rule(p, ranks, h)
        worst[h] = 0.0
        for k, r in enumerate(ranks.tolist()):
            E = B._race_rule_error(r, h)
            for y in np.flatnonzero(p).tolist():
                e = float(ex[r][y])
                err = abs(Fraction(float(got[k, y])) - ex[r][y])
                assert err <= (E + 1e-14) * e + K.RACE_RIGHT_TOL * p[y] + 1e-300, (name, h, r, y, float(err) / e, E)
                if e > 0:
                    worst[h] = max(worst[h], float(err) / e)
    h0 = B._race_step(int(ranks.max()))
    assert worst[h0] <= B._RACE_RULE_RTOL + 2e-15, worst       # measured up to 6e-16 at the chosen step
    assert worst[0.5] > 1e-7 and worst[1 / 3] > B._RACE_RULE_RTOL + 2e-15, worst


def test_rule_error_bound_against_a_fine_grid():
    """_race_rule_error at the minimising strip against a fine search of the strip's half-width (the minimum over
    the 2048 widths within 1 % of the fine one, never below it), increasing in r and in h; _race_step's bound at
    most 1e-15 and the next multiple of 1/1024 above it."""
    a = np.linspace(1e-6, 0.5 * np.pi - 1e-6, 400_001)
    for r in (2, 3, 6, 7, 15):
        for h in (0.125, 0.2, 0.25, 0.5):
            fine = np.min(2 * np.cos(a) ** (-(r + 1)) / np.expm1(2 * np.pi * a / h))
            got = B._race_rule_error(r, h)
            assert fine <= got <= 1.01 * fine, (r, h, got, fine)
        h = B._race_step(r)
        assert B._race_rule_error(r, h) <= B._RACE_RULE_RTOL < B._race_rule_error(r, h + 1 / 1024)
    assert B._race_rule_error(3, 0.2) > B._race_rule_error(2, 0.2) and B._race_rule_error(3, 0.25) > \
        B._race_rule_error(3, 0.2)
    # a tiny step (e^{2 pi a / h} beyond the floats): 0, without an overflow warning (an error in this suite)
    assert B._race_rule_error(5, 1 / 1024) == 0.0 and B._race_step(3000) >= 1 / 1024


def _G(p: np.ndarray, t: float, d: int, tail: bool) -> float:
    """t P(N(t) <= d) (times e^{-p_min t} without a tail), N(t) the count of rung clocks, by the recursion."""
    pb = np.zeros(d + 1)
    pb[0] = 1.0
    for x in p[p > 0]:
        b = -math.expm1(-x * t)
        pb[1:] = pb[1:] * (1 - b) + pb[:-1] * b
        pb[0] *= 1 - b
    g = t * math.fsum(pb.tolist())
    return g if tail else g * math.exp(-p[p > 0].min() * t)


@pytest.mark.parametrize("name", sorted(ROWS))
@pytest.mark.parametrize("nhead", [2, 100])
@pytest.mark.parametrize("d", [3, 5])
def test_right_end_bounds_the_nodes_left_out(name, nhead, d):
    """race_right_sum(T) G(T) is at least sum_{k >= 1} G(T e^{kh}) (the nodes after T, each summed to 200 further
    nodes), at several T from where the rule may stop on, with the row split into a head of ``nhead`` tokens and
    a tail. Fails with the whole mass as the rate in place of the mass outside the d largest probabilities (the
    rows with most of their mass in d tokens)."""
    p = np.asarray(ROWS[name], dtype=np.float64)
    p = np.sort(p / p.sum())[::-1]
    ph = p[:nhead][p[:nhead] > 0]
    tail = p[nhead:][p[nhead:] > 0]
    mL, pmax = float(tail.sum()), float(tail.max()) if tail.size else 0.0
    rate = K.race_right_rate(ph, pmax, mL, d, mL > 0)
    h = B._race_step(d - 1)
    for T in (1.0, 10.0, 100.0, 1e4, 1e7, 1e10):
        g0 = _G(p, T, d, mL > 0)
        if g0 == 0.0:
            continue
        left = math.fsum(_G(p, T * math.exp(k * h), d, mL > 0) for k in range(1, 200))
        bound = K.race_right_sum(T, rate, h, d) * g0
        assert left <= bound * (1 + 1e-12), (name, T, left, bound)


def test_race_laws_against_exact_rationals():
    """The race as the bound runs it (``_wor_draw_laws`` with the enumeration refused: the chosen step, from t0 =
    5e-3 with the left end added, the right end's stop, head and tail) on the rows above, ranks 2 .. 4: each law
    within 1e-15 of it (the rule) + 1e-14 (rounding) of the exact law, on the safe side up to those, and above it
    by at most the left end's 1.5e-13 p_y."""
    for name, row in ROWS.items():
        p = np.asarray(row, dtype=np.float64)
        p = p / p.sum()
        R = min(5, int(np.count_nonzero(p)))
        got, ok = _wor_draw_laws(p, list(range(R)), exact_limit=0)
        assert ok, name
        ex = _exact_laws(p, R)
        for r in range(2, R):
            for y in range(p.size):
                e = float(ex[r][y])
                assert got[r, 0, y] >= e * (1 - 1e-14 - B._RACE_RULE_RTOL) - 1e-300, (name, r, y, got[r, 0, y], e)
                assert got[r, 0, y] <= e * (1 + 1e-14 + B._RACE_RULE_RTOL) + 1.5e-13 * p[y] + 1e-300, (
                    name, r, y, got[r, 0, y], e)


def test_right_end_not_reached_before_the_last_node_is_refused():
    """A row whose mass outside its 7 largest probabilities is 1e-300 (subnormal entries): its right end lies past
    every float's t, so the rule stops at t = e^500 (RACE_LOG_TMAX) and refuses the row, whose laws then take the
    stated upper bound; no node at t = inf (at step about 1/5.4, 4,000 nodes from 5e-3 pass e^709: the products
    there were NaN and numpy warned, an error in this suite)."""
    p = np.array([1.0 - 3e-6, 2e-300, 2e-300, 1e-323, 1e-323, 1e-6, 1e-6, 1e-6, 1e-323])
    race = B._Race(p[None, :], [2, 3, 4, 5, 6], [0])
    assert not race.ok[0]
    ph = np.sort(p)[::-1][None, :].copy()
    ranks = np.arange(2, 7, dtype=np.int64)
    HL, HL2 = np.zeros((1, 5, 9)), np.zeros((1, 5, 9))
    C, C2, info = np.zeros((1, 5, N_TERMS + 1)), np.zeros((1, 5, N_TERMS + 1)), np.zeros((1, 3))
    K.race_rows(ph, np.array([9]), np.zeros(1), np.zeros((1, N_TERMS + 1)), ranks, 7, B._race_step(6),
                math.log(B._RACE_T0), B._stirling(7, N_TERMS), 4000, HL, HL2, C, C2, info, np.array([True]))
    assert info[0, 2] == 0.0 and np.isfinite(info).all() and np.isfinite(HL).all()
    assert info[0, 0] <= math.exp(K.RACE_LOG_TMAX)
    got, ok = _wor_draw_laws(p, list(range(7)), exact_limit=0)
    assert np.isfinite(got).all()
