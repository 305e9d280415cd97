"""The last expanded depth's recheck without replacement: a lower bound on P(x in S_n) split on the top token.

``_bound_kernels.wor_recheck_lower`` bounds the probability that token ``x`` is among the first ``n`` draws without
replacement from below by :math:`I_2 + (1 - I_2)(1 - b^m) + (b^m - a^m) L` (:math:`m = n - 2`, :math:`b = 1 - p_x`,
:math:`a = 1 - p_x / (1 - p_t)`, :math:`L = P(x \\notin S_2, t \\in S_2)`, ``t`` the most likely token); entries
whose target mass is below it are decided without the race. Independent routes here: the ordered draws enumerated
(``V <= 7``), the exponential race of :func:`otspec.tree._bound._wor_draw_laws` (``V`` up to 5,000), the numpy
block route (the row kernels off) and the coupling optimum (LP).

Checked: the bound never exceeds the enumerated or raced inclusion probability (adversarial rows: ties, zeros,
subnormal entries, near-one-hot, flat, LLM-like) and is at least the earlier bound (the second draw's closed form
and :math:`p_x` per later draw); a last-depth row's sum equals the exact sum; ``B`` equals the block route's and is
at least :math:`\\mathrm{OPT}_c`.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otspec.models import random_markov_model
from otspec.tree import TreeShape, bound, optimum
from otspec.tree import _bound as B
from otspec.tree import _bound_kernels as K
from otspec.tree._bound import _wor_draw_laws

KINDS = ["grid", "subnormal", "near-one-hot", "flat", "llm", "two-top"]


def _row(kind: str, V: int, rng) -> np.ndarray:
    """A draft row: zeros and ties, subnormal entries, near-one-hot, flat, LLM-like, two large tokens."""
    if kind == "grid":
        p = rng.choice([0.0, 0.0, 1.0, 1.0, 2.0, 5.0, 40.0], V)
    elif kind == "subnormal":
        p = rng.choice([0.0, 5e-324, 1e-310, 1e-300, 1.0, 0.5], V)
    elif kind == "near-one-hot":
        p = np.full(V, 1e-9)
        p[rng.integers(V)] = 1.0
    elif kind == "flat":
        p = np.ones(V)
    elif kind == "two-top":
        p = rng.uniform(0.0, 1e-3, V)
        p[rng.choice(V, 2, replace=False)] = [0.6, 0.35]
    else:
        z = rng.normal(0.0, rng.uniform(1.0, 6.0), V)
        p = np.exp(z - z.max())
    if np.count_nonzero(p) < 2:
        p[:2] = 1.0
    return p / p.sum()


def _stats(p: np.ndarray):
    """``(top, p_top, S1, S2)`` of the row as the bound's kernels compute them (:func:`wor_row_stats`)."""
    V = p.size
    Kh = min(32, V)
    head, hval, nu, st_ = np.empty(Kh, np.int64), np.empty(Kh), np.zeros(49), np.zeros(7)
    K.wor_row_stats(p, Kh, False, head, hval, nu, np.zeros(V, bool), st_)
    top = int(st_[1])
    return top, float(p[top]), float(st_[5]), float(st_[6])


def _inclusion_enumerated(p: np.ndarray, n: int) -> np.ndarray:
    """``P(x in S_n)`` for every token: the ordered draws of ``n`` tokens of the support enumerated (each draw's
    denominator the mass of the tokens not drawn, summed, not subtracted from 1)."""
    sup = np.flatnonzero(p > 0).tolist()
    terms: dict = {x: [] for x in range(p.size)}
    for o in itertools.permutations(sup, n):
        pr = 1.0
        for k, x in enumerate(o):
            pr *= p[x] / math.fsum(p[y] for y in sup if y not in o[:k])
        for x in o:
            terms[x].append(pr)
    return np.array([math.fsum(terms[x]) for x in range(p.size)])


def _lower(p, n, top, pt, S1, S2, R=None) -> np.ndarray:
    """The kernel's bound on ``P(x in S_n)`` at every token (``dW`` the unit vector of place ``n - 1``)."""
    dW = np.zeros(R or n)
    dW[n - 1] = 1.0
    return np.array([K.wor_recheck_lower(float(p[v]), v, top, pt, S1, S2, dW) for v in range(p.size)])


def _earlier(p, n, top, S1, S2) -> np.ndarray:
    """The recheck's bound before the split: I_2 + (1 - I_2)(1 - (1 - p_x)^(n - 2)) (p_x alone at n = 1)."""
    out = np.empty(p.size)
    for v in range(p.size):
        x = float(p[v])
        if n == 1:
            out[v] = x
            continue
        i2 = min(1.0, x + K.second_draw_at(x, v, top, S1, S2))
        out[v] = min(1.0, i2 + (1.0 - i2) * x * sum((1.0 - x) ** i for i in range(n - 2)))
    return out


@settings(max_examples=60, deadline=None)
@given(V=st.integers(2, 7), kind=st.sampled_from(KINDS), seed=st.integers(0, 2**31 - 1))
def test_recheck_lower_below_the_enumerated_inclusion(V, kind, seed):
    """Every token, every n up to the support (at most 6): the bound is at most P(x in S_n) from the ordered draws
    enumerated (rounding aside, 1e-12 relative) and at least the earlier bound."""
    p = _row(kind, V, np.random.default_rng(seed))
    top, pt, S1, S2 = _stats(p)
    for n in range(1, min(np.count_nonzero(p), 6) + 1):
        exact = _inclusion_enumerated(p, n)
        lb = _lower(p, n, top, pt, S1, S2)
        assert (lb <= exact * (1.0 + 1e-12) + 1e-300).all(), (n, (lb - exact).max(), p)
        assert (lb >= _earlier(p, n, top, S1, S2) * (1.0 - 1e-12)).all(), n


def test_recheck_lower_tighter_on_a_peaked_row():
    """One token of 0.9: the earlier bound is about p_x (1 + S_1 + n - 2), the true inclusion about p_x (1 + 9 (n -
    1)); the split recovers most of it (n = 3, 6: at least 0.9, 0.7 of the exact value; the earlier bound at most
    0.55, 0.27; measured 0.917, 0.715 and 0.546, 0.267)."""
    V = 7
    p = np.array([0.9] + [0.1 / (V - 1)] * (V - 1))
    p[1] += 1e-4
    p[2] -= 1e-4
    top, pt, S1, S2 = _stats(p)
    for n, new_at_least, old_at_most in ((3, 0.9, 0.55), (6, 0.7, 0.27)):
        exact = _inclusion_enumerated(p, n)
        lb = _lower(p, n, top, pt, S1, S2)
        old = _earlier(p, n, top, S1, S2)
        assert (lb[1:] <= exact[1:]).all()
        assert (lb[1:] >= new_at_least * exact[1:]).all(), lb[1:] / exact[1:]
        assert (old[1:] <= old_at_most * exact[1:]).all(), old[1:] / exact[1:]


@settings(max_examples=20, deadline=None)
@given(V=st.sampled_from([9, 50, 400, 5000]), kind=st.sampled_from(KINDS), seed=st.integers(0, 2**31 - 1))
def test_recheck_lower_below_the_race(V, kind, seed):
    """At larger V: the bound at most P(x in S_n) summed from the race's exact draw laws (ranks 0 .. 6, 1e-12
    relative each; allowed 1e-11), n = 1 .. 7, at every token with p > 0."""
    p = _row(kind, V, np.random.default_rng(seed))
    if np.count_nonzero(p) < 8:
        p = np.where(p > 0, p, 1e-6)
        p /= p.sum()
    laws, _ = _wor_draw_laws(p[None, :], list(range(7)), exact_limit=0)
    top, pt, S1, S2 = _stats(p)
    pos = p > 0
    for n in range(1, 8):
        incl = laws[:n, 0].sum(axis=0)
        lb = _lower(p, n, top, pt, S1, S2)
        assert (lb[pos] <= incl[pos] * (1.0 + 1e-11) + 1e-300).all(), (n, (lb - incl)[pos].max())


def test_recheck_decides_only_entries_at_their_target():
    """Rows whose target sits near pi (Q_u q = 0.6 pi .. 1.4 pi): the entries the recheck decides have Q_u q <= pi
    (pi from the race), and the recheck decides some that the first pass left."""
    rng = np.random.default_rng(3)
    V = 3000
    for kind in ("llm", "two-top", "near-one-hot"):
        p = _row(kind, V, rng)
        laws, _ = _wor_draw_laws(p[None, :], list(range(7)), exact_limit=0)
        W = 0.9
        pi = np.minimum(1.0, W * laws[:, 0].sum(axis=0))
        Qu = 0.5
        q = pi * rng.uniform(0.6, 1.4, V) / Qu
        dW = np.zeros(7)
        dW[-1] = W
        idx = np.empty(V, np.int32)
        lo = np.zeros(3)
        K.wor_row_last(p, q, Qu, dW, idx, lo)
        first = idx[:int(lo[1])].copy()
        top, pt, S1, S2 = _stats(p)
        K.wor_row_recheck(p, q, Qu, idx, top, S1, S2, dW, lo)
        kept = set(idx[:int(lo[1])].tolist())
        decided = np.array([v for v in first.tolist() if v not in kept], dtype=np.int64)
        assert decided.size > 0, kind
        assert (Qu * q[decided] <= pi[decided]).all(), kind


def test_last_depth_rows_equal_the_exact_sums():
    """Rows of the last expanded depth (V = 4,000, ``branching(8, 7)``, targets near pi, LLM-like and peaked
    drafts): each row's sum equals sum_x min(Q_u q_x, pi_x) with pi from the race's laws (1e-12 relative)."""
    rng = np.random.default_rng(11)
    V, m = 4000, 4
    slots = B._Slots(TreeShape.branching(8, 7))
    A = np.full(slots.n_at[1], 0.7 / slots.n_at[1])
    P = np.stack([_row(k, V, rng) for k in ("llm", "two-top", "near-one-hot", "llm")])
    W = A.sum()
    pis = []
    for i in range(m):
        laws, _ = _wor_draw_laws(P[i:i + 1], list(range(7)), exact_limit=0)
        pis.append(np.minimum(1.0, W * laws[:, 0].sum(axis=0)))
    Qu = 0.6
    Q = np.stack([pi * rng.uniform(0.5, 1.5, V) for pi in pis]) / Qu
    Q /= Q.sum(axis=1, keepdims=True)
    fr = [B._Prefix((i,), Qu, 0.5, A.copy(), (0.02,), {}) for i in range(m)]
    assert B._expand_rows(slots, "wor", fr, list(P), list(Q), 10**6)[0] is None
    for i, u in enumerate(fr):
        ref = math.fsum(np.minimum(Qu * Q[i], pis[i]).tolist())
        assert abs(u.exact - ref) <= 1e-12 * ref, (i, u.exact, ref)


def _pair(V: int, seed: int):
    rng = np.random.default_rng(seed)
    return (random_markov_model(V, concentration=float(rng.choice([0.2, 1.0, 5.0])), rng=rng),
            random_markov_model(V, concentration=float(rng.choice([0.2, 1.0, 5.0])), rng=rng))


@pytest.mark.parametrize("shape", [TreeShape.branching(4), TreeShape.branching(1, 5), TreeShape.branching(1, 1, 3)])
@pytest.mark.parametrize("V, seed", [(5, 0), (6, 1), (6, 2), (7, 3)])
def test_bound_equals_the_block_route_and_tops_the_optimum(shape, V, seed, monkeypatch):
    """Without replacement, the enumeration refused (the race everywhere, the recheck at the last depth): B of the
    row kernels equals B of the numpy block route (pi at every entry; 1e-12) and is at least OPT_c (LP)."""
    draft, target = _pair(V, seed)
    oc = optimum(shape, draft, target, process="wor", one_token=False).value
    monkeypatch.setattr(B, "_MAX_WOR_ENUMERATION", 0)
    rows = bound(shape, draft, target, process="wor", budget=10_000)
    monkeypatch.setattr(K, "JIT", False)
    block = bound(shape, draft, target, process="wor", budget=10_000)
    assert rows.pi_exact and block.pi_exact and rows.complete
    assert abs(rows.value - block.value) <= 1e-12 * block.value
    assert rows.value >= oc - 1e-8
