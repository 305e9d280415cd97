"""Regressions found by the CJ fuzz campaign (the property and seeded tests rerun with other draws).

One class of inputs: a block or tree weight of exactly 1 (``w_i = 1``: the target gave every drafted token
so far at least the draft's probability). One-step block verification (Sun et al., "Block Verification
Accelerates Speculative Decoding", arXiv:2403.10444, published one-correction-token variant) and
Traversal Verification (Weng, Hu et al., arXiv:2505.12398) then take :math:`h = Z / (Z + 1 - w) = 1`
exactly. Evaluated as ``(Z + 1.0) - w`` the denominator rounds (``Z + 1`` loses the low bits of ``Z``), so
``h`` came out as ``1 +- eps`` -- about a quarter of such blocks gave ``h > 1`` and a law of the accepted
length with a negative entry (``P(tau = 0) = -8e-17``). ``Z + (1.0 - w)`` is exact in ``1 - w`` for
``w`` in ``[0.5, 1]`` (Sterbenz), so ``w = 1`` gives ``h = 1``. The independent route below is exact
rational arithmetic on the same float64 inputs.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from otspec.block._verifiers import tau_law_on_path
from otspec.tree import DraftTree
from otspec.tree._published import TraversalVerify, _chain_rule
from tests.test_tree_traversal_fast import _kids, _ref_sample, _ref_visits

# found with numpy seed 3 over 2000 such blocks: w_1 = 1 (q_1(3) >= p_1(3)); main gave P(tau = 0) = -8.06e-17
_BLOCK = (3, 0, 3)
_P = np.array([
    [0.47068275895638767, 0.25482554931649515, 0.20523417190055154, 0.06925751982656546],
    [0.20007419671428361, 0.5502352445115675, 0.00817895287731816, 0.2415116058968306],
    [0.2352907763123434, 0.062019400590946086, 0.13442693506178502, 0.5682628880349255],
    [0.3282618620193211, 0.10092003990869935, 0.23773306533748118, 0.33308503273449824],
])
_Q = np.array([
    [0.08515902744786238, 0.8242053725095406, 0.001467957822358347, 0.08916764222023868],
    [0.15178424145703223, 0.12097762664834161, 0.10368013117190641, 0.6235580007227197],
    [0.19516601047784846, 0.5378886899570792, 0.19663878872865911, 0.07030651083641312],
    [0.030112689508176894, 0.6341273017448955, 0.1606624170526492, 0.1750975916942786],
])


def _exact_onestep_law(block, P, Q):
    """The published rule's ``P(tau = t | X^L)`` in rationals (every float64 input exactly)."""
    L = len(block)
    F = [[Fraction(float(v)) for v in row] for row in P]
    G = [[Fraction(float(v)) for v in row] for row in Q]
    w = [Fraction(1)]
    for i, x in enumerate(block):
        w.append(min(Fraction(1), w[i] * G[i][x] / F[i][x]) if F[i][x] > 0 else w[i])
    h = [Fraction(1)]
    for i in range(1, L):
        Z = sum(max(w[i] * g - f, Fraction(0)) for f, g in zip(F[i], G[i]))
        den = Z + 1 - w[i]
        h.append(Z / den if den > 0 else Fraction(1))
    h.append(w[L])
    out, tail = [Fraction(0)] * (L + 1), Fraction(1)
    for t in range(L, -1, -1):
        out[t] = h[t] * tail
        tail *= 1 - h[t]
    return out, h


def test_block_onestep_law_at_a_weight_of_one_is_exact():
    law = tau_law_on_path("block-onestep", _BLOCK, _P, _Q)
    exact, h = _exact_onestep_law(_BLOCK, _P, _Q)
    assert h[1] == 1  # the class: w_1 = 1, so tau >= 1 surely
    assert law[0] == 0.0 and np.all(law >= 0.0)  # main: law[0] = -8.06e-17
    np.testing.assert_allclose(law, [float(e) for e in exact], rtol=1e-14, atol=1e-16)


def test_block_onestep_laws_never_negative_on_random_blocks_with_a_weight_of_one():
    rng = np.random.default_rng(3)
    hits = 0
    for _ in range(300):
        P = rng.dirichlet(np.ones(4), size=4)
        Q = rng.dirichlet(np.ones(4), size=4)
        block = tuple(int(x) for x in rng.integers(4, size=3))
        P[0][block[0]] = 0.5 * Q[0][block[0]]
        P[0] /= P[0].sum()
        law = tau_law_on_path("block-onestep", block, P, Q)
        assert np.all(law >= 0.0)  # main: a negative P(tau = 0) on about one such block in five
        if Q[0][block[0]] >= P[0][block[0]]:  # w_1 = 1: tau >= 1 surely
            hits += 1
            assert law[0] == 0.0
    assert hits >= 100


def test_chain_rule_gives_h_one_at_a_weight_of_one():
    # GBV's and HSD's one-step block verification along a path (otspec.tree._published._chain_rule)
    h, _ = _chain_rule(list(_BLOCK), list(_P[:3]), list(_Q[:3]), _Q[3])
    _, h_exact = _exact_onestep_law(_BLOCK, _P, _Q)
    assert h[1] == 1.0  # main: 1 + 2.2e-16
    assert all(0.0 <= x <= 1.0 for x in h)
    np.testing.assert_allclose(h, [float(x) for x in h_exact], rtol=1e-14, atol=0)


@pytest.mark.parametrize("seed", range(4))
def test_traversal_sampler_and_reference_at_a_weight_of_one(seed):
    """A node of weight 1 whose children are rejected keeps weight exactly 1 (the test's reference included).

    Main's reference formed ``(s + 1) - w`` and drew a coin at ``w = 1 - eps`` where the package (exact
    ``w = 1``) draws none: the same uniforms then gave different tokens (fuzz: tests/test_tree_traversal_fast.py
    with its CASES seeded 2505_13398).
    """
    # root -> node 1 (w = 1: q_0(0) > p_0(0)) -> node 2 (its one child, rejected with probability > 0)
    tree = DraftTree.from_paths([(0,), (0, 1)])
    P = np.array([[0.3, 0.7, 0.0], [0.1, 0.8, 0.1], [0.2, 0.3, 0.5]])
    Q = np.array([[0.6, 0.4, 0.0], [0.2, 0.7, 0.1], [0.3, 0.3, 0.4]])  # s = 0.1: (s + 1) - 1 > s
    vis = list(_ref_visits(_kids(tree), tree.tokens, P, Q))
    assert [v for v, _, _ in vis] == [2, 1, 0]
    assert vis[1][1] == 1.0  # the node of weight 1 after its child's rejection (main's reference: 1 - eps)
    e = TraversalVerify().emission(tree, P, Q)
    assert e[0].sum() == 0.0  # the root is never tried
    got = TraversalVerify().sample(tree, P, Q, rng=np.random.default_rng(seed))
    assert got == _ref_sample(tree, P, Q, np.random.default_rng(seed))


def test_the_profiles_stacked_block_laws_at_a_weight_of_one():
    # the profile's batched one-step law (block_path_laws_stack) on the same block: the same class of rounding,
    # P(tau = 0) = -8.06e-17 before; now exact and equal to the rational law at length L = 3
    from otspec.profile._quantities import block_path_laws_stack

    law = block_path_laws_stack(["block-onestep"], _P[None, :3], _Q[None, :4], np.array([_BLOCK]), 3)
    last = np.asarray(law)[0, 0, 2]
    want, _ = _exact_onestep_law(_BLOCK, _P, _Q)
    assert (last >= 0).all() and last[0] == 0.0
    for got, w in zip(last.tolist(), want):
        assert abs(Fraction(got) - w) <= Fraction(2, 10**15)
