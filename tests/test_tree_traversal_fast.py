"""Traversal Verification's closed-form tries against a direct implementation of the published rule.

Route: the reference below runs Weng, Hu et al.'s rule (arXiv:2505.12398)
as written -- every node keeps its target law ``M_b`` and draft law ``M_s``
as full arrays; a rejection forms ``(w M_b - M_s)_+`` with ``math.fsum``,
renormalises it, zeroes the rejected token of ``M_s`` and renormalises it
-- and sums the tries into the emission law, the expected length and the
reach probabilities (the subtree sums of the emission rows). The package
(otspec.tree._published) keeps each residual as a level ``(q - t p)_+ / S``
and forms a law only where the extra token is read; the two agree to
``rtol = 1e-12`` on random trees and laws with chains, i.i.d. siblings
(repeated tokens), ties, zeros in ``p`` or ``q`` and draft rows whose drafted
tokens carry most of their mass.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from otspec.profile._trees import reach_of
from otspec.tree import DraftTree, TreeShape, _published
from otspec.tree._published import GreedyBlockVerify, HierarchicalVerify, TraversalVerify

RTOL = 1e-12
#: An emission entry that is 0 in exact arithmetic (a residual's cancelled token, a try of weight 0) comes out of
#: either implementation as rounding noise of order 1e-16: compared absolutely.
ATOL = 1e-14


# ---------------------------------------------------------------------------
# the reference: the published rule with full arrays (the package's code before the closed form)
# ---------------------------------------------------------------------------


def _ref_normalised(w, fallback):
    s = math.fsum(w)
    return w / s if s > 0 else fallback


def _ref_visits(children, tokens, P, Q):
    n1 = P.shape[0]
    w = np.ones(n1)
    mb = list(Q)
    ms = list(P)
    nxt = [0] * n1
    stack = [0]
    while stack:
        v = stack[-1]
        if nxt[v] < len(children[v]):
            c = children[v][nxt[v]]
            nxt[v] += 1
            t = tokens[c]
            w[c] = min(1.0, w[v] * mb[v][t] / ms[v][t]) if ms[v][t] > 0 else 0.0
            stack.append(c)
            continue
        stack.pop()
        yield v, (1.0 if v == 0 else float(w[v])), mb[v]
        if v == 0:
            return
        u = stack[-1]
        r = np.maximum(w[u] * mb[u] - ms[u], 0.0)
        s = math.fsum(r)
        den = s + (1.0 - w[u])  # 1 - w exact (w in [0.5, 1]), as the package: a weight of 1 stays 1
        w[u] = s / den if den > 0 else 1.0
        if s > 0:
            mb[u] = r / s
        m = ms[u].copy()
        m[tokens[v]] = 0.0
        ms[u] = _ref_normalised(m, m)


def _kids(tree):
    children = [[] for _ in range(tree.n + 1)]
    for i in range(1, tree.n + 1):
        children[int(tree.parents[i])].append(i)
    return children


def _ref_emission(tree, P, Q):
    out = np.zeros(P.shape)
    survive = 1.0
    for v, a, law in _ref_visits(_kids(tree), tree.tokens, P, Q):
        if survive <= 0.0:
            break
        out[v] += (survive * a) * law
        survive *= 1.0 - a
    return out


def _ref_expected(tree, P, Q):
    e, survive = 0.0, 1.0
    for v, a, _ in _ref_visits(_kids(tree), tree.tokens, P, Q):
        if survive <= 0.0:
            break
        e += survive * a * float(tree.depth[v])
        survive *= 1.0 - a
    return e


def _ref_sample(tree, P, Q, gen):
    for v, a, law in _ref_visits(_kids(tree), tree.tokens, P, Q):
        if a >= 1.0 or gen.random() < a:
            return int(v), int(gen.choice(law.shape[0], p=law))
    raise AssertionError("no node accepted")  # pragma: no cover


# ---------------------------------------------------------------------------
# random trees and laws
# ---------------------------------------------------------------------------


def _shape(rng, n, max_depth):
    """A random shape of ``n`` nodes (ranks contiguous at each node)."""
    paths, counts = [()], {(): 0}
    while len(paths) < n + 1:
        par = paths[int(rng.integers(len(paths)))]
        if len(par) >= max_depth:
            continue
        child = par + (counts[par],)
        counts[par] += 1
        counts[child] = 0
        paths.append(child)
    return TreeShape(paths[1:])


def _law(rng, V, kind):
    if kind == "uniform":
        return np.full(V, 1.0 / V)
    x = rng.dirichlet(np.full(V, 0.5))
    if kind == "zeros":
        x[rng.random(V) < 0.4] = 0.0
        if x.sum() == 0.0:
            x[int(rng.integers(V))] = 1.0
    return x / x.sum()


def _laws(rng, n1, V, kind):
    P = np.array([_law(rng, V, "zeros" if kind in ("zeros", "zero-p") else "dirichlet") for _ in range(n1)])
    Q = np.array([_law(rng, V, "zeros" if kind in ("zeros", "zero-q") else "dirichlet") for _ in range(n1)])
    if kind == "ties":  # equal laws at some nodes, uniform at others
        for i in range(n1):
            if rng.random() < 0.5:
                Q[i] = P[i]
            elif rng.random() < 0.5:
                P[i] = Q[i] = np.full(V, 1.0 / V)
    return P, Q


def _tokens(rng, shape, P, process):
    """Children drawn from the parent's draft law: without replacement, i.i.d., or anywhere (p = 0 allowed)."""
    tokens = np.full(shape.n + 1, -1, dtype=np.int64)
    left = {}
    for c in range(1, shape.n + 1):
        v = int(shape.parents[c])
        p = left.setdefault(v, P[v].copy())
        if process == "any" or p.sum() <= 0.0:
            x = int(rng.integers(P.shape[1]))
        else:
            x = int(rng.choice(p.shape[0], p=p / p.sum()))
        if process == "wor":
            p[x] = 0.0
        tokens[c] = x
    return DraftTree(shape, shape.parents, tokens)


def _heavy(rng, shape, V):
    """Draft rows with most of their mass on the drafted tokens (the removed mass near 1, or all of it)."""
    n1 = shape.n + 1
    P = np.empty((n1, V))
    Q = np.array([_law(rng, V, "dirichlet") for _ in range(n1)])
    tokens = np.full(n1, -1, dtype=np.int64)
    for v in range(n1):
        kids = [c for c in range(1, n1) if shape.parents[c] == v]
        if not kids:
            P[v] = _law(rng, V, "dirichlet")
            continue
        drafted = rng.permutation(V)[: len(kids)]
        tokens[kids] = drafted
        rest = 0.0 if (len(kids) == V or rng.random() < 0.3) else 10.0 ** -rng.uniform(1, 8)
        P[v] = rest / max(V - len(kids), 1)
        P[v, drafted] = (1.0 - rest) * rng.dirichlet(np.ones(len(kids)))
        P[v] /= P[v].sum()
    return DraftTree(shape, shape.parents, tokens), P, Q


def _cases():
    rng = np.random.default_rng(2505_12398)
    out = []
    for i in range(60):
        V = int(rng.choice([2, 3, 4, 7, 40]))
        kind = ("dirichlet", "zeros", "zero-p", "zero-q", "ties")[i % 5]
        process = ("wor", "iid", "any")[i % 3]
        if i % 7 == 0:
            shape = TreeShape.chains(1, int(rng.integers(1, 6)))
        else:
            shape = _shape(rng, int(rng.integers(1, 14)), int(rng.integers(1, 4)))
        if process == "wor" and max(np.bincount(shape.parents[1:])) > V:
            process = "iid"
        P, Q = _laws(rng, shape.n + 1, V, kind)
        out.append((f"{i}-{kind}-{process}-V{V}-n{shape.n}", _tokens(rng, shape, P, process), P, Q))
    for i in range(12):
        V = int(rng.choice([3, 5, 30]))
        shape = TreeShape.branching(min(V, 3), 2) if i % 2 else _shape(rng, 8, 2)
        if max(np.bincount(shape.parents[1:])) > V:
            shape = TreeShape.chains(1, 3)
        tree, P, Q = _heavy(rng, shape, V)
        out.append((f"heavy-{i}-V{V}-n{shape.n}", tree, P, Q))
    return out


CASES = _cases()


# ---------------------------------------------------------------------------
# tests
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name,tree,P,Q", CASES, ids=[c[0] for c in CASES])
def test_tries_equal_the_reference(name, tree, P, Q):
    ver = TraversalVerify()
    E_ref = _ref_emission(tree, P, Q)
    E = ver.emission(tree, P, Q)
    np.testing.assert_allclose(E, E_ref, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(ver.expected_accepted(tree, P, Q), _ref_expected(tree, P, Q), rtol=RTOL, atol=ATOL)
    reach = ver.reach(tree, P, Q)
    np.testing.assert_allclose(reach, reach_of(tree, E_ref), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(reach, reach_of(tree, E), rtol=RTOL, atol=ATOL)
    assert reach[0] == 1.0


def test_the_cases_cover_what_they_claim():
    """Repeated sibling tokens, drafted tokens with ``p = 0``, rejections reaching a removed mass near 1."""
    dup = zero_p = heavy = 0
    for _, tree, P, _ in CASES:
        for v, kids in enumerate(_kids(tree)):
            toks = [int(tree.tokens[c]) for c in kids]
            dup += len(toks) != len(set(toks))
            zero_p += any(P[v, x] == 0.0 for x in toks)
            heavy += len(set(toks)) > 1 and P[v, sorted(set(toks))].sum() > 0.99
    assert dup >= 5 and zero_p >= 5 and heavy >= 5, (dup, zero_p, heavy)


@pytest.mark.parametrize("seed", range(3))
def test_sampler_draws_what_the_reference_draws(seed):
    """Same uniforms, same coins: the sampler's (node, token) equal the reference's on every case."""
    ver = TraversalVerify()
    for _, tree, P, Q in CASES[seed::3]:
        got = ver.sample(tree, P, Q, rng=np.random.default_rng(seed))
        want = _ref_sample(tree, P, Q, np.random.default_rng(seed))
        assert got == want


def test_a_64_node_branching_tree_at_a_larger_vocabulary():
    rng = np.random.default_rng(7)
    V = 2000
    shape = TreeShape.branching(8, 7)
    logits = 3.0 * rng.normal(size=(shape.n + 1, V))
    P = np.exp(logits)
    Q = np.exp(logits + 2.0 * rng.normal(size=logits.shape))
    P /= P.sum(axis=1, keepdims=True)
    Q /= Q.sum(axis=1, keepdims=True)
    tree = _tokens(rng, shape, P, "wor")
    ver = TraversalVerify()
    E_ref = _ref_emission(tree, P, Q)
    np.testing.assert_allclose(ver.emission(tree, P, Q), E_ref, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(ver.reach(tree, P, Q), reach_of(tree, E_ref), rtol=RTOL, atol=ATOL)
    assert E_ref[1:9].sum() > 1e-3  # root children accepted after rejections of their children (residual laws)


def test_exactly_degenerate_rejections_by_hand():
    """Rejections that leave nothing above the draft: exact answers by hand, where rounding used to decide.

    Root laws ``q = (b, 1 - b, 0)``, ``p = (a b, a (1 - b), 1 - a)``, children with tokens 2, 2, 0, 1. Token 2 has
    weight 0 (``q = 0``); its rejection at weight 1 leaves ``(q - p)_+ / (1 - (1 - a)) = p`` off token 2: the
    residual equals the draft, so the weight stays 1 (``S / (S + 1 - 1)``), the repeated token 2 (weight 0) leaves
    nothing above the draft (``S = 0``: the level kept), and token 0 has weight ``min(1, 1) = 1``: node 3 is
    accepted for sure, with the bonus token from ``q``. (The reference rounds ``1 - w`` and renormalises
    rounding residue, and misses this on most of the grid.)
    """
    shape = TreeShape([(0,), (1,), (2,), (3,)])
    tree = DraftTree(shape, shape.parents, [-1, 2, 2, 0, 1])
    for a in np.linspace(0.05, 0.95, 19):
        for b in (0.3, 0.37, 0.61):
            q = np.array([b, 1 - b, 0.0])
            P, Q = np.tile([a * b, a * (1 - b), 1 - a], (5, 1)), np.tile(q, (5, 1))
            E = TraversalVerify().emission(tree, P, Q)
            want = np.zeros_like(E)
            want[3] = q
            np.testing.assert_allclose(E, want, rtol=RTOL, atol=ATOL)
            np.testing.assert_allclose(TraversalVerify().reach(tree, P, Q), [1, 0, 0, 1, 0], rtol=RTOL, atol=ATOL)


def test_reach_and_expected_length_form_no_law(monkeypatch):
    """The passes that do not read the extra token never build a residual law."""
    _, tree, P, Q = CASES[1]

    def boom(self):
        raise AssertionError("a residual law was formed")

    monkeypatch.setattr(_published._TraversalNode, "residual", boom)
    ver = TraversalVerify()
    np.testing.assert_allclose(ver.reach(tree, P, Q), reach_of(tree, _ref_emission(tree, P, Q)), rtol=RTOL)
    np.testing.assert_allclose(ver.expected_accepted(tree, P, Q), _ref_expected(tree, P, Q), rtol=RTOL)
    with pytest.raises(AssertionError, match="residual law"):
        ver.emission(tree, P, Q)


@pytest.mark.parametrize("verifier", [GreedyBlockVerify(), HierarchicalVerify()], ids=["gbv", "hsd"])
def test_reach_of_the_other_first_success_rules_is_the_emission_s(verifier):
    rng = np.random.default_rng(11)
    for k, L, V in [(1, 3, 3), (2, 2, 4), (3, 1, 5)]:
        if verifier.name == "hsd" and k > 1:
            continue
        shape = TreeShape.chains(k, L)
        P, Q = _laws(rng, shape.n + 1, V, "dirichlet")
        tree = _tokens(rng, shape, P, "iid")
        np.testing.assert_allclose(verifier.reach(tree, P, Q), reach_of(tree, verifier.emission(tree, P, Q)),
                                   rtol=RTOL, atol=ATOL)


def test_reach_validates_its_inputs():
    tree = DraftTree.from_paths([(0,)])
    good = np.full((2, 2), 0.5)
    with pytest.raises(TypeError, match="`tree`"):
        TraversalVerify().reach("tree", good, good)
    with pytest.raises(ValueError, match=r"`q_nodes\[0\]`"):
        TraversalVerify().reach(tree, good, good * 1.1)
