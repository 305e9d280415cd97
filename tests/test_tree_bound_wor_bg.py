"""The race's quadrature from t0 = 5e-3 (otspec.tree._bound._left_end): the nodes it leaves out bounded and added.

The trapezoidal rule in log t (step h) adds at each node t the integrand h t p_y e^{-p_y t} P(N_{-y}(t) = r);
``_left_end`` adds an upper bound on the nodes t0 e^{-kh}, k >= 1, that the rule leaves out, from the row's
elementary symmetric polynomials, to second order in t (about p_y e_r(p_{-y}) h t0^{r+1} / (e^{(r+1)h} - 1)).
Independent routes here: the left-out nodes summed from the Poisson-binomial law of N_{-y}(t) (a recursion over
the tokens, every node), e_r of the row without y by multiplying out prod (1 + p_x z), the race started at
t0 = 1e-7 (whose left-out part is below 1e-21 of each law) and the coupling optimum (LP).

Checked: each added amount is at least the nodes it stands for and exceeds them by at most the stated
p_y e_r(p_{-y}) c h t0^{r+3} / (e^{(r+3)h} - 1), c = s/6 + s^2/2 (+ 1e-12 of the bound's scale); every race law
and every bound B at least the reference's (the safe side, up to the rules' rounding) and above it by at most the
stated amount; B >= OPT_c.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otspec.models import random_markov_model
from otspec.tree import TreeShape, bound, optimum
from otspec.tree import _bound as B
from otspec.tree._bound import _wor_draw_laws

N_TERMS = 48


def _adversarial_row(kind: str, V: int, rng) -> np.ndarray:
    """A draft row: zeros and ties, subnormal entries, near-one-hot, flat, LLM-like (softmax of wide logits)."""
    if kind == "grid":
        p = rng.choice([0.0, 0.0, 1.0, 1.0, 2.0, 5.0, 40.0], V)
    elif kind == "subnormal":
        p = rng.choice([0.0, 5e-324, 1e-310, 1e-300, 1.0, 0.5], V)
    elif kind == "near-one-hot":
        p = np.full(V, 1e-9)
        p[rng.integers(V)] = 1.0
    elif kind == "flat":
        p = np.ones(V)
    else:
        z = rng.normal(0.0, rng.uniform(1.0, 6.0), V)
        p = np.exp(z - z.max())
    if np.count_nonzero(p) < 3:
        p[:3] = 1.0
    return p / p.sum()


def _esym(p: np.ndarray, R: int) -> np.ndarray:
    """e_0 .. e_R of the entries of ``p``: prod_x (1 + p_x z) multiplied out (nonnegative terms only)."""
    e = np.zeros(R + 1)
    e[0] = 1.0
    for x in p:
        e[1:] = e[1:] + x * e[:-1]
    return e


def _left_out(p: np.ndarray, y: int, r: int, h: float, t0: float) -> float:
    """h sum_{k >= 1} t_k p_y e^{-p_y t_k} P(N_{-y}(t_k) = r), t_k = t0 e^{-kh}: the nodes the rule leaves out,
    P(N_{-y}(t) = r) from the Poisson-binomial recursion over the tokens other than y."""
    t = t0 * np.exp(-h * np.arange(1, 400))
    pb = np.zeros((t.size, r + 1))
    pb[:, 0] = 1.0
    for x in range(p.size):
        if x == y or p[x] == 0.0:
            continue
        q = -np.expm1(-p[x] * t)[:, None]
        pb[:, 1:] = pb[:, 1:] * (1.0 - q) + pb[:, :-1] * q
        pb[:, 0] *= 1.0 - q[:, 0]
    return math.fsum((h * t * p[y] * np.exp(-p[y] * t) * pb[:, r]).tolist())


def _added(p: np.ndarray, ranks: list, K: int):
    """What ``_left_end`` adds to each token's law of each rank (``(ranks, V)``; step h), with the ``K`` most likely
    tokens as the head (ties to the lower id) and the others as the tail's Taylor polynomial."""
    V = p.size
    order = np.lexsort((np.arange(V), -p))
    head = order[:K]
    tail = np.setdiff1d(np.arange(V), head)
    ph = p[head][None, :]
    pmax = np.array([p[tail].max() if tail.size else 0.0])
    nu = np.zeros((1, N_TERMS + 1))
    if pmax[0] > 0:
        y = p[tail] / pmax[0]
        nu[0, 1:] = [math.fsum((y**n).tolist()) for n in range(1, N_TERMS + 1)]
    nk = len(ranks)
    HL, HL2 = np.zeros((1, nk, K)), np.zeros((1, nk, K))
    C, C2 = np.zeros((1, nk, N_TERMS + 1)), np.zeros((1, nk, N_TERMS + 1))
    B._left_end(ranks, None, ph, np.ones(1, bool), HL, HL2, C, C2, pmax, nu)
    out = np.zeros((nk, V))
    for k in range(nk):
        out[k, head] = HL[0, k]
        if tail.size and pmax[0] > 0:
            x = p[tail] / pmax[0]
            out[k, tail] = p[tail] * np.polynomial.polynomial.polyval(x, C[0, k])
    return out


@settings(max_examples=40, deadline=None)
@given(V=st.integers(3, 50), kind=st.sampled_from(["grid", "subnormal", "near-one-hot", "flat", "llm"]),
       seed=st.integers(0, 10**6), K=st.sampled_from([1, 3, 32]))
def test_left_end_bounds_the_nodes_left_out(V, kind, seed, K):
    """Each token's added amount (head tokens by dividing out their factor, tail tokens by the polynomial in p_y)
    is at least the nodes before t0 that the rule leaves out, summed from the Poisson-binomial law, and exceeds
    them by at most the stated p_y e_r(p_{-y}) c h t0^{r+3} / (e^{(r+3)h} - 1) plus the 1e-12 margin. Fails with
    the integral over [0, t0] added instead of the left-out nodes (about 1.2x them at rank 2), with e_r(p) in
    place of e_r(p_{-y}) at sizeable p_y, without the first-order terms, or a sign of Newton's identities or of the
    polynomial wrong."""
    p = _adversarial_row(kind, V, np.random.default_rng(seed))
    ranks = [r for r in (2, 3, 5) if r < np.count_nonzero(p)]
    if not ranks:
        return
    K = min(K, V)
    h, t0 = B._race_step(max(ranks)), B._RACE_T0
    got = _added(p, ranks, K)
    for k, r in enumerate(ranks):
        scale = h * t0 ** (r + 1) / math.expm1((r + 1) * h)
        for y in np.flatnonzero(p).tolist():
            ex = _left_out(p, y, r, h, t0)
            er = _esym(np.delete(p, y), r)[r]
            slack = p[y] * er * (2 / 3) * h * t0 ** (r + 3) / math.expm1((r + 3) * h)
            margin = 2e-12 * p[y] * scale
            assert got[k, y] >= ex * (1 - 1e-13) - 1e-300, (r, y, got[k, y], ex)
            assert got[k, y] - ex <= slack + margin + 1e-13 * ex + 1e-300, (r, y, got[k, y] - ex, slack)


def test_left_end_is_the_left_out_nodes_not_the_integral():
    """At p uniform on 3 tokens (each law of rank 2 is 1/3) the race from t0 = 5e-3 gives each law within 2e-14
    of 1/3 and at least it; adding the integral over [0, t0] instead of the nodes left out gives about 1/3 + 3e-10
    (the rule's full-weight first node then counted twice in part), which this fails."""
    p = np.array([0.0, 1.0, 1.0, 1.0]) / 3
    assert B._RACE_T0 == 5e-3
    got, ex = _wor_draw_laws(p, [0, 1, 2], exact_limit=0)
    assert ex
    d = got[2, 0, 1:] - 1 / 3
    assert (d >= -2e-16).all() and (d <= 2e-14).all(), d


@settings(max_examples=25, deadline=None)
@given(V=st.sampled_from([4, 7, 13, 50, 400, 3000]),
       kind=st.sampled_from(["grid", "subnormal", "near-one-hot", "flat", "llm"]), seed=st.integers(0, 10**6))
def test_race_laws_on_the_safe_side_of_the_reference(V, kind, seed):
    """Every race law (ranks 2, 3, 5, 7) from t0 = 5e-3 against the same race from t0 = 1e-7 (whose left-out part
    is below 1e-21 of each law): at least it (within the rounding of the two rules' sums of some 120 nodes on
    different grids, 1e-14 relative; measured up to 2.1e-15) and above it by at most
    the stated slack (1.5e-13 p at rank 2, less above). Fails when nothing is added before t0 (the laws
    then lie below by about the left part, some 1e-8 relative at rank 2)."""
    rng = np.random.default_rng(seed)
    p = _adversarial_row(kind, V, rng)
    n = int(np.count_nonzero(p))
    ranks = [0, 1] + [r for r in (2, 3, 5, 7) if r < n]
    if len(ranks) == 2 or math.perm(n, min(n, max(ranks) + 1)) * V <= 10**4:
        return
    got, ex = _wor_draw_laws(p, ranks, exact_limit=0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(B, "_RACE_T0", 1e-7)
        ref, ex2 = _wor_draw_laws(p, ranks, exact_limit=0)
    if not (ex and ex2):
        return
    for k, r in enumerate(ranks):
        if r < 2:
            continue
        d = got[k, 0] - ref[k, 0]
        assert (d >= -1e-14 * ref[k, 0] - 1e-300).all(), (r, d.min())
        assert (d <= 1.5e-13 * p + 1e-14 * ref[k, 0] + 1e-300).all(), (r, d.max())


def _pair(V: int, seed: int):
    rng = np.random.default_rng(seed)
    return (random_markov_model(V, concentration=float(rng.choice([0.2, 1.0, 5.0])), rng=rng),
            random_markov_model(V, concentration=float(rng.choice([0.2, 1.0, 5.0])), rng=rng))


@pytest.mark.parametrize("shape", [TreeShape.branching(3, 1), TreeShape.chains(3, 2),
                                   TreeShape([(0,), (1,), (2,), (0, 0), (0, 1), (0, 2)])])
@pytest.mark.parametrize("V, seed", [(3, 0), (4, 1), (5, 2), (5, 3)])
def test_bound_above_the_reference_and_the_optimum(shape, V, seed, monkeypatch):
    """Without replacement, the enumeration refused (the race everywhere): B from t0 = 5e-3 is at least B from
    t0 = 1e-7 (the rules' rounding aside, 1e-14) and above it by at most 1e-12, and at least OPT_c (LP)."""
    draft, target = _pair(V, seed)
    oc = optimum(shape, draft, target, process="wor", one_token=False).value
    monkeypatch.setattr(B, "_MAX_WOR_ENUMERATION", 0)
    new = bound(shape, draft, target, process="wor", budget=10_000)
    monkeypatch.setattr(B, "_RACE_T0", 1e-7)
    ref = bound(shape, draft, target, process="wor", budget=10_000)
    assert new.pi_exact and ref.pi_exact and new.complete
    assert new.value >= ref.value - 1e-14
    assert new.value - ref.value <= 1e-12
    assert (new.per_depth >= ref.per_depth - 1e-14).all()
    assert new.value >= oc - 1e-8


@pytest.mark.slow
def test_last_depth_rows_at_the_real_vocabulary(monkeypatch):
    """Rows of the last expanded depth at V = 49,152 (LLM-like draft and target rows, ``branching(8, 7)``): each
    row's sum from t0 = 5e-3 at least the one from t0 = 1e-7 (1e-14 relative) and above it by at most 1e-12
    relative."""
    rng = np.random.default_rng(7)
    V, m = 49_152, 3
    slots = B._Slots(TreeShape.branching(8, 7))
    z = rng.normal(0.0, 3.0, (2, m, V))
    e = np.exp(z - z.max(axis=2, keepdims=True))
    P, Q = e / e.sum(axis=2, keepdims=True)

    def run():
        fr = [B._Prefix((i,), 0.6, 0.5, np.full(slots.n_at[1], 0.7 / slots.n_at[1]), (0.02,), {}) for i in range(m)]
        assert B._expand_rows(slots, "wor", fr, list(P), list(Q), 10**6)[0] is None
        return np.array([u.exact for u in fr])

    new = run()
    monkeypatch.setattr(B, "_RACE_T0", 1e-7)
    ref = run()
    assert (new >= ref * (1 - 1e-14)).all()
    assert (new - ref <= 1e-12 * ref).all()
