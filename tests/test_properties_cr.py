"""Property tests for the tree and profile exact functions (CR coverage campaign).

Every exact quantity is recomputed here by an INDEPENDENT route on the same float64 inputs, in exact rationals
(:class:`fractions.Fraction` of every float64 input, each law renormalised to sum to exactly 1): every realised
draft tree is enumerated from the definition of its draft process, every acceptance path of a per-node verifier is
followed from the published rule (SpecInfer: Miao et al., arXiv:2305.09781, §4; Sequoia: Chen et al.,
arXiv:2402.12374, §3.2), the emitted path and token are completed by the target to ``D + 1`` tokens and the law is
compared with the target's, EXACTLY (losslessness in rationals), then the package's float64 value within a stated
bound. Optima are checked against closed forms where one exists (a depth-1 tree: the max-flow min-cut value of the
bipartite coupling of the drafted set and the target token; one chain: Sun et al., arXiv:2403.10444 v1, Theorem 1;
a deterministic tree: the target's path probabilities) and against every verifier's value (an optimum is never
below a verifier, the level-wise bound never below an optimum).

Error bounds: the rows the package reads are the float64 rows; the rationals are those rows renormalised, within
``V * eps`` of them (``eps = 2**-52``). A float64 sum or product of ``m`` terms in ``[0, 1]`` is within ``m * eps``
of its exact value, so a quantity formed from ``m`` such terms is checked within ``64 * m * eps`` (stated per
test as ``_tol(m)``); LP values (HiGHS, feasibility tolerance 1e-10 on a few hundred rows) within ``LP_TOL =
1e-8``.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from otspec import alpha_k, kseq, multiround
from otspec._validation import NEGLIGIBLE
from otspec.block import level_alphas, level_bound
from otspec.models import MemorylessModel, TableModel, joint_law
from otspec.otm import alpha_k_without_replacement
from otspec.profile._quantities import Builds, depth_quantities
from otspec.spectr import block_efficiency, optimal_block_efficiency
from otspec.tree import (
    DraftTree,
    SequoiaVerifier,
    SpecInferVerifier,
    TargetOnlyVerifier,
    TreeShape,
    acceptance_vector,
    best_shape,
    greedy_shape,
    make_tree_verifier,
    optimum,
    output_law,
    sample_tree,
    sequoia,
    sequoia_gap,
    tree_laws,
    value,
)
from tests.test_properties_cm import laws

EPS = 2.0**-52
LP_TOL = 1e-8
FAST = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def _tol(m: int) -> float:
    """The bound on a float64 quantity formed from ``m`` terms in [0, 1] (module docstring)."""
    return 64.0 * m * EPS


# ----------------------------------------------------------------------------- models and shapes


@st.composite
def table_models(draw, max_v: int = 3, depth: int = 2, V: int | None = None, row_laws=laws):
    """``(draft, target, V)``: two TableModels of ``depth + 1`` levels whose rows come from a pool of three laws
    each (ties between prefixes, prefix dependence, zeros, point masses, subnormals; ``row_laws(V)``, the strategy
    of one law); one draw in four has ``target == draft``."""
    V = draw(st.integers(1, max_v)) if V is None else V
    models = []
    for _ in range(2):
        pool = [draw(row_laws(V)) for _ in range(3)]
        tables = []
        for ell in range(depth + 1):
            idx = draw(st.lists(st.integers(0, 2), min_size=V**ell, max_size=V**ell))
            tables.append(np.array([pool[i] for i in idx]).reshape((V,) * (ell + 1)))
        models.append(tables)
    if draw(st.integers(0, 3)) == 0:
        models[1] = [t.copy() for t in models[0]]
    return TableModel(models[0]), TableModel(models[1]), V


@st.composite
def shapes(draw, max_nodes: int = 4, max_depth: int = 2, max_rank: int = 2, gaps: bool = True):
    """A prefix-closed set of rank paths (ranks ``< max_rank + 1``), grown one node at a time; with ``gaps`` a node
    may skip a sibling rank."""
    n = draw(st.integers(1, max_nodes))
    paths = [()]
    for _ in range(n):
        free = []
        for s in paths:
            if len(s) >= max_depth:
                continue
            used = {p[-1] for p in paths if len(p) == len(s) + 1 and p[:-1] == s}
            ranks = range(max_rank + 1) if gaps else [len(used)] if len(used) <= max_rank else []
            free += [s + (r,) for r in ranks if r not in used]
        if not free:
            break
        paths.append(draw(st.sampled_from(free)))
    return TreeShape(paths[1:])


def _rational(row) -> list[Fraction]:
    """A float64 law in rationals, renormalised to sum to exactly 1."""
    out = [Fraction(float(x)) for x in np.asarray(row, dtype=np.float64)]
    s = sum(out)
    return [x / s for x in out]


def _row(model, path) -> list[Fraction]:
    """The model's law after ``path`` in rationals, renormalised to sum to exactly 1."""
    return _rational(model.next_dist(tuple(path)))


class _Laws:
    """Rational laws of a model, memoised by path."""

    def __init__(self, model):
        self.model, self.memo = model, {}

    def __call__(self, path) -> list[Fraction]:
        path = tuple(path)
        if path not in self.memo:
            self.memo[path] = _row(self.model, path)
        return self.memo[path]


# ----------------------------------------------------------------------------- independent references


def _ranked(p) -> list[int]:
    """Tokens by decreasing probability, ties by lower id (the top-k process's ranking)."""
    return sorted(range(len(p)), key=lambda t: (-p[t], t))


def _wor_draws(p, need: int):
    """Every ordered draw of ``need`` distinct tokens without replacement from ``p``, with its probability."""
    support = [t for t in range(len(p)) if p[t] > 0]
    for seq in itertools.permutations(support, need):
        w, left = Fraction(1), Fraction(1)
        for t in seq:
            w *= p[t] / left
            left -= p[t]
        yield seq, w


class _SupportTooSmall(Exception):
    pass


def _enumerate(shape: TreeShape, dl: _Laws, process: str, prefix=()) -> list[tuple[tuple[int, ...], Fraction]]:
    """Every realised tree (tokens in node order, root first) with its probability, from the process's definition."""
    paths = shape.paths
    index = {s: i for i, s in enumerate(paths)}
    groups: dict = {}
    for s in paths[1:]:
        groups.setdefault(s[:-1], []).append(s)
    order = [s for s in paths if s in groups]  # parents in node order: a parent's tokens are set before its kids

    def options(p, ranks):
        need = max(ranks) + 1
        if process == "iid":
            for combo in itertools.product([t for t in range(len(p)) if p[t] > 0], repeat=len(ranks)):
                yield combo, math.prod((p[t] for t in combo), start=Fraction(1))
            return
        if sum(1 for x in p if x > 0) < need:
            raise _SupportTooSmall
        if process == "topk":
            ranked = _ranked(p)
            yield tuple(ranked[r] for r in ranks), Fraction(1)
            return
        merged: dict = {}
        for seq, w in _wor_draws(p, need):
            key = tuple(seq[r] for r in ranks)
            merged[key] = merged.get(key, 0) + w
        yield from merged.items()

    out = []

    def walk(g: int, toks: list, w: Fraction) -> None:
        if g == len(order):
            out.append((tuple(toks), w))
            return
        par = order[g]
        kids = groups[par]
        i = index[par]
        tpath = tuple(toks[index[par[:j]]] for j in range(1, len(par) + 1))
        assert i == 0 or tpath[-1] == toks[i]
        for combo, wc in options(dl(prefix + tpath), [s[-1] for s in kids]):
            for s, t in zip(kids, combo):
                toks[index[s]] = t
            walk(g + 1, toks, w * wc)

    walk(0, [-1] * len(paths), Fraction(1))
    return out


def _tree_structure(shape: TreeShape, toks):
    """``(children, token paths)`` of the realised tree in node order."""
    children = [[] for _ in shape.paths]
    for i in range(1, len(shape.paths)):
        children[int(shape.parents[i])].append(i)
    tpaths = [()]
    for i in range(1, len(shape.paths)):
        tpaths.append(tpaths[int(shape.parents[i])] + (toks[i],))
    return children, tpaths


def _scan_emission(children, toks, P, Q, wor: bool) -> dict:
    """``{node: [P(accepted path ends there, token y)]}`` of SpecInfer's (``wor=False``) or Sequoia's rule, from
    its definition: children in rank order, accept ``c`` w.p. ``min(1, q_i(c) / p_i(c))``, else
    ``q_{i+1} = (q_i - p_i)_+ / ||.||`` and (Sequoia) ``p_{i+1}`` = ``p_i`` off ``c``, renormalised."""
    E: dict = {}

    def visit(v: int, reach: Fraction) -> None:
        if not children[v]:
            E[v] = [reach * x for x in Q[v]]
            return
        q, p, alive = list(Q[v]), list(P[v]), reach
        for c in children[v]:
            t = toks[c]
            a = min(Fraction(1), q[t] / p[t]) if p[t] > 0 else Fraction(1 if q[t] > 0 else 0)
            visit(c, alive * a)
            alive *= 1 - a
            r = [max(qi - pi, Fraction(0)) for qi, pi in zip(q, p)]
            s = sum(r)
            if s > 0:
                q = [x / s for x in r]
            if wor:
                p[t] = Fraction(0)
                left = sum(p)
                if left > 0:
                    p = [x / left for x in p]
        E[v] = [alive * x for x in q]

    visit(0, Fraction(1))
    return E


def _target_only_emission(children, toks, Q) -> dict:
    """Draw ``Y`` from the target; descend into the first child carrying it, else emit it (a later sibling with
    the same token is never reached: its row is 0)."""
    E: dict = {i: [Fraction(0)] * len(Q[0]) for i in range(len(children))}

    def visit(v: int, reach: Fraction) -> None:
        row = [reach * x for x in Q[v]]
        seen = set()
        for c in children[v]:
            t = toks[c]
            if t not in seen:
                seen.add(t)
                visit(c, reach * Q[v][t])
                row[t] = Fraction(0)
        E[v] = row

    visit(0, Fraction(1))
    return E


def _emission(name: str, children, toks, P, Q) -> dict:
    if name == "target-only":
        return _target_only_emission(children, toks, Q)
    return _scan_emission(children, toks, P, Q, wor=name == "sequoia")


def _completed(tl: _Laws, V: int, D: int, mass: dict) -> dict:
    """The law of the emitted path + token (``mass``: ``{token string: probability}``) continued by the target to
    ``D + 1`` tokens."""
    out: dict = {}
    for s, w in mass.items():
        if w == 0:
            continue
        for rest in itertools.product(range(V), repeat=D + 1 - len(s)):
            z, pr = s, w
            for t in rest:
                pr *= tl(z)[t]
                z = z + (t,)
            if pr:
                out[z] = out.get(z, 0) + pr
    return out


def _joint(tl: _Laws, V: int, length: int) -> dict:
    """The target's law of ``length`` tokens, as a product of its conditionals."""
    return _completed(tl, V, length - 1, {(y,): tl(())[y] for y in range(V)})


def _exact_run(shape, draft, target, V, process, name):
    """``(trees, E[tau], completed law)`` of the verifier ``name`` on the process, all in rationals."""
    dl, tl = _Laws(draft), _Laws(target)
    D = int(shape.max_depth)
    trees = _enumerate(shape, dl, process)
    mass: dict = {}
    etau = Fraction(0)
    for toks, w in trees:
        children, tpaths = _tree_structure(shape, toks)
        P = [dl(s) for s in tpaths]
        Q = [tl(s) for s in tpaths]
        E = _emission(name, children, toks, P, Q)
        for a, row in E.items():
            etau += w * len(tpaths[a]) * sum(row)
            for y, x in enumerate(row):
                key = tpaths[a] + (y,)
                mass[key] = mass.get(key, 0) + w * x
    return trees, etau, _completed(tl, V, D, mass), _joint(tl, V, D + 1)


def _as_table(law: dict, V: int, length: int) -> np.ndarray:
    out = np.zeros((V,) * length)
    for z, x in law.items():
        out[z] = float(x)
    return out


def _min_cut(P_sets: dict, Q) -> Fraction:
    r"""The best coupling of a random set ``S`` (law ``P_sets``) and a token ``Y ~ Q``, :math:`\max P(Y \in S)`,
    by max-flow min-cut on the bipartite graph (sets -> their tokens): :math:`\min_B [Q(B) + 1 - P(S \subseteq B)]`
    over token sets ``B`` (Gale's supply-demand theorem)."""
    V = len(Q)
    best = None
    for bits in range(1 << V):
        B = {t for t in range(V) if bits >> t & 1}
        inside = sum((w for S, w in P_sets.items() if set(S) <= B), Fraction(0))
        val = sum((Q[t] for t in B), Fraction(0)) + 1 - inside
        best = val if best is None or val < best else best
    return best


# ----------------------------------------------------------------------------- tree verifiers: exact law, E[tau]

# (verifier, process): the pairs the package calls lossless (Sequoia's only on gapless shapes), and lossy ones
LOSSLESS = [("specinfer", "iid"), ("sequoia", "wor"), ("target-only", "iid"), ("target-only", "wor"),
            ("target-only", "topk")]
LOSSY = [("specinfer", "wor"), ("specinfer", "topk"), ("sequoia", "iid"), ("sequoia", "topk")]


def _run_case(name, process, shape, draft, target, V):
    try:
        trees, etau, law, ref = _exact_run(shape, draft, target, V, process, name)
    except _SupportTooSmall:
        # the package refuses the same trees (a node needing more distinct children than the draft's support)
        with pytest.raises(ValueError, match="positive probability"):
            value(shape, draft, target, process=process, verifier=name, allow_lossy=True)
        return None
    return trees, etau, law, ref


def _check_against_package(name, process, shape, draft, target, V, trees, etau, law):
    D = int(shape.max_depth)
    m = len(trees) * (shape.n + 1) * V ** (D + 1)
    got = value(shape, draft, target, process=process, verifier=name, allow_lossy=True)
    assert abs(got - float(etau)) <= _tol(m), (got, float(etau))
    R = output_law(shape, draft, target, process=process, verifier=name)
    assert R.min() >= 0.0
    assert np.abs(R - _as_table(law, V, D + 1)).max() <= _tol(m)


# a residual spread over two tokens after the first rejection, the second child's draft law renormalised off the
# first (0 < q_2(c) < p_2(c)): fails on Sequoia's rule with p not renormalised (0.95 instead of 0.57 at token 1)
_SPREAD = (MemorylessModel([0.4, 0.35, 0.25]), MemorylessModel([0.1, 0.45, 0.45]), 3)


@pytest.mark.parametrize("name,process", LOSSLESS)
@FAST
@given(models=table_models(max_v=4, depth=2), shape=shapes(max_nodes=4, max_depth=2))
@example(models=_SPREAD, shape=TreeShape([(0,), (1,), (2,)]))
@example(models=_SPREAD, shape=TreeShape([(0,), (1,), (0, 0), (0, 1)]))
def test_lossless_tree_verifiers_match_enumeration_and_emit_the_target_exactly(name, process, models, shape):
    _check_lossless(name, process, models, shape, 81)


@pytest.mark.slow
@pytest.mark.parametrize("name,process", LOSSLESS)
@SLOW
@given(models=table_models(max_v=3, depth=3), shape=shapes(max_nodes=7, max_depth=3))
def test_lossless_tree_verifiers_on_seven_node_shapes(name, process, models, shape):
    _check_lossless(name, process, models, shape, 243)


def _check_lossless(name, process, models, shape, max_trees):
    # fails on: a wrong acceptance ratio or residual (the rational law differs from the target's), E[tau] summed
    # over the wrong nodes, a draft process enumerated with a wrong probability (wor's renormalisation), a rank
    # gap treated as contiguous
    draft, target, V = models
    if name == "sequoia":
        assume(not shape.has_rank_gaps)
    assume(process != "iid" or V ** shape.n <= max_trees)
    out = _run_case(name, process, shape, draft, target, V)
    if out is None:
        return
    trees, etau, law, ref = out
    assert law == ref  # losslessness, exactly: the theorem on the rational laws
    assert sum(w for _, w in trees) == 1
    _check_against_package(name, process, shape, draft, target, V, trees, etau, law)
    # E[tau] is at most the expected number of nodes on the target's path (reach v needs Y's prefix = x(v))
    assert etau <= shape.n


@pytest.mark.parametrize("token_verifier", ["kseq", pytest.param("optimal", marks=pytest.mark.slow)])
@FAST
@given(models=table_models(max_v=3, depth=2), shape=shapes(max_nodes=3, max_depth=2))
def test_spectr_tree_is_lossless_on_iid_trees_and_below_the_optimum(token_verifier, models, shape):
    # SpecTr's DraftSelection over a tree (Sun et al., arXiv:2310.15141, Algorithm 3): its law completed by the
    # target is the target's (the rational joint, by products of conditionals), and its E[tau] is at most the
    # one-token optimum of the same i.i.d. trees (fails on a pool gathered from the wrong nodes)
    draft, target, V = models
    assume(V ** shape.n <= 27)
    v = make_tree_verifier("spectr-tree", token_verifier=token_verifier)
    D = int(shape.max_depth)
    R = output_law(shape, draft, target, process="iid", verifier=v)
    ref = _as_table(_joint(_Laws(target), V, D + 1), V, D + 1)
    assert R.min() >= 0.0 and np.abs(R - ref).max() <= 1e-9  # 1e-9: the token plans' LP tolerance
    o1 = optimum(shape, draft, target, process="iid")
    assert value(shape, draft, target, process="iid", verifier=v) <= o1.value + LP_TOL


@pytest.mark.parametrize("name,process", LOSSY)
@FAST
@given(models=table_models(max_v=3, depth=2), shape=shapes(max_nodes=3, max_depth=2))
def test_lossy_pairs_match_enumeration_and_claims(name, process, models, shape):
    # the per-node rule on a process it does not claim: the package's exact law is still the rule's law, and a
    # rule the package calls lossless must be lossless (fails on a wrong `lossless_for`)
    draft, target, V = models
    assume(process != "iid" or V ** shape.n <= 81)
    out = _run_case(name, process, shape, draft, target, V)
    if out is None:
        return
    trees, etau, law, ref = out
    _check_against_package(name, process, shape, draft, target, V, trees, etau, law)


@pytest.mark.parametrize("process", ["iid", "wor"])
@FAST
@given(models=table_models(max_v=3, depth=2), shape=shapes(max_nodes=3, max_depth=2, gaps=False),
       seed=st.integers(0, 2**32 - 1))
def test_per_node_emission_reach_and_tree_laws_on_one_tree(process, models, shape, seed):
    # one sampled tree: tree_laws' rows are the models' laws after each node's path, and the verifier's emission,
    # reach and E[tau | T] are the rational rule's (fails on a row read after the wrong path, a reach product
    # over the wrong ancestors, a residual normalised by the wrong mass)
    draft, target, V = models
    try:
        T = sample_tree(shape, draft, process=process, rng=seed)
    except ValueError:
        return  # too small a support for wor: covered above
    P, Q = tree_laws(T, draft, target)
    dl, tl = _Laws(draft), _Laws(target)
    for i, s in enumerate(T.paths()):
        assert np.array_equal(P[i], draft.next_dist(s)) and np.array_equal(Q[i], target.next_dist(s))
    toks = tuple(int(t) for t in T.tokens)
    children, tpaths = _tree_structure(shape, toks)
    assert tpaths == T.paths()
    for v in (SpecInferVerifier(), SequoiaVerifier(), TargetOnlyVerifier()):
        E = _emission(v.name, children, toks, [dl(s) for s in tpaths], [tl(s) for s in tpaths])
        got = v.emission(T, P, Q)
        want = np.array([[float(x) for x in E[a]] for a in range(T.n + 1)])
        m = (T.n + 1) * V * 4
        assert got.min() >= 0.0 and np.abs(got - want).max() <= _tol(m), (v.name, got, want)
        reach = [sum(sum(E[b]) for b in range(T.n + 1) if tpaths[b][:len(tpaths[a])] == tpaths[a]
                     and _descends(T, b, a)) for a in range(T.n + 1)]
        etau = sum(reach[1:])
        assert abs(v.expected_accepted(T, P, Q) - float(etau)) <= _tol(m)
        if hasattr(v, "reach"):
            assert np.abs(v.reach(T, P, Q) - np.array([float(r) for r in reach])).max() <= _tol(m)


def _descends(T: DraftTree, b: int, a: int) -> bool:
    while b > a:
        b = int(T.parents[b])
    return b == a


# ----------------------------------------------------------------------------- the optimum and the bounds


@pytest.mark.parametrize("process", ["iid", "wor", "topk"])
@FAST
@given(models=table_models(max_v=3, depth=1), width=st.integers(1, 3))
def test_depth_one_optimum_is_the_min_cut_and_above_every_verifier(process, models, width):
    # a star: both optima are the best coupling of the drafted set with Y ~ q (closed form by min-cut), never
    # below SpecInfer / Sequoia / target-only; fails on an LP with a wrong reward or marginal
    draft, target, V = models
    shape = TreeShape([(r,) for r in range(width)])
    dl, tl = _Laws(draft), _Laws(target)
    try:
        trees = _enumerate(shape, dl, process)
    except _SupportTooSmall:
        return
    sets: dict = {}
    for toks, w in trees:
        key = tuple(sorted(set(toks[1:])))
        sets[key] = sets.get(key, 0) + w
    ref = float(_min_cut(sets, tl(())))
    o1 = optimum(shape, draft, target, process=process)
    oc = optimum(shape, draft, target, process=process, one_token=False)
    assert abs(o1.value - ref) <= LP_TOL and abs(oc.value - ref) <= LP_TOL
    for name, proc in LOSSLESS:
        if proc == process:
            _, etau, _, _ = _exact_run(shape, draft, target, V, process, name)
            assert float(etau) <= o1.value + LP_TOL


@pytest.mark.parametrize("process", ["iid", "wor"])
@FAST
@given(models=table_models(max_v=2, depth=2), shape=shapes(max_nodes=3, max_depth=2, gaps=False))
def test_optimal_tree_verifier_is_lossless_and_dominates(process, models, shape):
    # OPT_1 <= OPT_c; the optimal verifier's law completed by the target is the target's (summed from its exact
    # emission on every enumerated tree), its E[tau] is OPT_1, and no per-node rule beats it
    draft, target, V = models
    dl, tl = _Laws(draft), _Laws(target)
    try:
        trees = _enumerate(shape, dl, process)
    except _SupportTooSmall:
        return
    o1 = optimum(shape, draft, target, process=process)
    oc = optimum(shape, draft, target, process=process, one_token=False)
    assert o1.success and oc.success
    assert o1.value <= oc.value + LP_TOL
    v = o1.verifier
    D = int(shape.max_depth)
    mass: dict = {}
    etau = 0.0
    for toks, w in trees:
        T = DraftTree(shape, shape.parents, toks)
        P, Q = tree_laws(T, draft, target)
        E = v.emission(T, P, Q)
        assert E.min() >= 0.0
        etau += float(w) * v.expected_accepted(T, P, Q)
        for a, s in enumerate(T.paths()):
            for y in range(V):
                mass[s + (y,)] = mass.get(s + (y,), 0) + w * Fraction(float(E[a, y]))
    law = _completed(tl, V, D, mass)
    ref = _joint(tl, V, D + 1)
    diff = max(abs(float(law.get(z, 0) - ref.get(z, 0))) for z in set(law) | set(ref))
    assert diff <= 1e-9  # the repaired plan is lossless to float rounding; 1e-9: the LP's row tolerance
    assert abs(etau - o1.value) <= LP_TOL
    for name, proc in LOSSLESS:
        if proc == process:
            _, et, _, _ = _exact_run(shape, draft, target, V, process, name)
            assert float(et) <= o1.value + LP_TOL


def _prefix_laws(dl: _Laws, L: int):
    """``[P_1, ..., P_L]``: the laws of the ``ell``-token prefixes, ``{prefix: probability}``."""
    out = [{(): Fraction(1)}]
    for _ in range(L):
        nxt = {}
        for s, w in out[-1].items():
            for t, x in enumerate(dl(s)):
                nxt[s + (t,)] = w * x
        out.append(nxt)
    return out[1:]


def _alpha_brute(P: dict, Q: dict, k: int) -> Fraction:
    """OTM-k on the prefixes: :math:`\\min_A [1 + Q(A) - P(A)^k]` over every set ``A`` of prefixes."""
    keys = sorted(P)
    best = None
    for bits in range(1 << len(keys)):
        A = [keys[i] for i in range(len(keys)) if bits >> i & 1]
        val = 1 + sum((Q[a] for a in A), Fraction(0)) - sum((P[a] for a in A), Fraction(0)) ** k
        best = val if best is None or val < best else best
    return best


@FAST
@given(models=table_models(max_v=2, depth=2), L=st.integers(1, 2), k=st.integers(1, 3))
def test_level_alphas_by_subsets_and_the_bound_above_every_optimum(models, L, k):
    # fails on: a level's alpha over the wrong alphabet (tokens, not prefixes), P(A) not raised to k, a bound
    # summed with a missing level; the bound must dominate OPT_c of k i.i.d. chains and every verifier on them
    draft, target, V = models
    Ps, Qs = _prefix_laws(_Laws(draft), L), _prefix_laws(_Laws(target), L)
    want = [float(_alpha_brute(P, Q, k)) for P, Q in zip(Ps, Qs)]
    got = level_alphas(draft, target, L, k)
    assert got.shape == (L,)
    assert np.abs(got - want).max() <= _tol(4 * V**L)
    B = level_bound(draft, target, L, k)
    assert abs(B - math.fsum(want)) <= _tol(4 * L * V**L)
    assert np.all(np.diff(got) <= _tol(4 * V**L))  # a longer prefix is harder to match
    shape = TreeShape.chains(k, L)
    assume(V ** (k * L) <= 64)
    oc = optimum(shape, draft, target, process="iid", one_token=False)
    assert oc.value <= B + LP_TOL
    if k == 1:  # one chain: Sun et al.'s Theorem 1, the bound is the optimum
        assert abs(oc.value - B) <= LP_TOL
    _, etau, _, _ = _exact_run(shape, draft, target, V, "iid", "specinfer")
    assert float(etau) <= B + _tol(V**L)


@FAST
@given(models=table_models(max_v=2, depth=2), L=st.integers(1, 2), k=st.integers(1, 2))
def test_optimal_block_efficiency_between_verifiers_and_the_tree_optimum(models, L, k):
    # DraftSelection's best per-position plan: at least every SpecTr verifier's block efficiency, at most one plus
    # the one-token optimum of k i.i.d. chains (every DraftSelection plan is such a verifier); k = 1: the maximal
    # coupling's recursion; L = 1: 1 + alpha_k by subsets
    draft, target, V = models
    best = optimal_block_efficiency(draft, target, k, L)
    for name in ("lp", "kseq", "optimal"):
        assert block_efficiency(draft, target, k, L, verifier=name) <= best + LP_TOL
    o1 = optimum(TreeShape.chains(k, L), draft, target, process="iid")
    assert best <= 1.0 + o1.value + LP_TOL
    dl, tl = _Laws(draft), _Laws(target)
    if k == 1:
        def rec(s, d):
            if d == L:
                return Fraction(1)
            return 1 + sum(min(a, b) * rec(s + (y,), d + 1) for y, (a, b) in enumerate(zip(dl(s), tl(s))))
        assert abs(best - float(rec((), 0))) <= LP_TOL
    if L == 1:
        assert abs(best - 1.0 - float(_alpha_brute(_prefix_laws(dl, 1)[0], _prefix_laws(tl, 1)[0], k))) <= LP_TOL


# ----------------------------------------------------------------------------- joint_law


@FAST
@given(models=table_models(max_v=3, depth=2), length=st.integers(1, 3))
def test_joint_law_is_the_product_of_conditionals(models, length):
    # fails on a table indexed in the wrong order (x_2 given x_1 read as x_1 given x_2) or a missing level
    draft, _, V = models
    J = joint_law(draft, length)
    want = _as_table(_joint(_Laws(draft), V, length), V, length)
    assert J.shape == (V,) * length and J.min() >= 0.0
    assert np.abs(J - want).max() <= _tol(4 * length * V)
    if length > 1:
        assert np.abs(J.sum(axis=-1) - joint_law(draft, length - 1)).max() <= _tol(4 * length * V)


# ----------------------------------------------------------------------------- choosing shapes


def _all_shapes(n: int, depth: int, K: int, gaps: bool):
    """Every prefix-closed set of ``n`` rank paths (ranks ``< K``, lengths ``<= depth``); without ``gaps`` the
    children of a node have ranks ``0..b-1``."""
    level = {frozenset([()])}
    for _ in range(n):
        nxt = set()
        for S in level:
            for s in S:
                if len(s) >= depth:
                    continue
                kids = {p[-1] for p in S if len(p) == len(s) + 1 and p[:-1] == s}
                ranks = range(K) if gaps else [len(kids)] if len(kids) < K else []
                for r in ranks:
                    if r not in kids:
                        nxt.add(S | {s + (r,)})
        level = nxt
    return [sorted(S - {()}) for S in level]


def _positional_value(paths, a) -> Fraction:
    return sum((math.prod((Fraction(a[r]) for r in s), start=Fraction(1)) for s in paths), Fraction(0))


@st.composite
def acceptance_vectors(draw, max_k: int = 3):
    K = draw(st.integers(1, max_k))
    kind = draw(st.sampled_from(["free", "free", "ties", "zeros", "point"]))
    if kind == "point":
        a = np.zeros(K)
        a[draw(st.integers(0, K - 1))] = 1.0
        return a
    w = np.array(draw(st.lists(st.sampled_from([0.0, 0.1, 0.25, 0.5, 1.0]) if kind == "ties"
                               else st.floats(0.0, 1.0), min_size=K + 1, max_size=K + 1)))
    if kind == "zeros":
        w[: K // 2] = 0.0
    if not w.sum() > 0:
        w[-1] = 1.0
    return w[:K] / w.sum()  # the last weight: the mass of "no child accepted"


@FAST
@given(a=acceptance_vectors(), n=st.integers(1, 5), depth=st.integers(1, 3))
def test_sequoia_dp_is_the_best_shape_by_exhaustive_search(a, n, depth):
    _check_sequoia(a, n, depth)


@pytest.mark.slow
@SLOW
@given(a=acceptance_vectors(max_k=4), n=st.integers(5, 7), depth=st.integers(1, 3))
def test_sequoia_dp_is_the_best_shape_by_exhaustive_search_seven_nodes(a, n, depth):
    _check_sequoia(a, n, depth)


def _check_sequoia(a, n, depth):
    # every shape with n nodes, depth <= depth and children at ranks 0..b-1 (b <= K), valued under positional
    # acceptance: the DP's value is their maximum and its shape attains it (fails on a split that drops a
    # child's subtree, a depth limit off by one, a rank's weight applied to the wrong child)
    K = a.shape[0]
    cap = sum(K**d for d in range(1, min(depth, n) + 1))
    if n > cap:
        with pytest.raises(ValueError, match="no shape"):
            sequoia(a, n, depth)
        return
    val, shape = sequoia(a, n, depth)
    assert shape.n == n and shape.max_depth <= depth and not shape.has_rank_gaps
    assert all(p[-1] < K for p in shape.paths[1:])
    m = n * (depth + 1) * 4
    assert abs(val - float(_positional_value(shape.paths[1:], a))) <= _tol(m)
    best = max(_positional_value(S, a) for S in _all_shapes(n, depth, K, gaps=False))
    assert abs(val - float(best)) <= _tol(m)
    if np.all(np.diff(a) <= 0):  # non-increasing: a rank gap never helps
        assert float(max(_positional_value(S, a) for S in _all_shapes(n, depth, K, gaps=True))) <= val + _tol(m)
    assert sequoia(a, n, depth, include_bonus=True).value == val + 1.0


@st.composite
def memoryless_pair(draw, max_v: int = 3):
    V = draw(st.integers(2, max_v))
    return MemorylessModel(draw(laws(V))), MemorylessModel(draw(laws(V))), V


@FAST
@given(pair=memoryless_pair(), n=st.integers(1, 3), depth=st.integers(1, 2))
def test_sequoia_gap_vanishes_without_prefix_dependence(pair, n, depth):
    # a draft and target that ignore the prefix: the rank-r child is accepted with a[r] at every node, so Sequoia's
    # prediction is exact; a (the acceptance vector) is Sequoia's rule on a star, by enumeration (fails on a
    # vector measured on the wrong star, or the exact value of another shape)
    draft, target, V = pair
    width = min(n, V)
    dl, tl = _Laws(draft), _Laws(target)
    if sum(1 for x in dl(()) if x > 0) < width:
        with pytest.raises(ValueError, match="positive probability"):
            sequoia_gap(draft, target, n, depth)
        return
    if n > sum(width**d for d in range(1, depth + 1)):
        with pytest.raises(ValueError, match="no shape"):
            sequoia_gap(draft, target, n, depth)
        return
    star = TreeShape([(r,) for r in range(width)])
    a = [Fraction(0)] * width
    for toks, w in _enumerate(star, dl, "wor"):
        children, tpaths = _tree_structure(star, toks)
        E = _scan_emission(children, toks, [dl(s) for s in tpaths], [tl(s) for s in tpaths], wor=True)
        for r in range(width):
            a[r] += w * sum(E[r + 1])
    got_a = acceptance_vector(draft, target, width)
    assert np.abs(got_a - np.array([float(x) for x in a])).max() <= _tol(8 * width * V)
    g = sequoia_gap(draft, target, n, depth)
    m = 8 * n * V ** (depth + 1)
    assert np.array_equal(g.acceptance, got_a)
    assert abs(g.predicted - sequoia(got_a, n, depth).value) == 0.0
    _, etau, law, ref = _exact_run(g.shape, draft, target, V, "wor", "sequoia")
    assert law == ref
    assert abs(g.exact - float(etau)) <= _tol(m)
    assert abs(g.predicted - float(_positional_value(g.shape.paths[1:], a))) <= _tol(m)
    assert abs(g.gap) <= _tol(m)


@FAST
@given(models=table_models(max_v=3, depth=2), depth=st.integers(1, 2), data=st.data())
def test_sequoia_gap_exact_side_by_enumeration(models, depth, data):
    # with prefix dependence the gap may have either sign; its exact side is the chosen shape's E[tau] by
    # enumeration, its predicted side the DP on the enumerated acceptance vector
    draft, target, V = models
    n = data.draw(st.integers(1, 3))
    try:
        g = sequoia_gap(draft, target, n, depth)
    except ValueError as exc:
        assert "positive probability" in str(exc) or "no shape" in str(exc)
        return
    _, etau, law, ref = _exact_run(g.shape, draft, target, V, "wor", "sequoia")
    assert law == ref
    assert abs(g.exact - float(etau)) <= _tol(8 * n * V ** (depth + 1))
    assert g.shape.n == n and g.shape.max_depth <= depth


def _topk_value(paths, dl: _Laws, tl: _Laws, prefix=()):
    """The top-k tree of the rank paths after ``prefix``: E[tau] = sum of the target's path probabilities, or None
    when a node asks for a rank beyond the draft's support."""
    total = Fraction(0)
    for s in paths:
        toks, pr = (), Fraction(1)
        for r in s:
            p = dl(prefix + toks)
            if r >= sum(1 for x in p if x > 0):
                return None
            t = _ranked(p)[r]
            pr *= tl(prefix + toks)[t]
            toks += (t,)
        total += pr
    return total


def _topk_values(draft, target, n: int, depth: int, V: int, contexts) -> dict:
    """Every prefix-closed set of ``n`` rank paths (gaps allowed, lengths ``<= depth``) that top-k realises in every
    context, with its mean value over the contexts (rationals)."""
    dl, tl = _Laws(draft), _Laws(target)
    values = {}
    for S in _all_shapes(n, depth, V, gaps=True):
        vals = [_topk_value(S, dl, tl, c) for c in contexts]
        if None not in vals:
            values[tuple(S)] = sum(vals) / len(vals)
    return values


@FAST
@given(models=table_models(max_v=3, depth=3), n=st.integers(1, 4), depth=st.integers(1, 2),
       n_ctx=st.integers(1, 2))
def test_best_shape_is_the_best_of_every_shape_and_greedy_below_it(models, n, depth, n_ctx):
    _check_best_shape(models, n, depth, n_ctx)


@pytest.mark.slow
@SLOW
@given(models=table_models(max_v=3, depth=4), n=st.integers(4, 6), depth=st.integers(2, 3),
       n_ctx=st.integers(1, 2))
def test_best_shape_is_the_best_of_every_shape_larger(models, n, depth, n_ctx):
    _check_best_shape(models, n, depth, n_ctx)


def _check_best_shape(models, n, depth, n_ctx):
    # exhaustive: every prefix-closed set of n rank paths (gaps allowed) realised by top-k in every context,
    # valued by the target's path probabilities (the exact E[tau] of a deterministic tree); best_shape is their
    # maximum, greedy_shape a gapless shape valued exactly and never above it (fails on a heap order that pops a
    # child before its parent, a mean over contexts taken as a sum, ties ranked by higher id)
    draft, target, V = models  # tables one level deeper than the shapes: a context of one token, then the leaves
    contexts = [(), (V - 1,)][:n_ctx]
    dl, tl = _Laws(draft), _Laws(target)
    values = _topk_values(draft, target, n, depth, V, contexts)
    if not values:
        with pytest.raises(ValueError):
            best_shape(draft, target, n, contexts=contexts, depth=depth)
        return
    best = best_shape(draft, target, n, contexts=contexts, depth=depth)
    m = 8 * n * (depth + 1)
    assert abs(best.value - float(max(values.values()))) <= _tol(m)
    assert best.shape.n == n and best.shape.max_depth <= depth
    assert abs(best.value - float(values[tuple(sorted(best.shape.paths[1:]))])) <= _tol(m)
    for c, cv in zip(contexts, best.context_values):
        assert abs(cv - float(_topk_value(best.shape.paths[1:], dl, tl, c))) <= _tol(m)
        exact = value(best.shape, draft, target, process="topk", verifier="target-only", prefix=c)
        assert abs(cv - exact) <= _tol(m)
    greedy = greedy_shape(draft, target, n, contexts=contexts, depth=depth)
    assert not greedy.shape.has_rank_gaps and greedy.shape.n == n
    assert abs(greedy.value - float(values[tuple(sorted(greedy.shape.paths[1:]))])) <= _tol(m)
    assert greedy.value <= best.value + _tol(m)


# ----------------------------------------------------------------------------- depth_quantities


def _wor_sets(p, k: int) -> dict:
    out: dict = {}
    for seq, w in _wor_draws(p, k):
        key = tuple(sorted(seq))
        out[key] = out.get(key, 0) + w
    return out


def _iid_sets(p, k: int) -> dict:
    out: dict = {}
    support = [t for t in range(len(p)) if p[t] > 0]
    for seq in itertools.product(support, repeat=k):
        key = tuple(sorted(set(seq)))
        out[key] = out.get(key, 0) + math.prod((p[t] for t in seq), start=Fraction(1))
    return out


@FAST
@given(V=st.integers(1, 4), L=st.integers(1, 3), data=st.data())
def test_depth_quantities_per_position_by_the_scalar_routes(V, L, data):
    # each depth's acceptance along the first block, against that position alone: the optimum by min-cut over the
    # i.i.d. drafted sets (alpha_k), the maximal coupling for k = 1, the without-replacement optimum by min-cut over
    # the sets of k distinct draws, k-Seq's and multiround's scalar verifiers (fails on a depth read from the
    # wrong row, a k column swapped, a support restriction that drops a token of positive target mass)
    k_max = 3
    P = np.stack([np.stack([data.draw(laws(V)) for _ in range(L)]) for _ in range(k_max)])
    Q = np.stack([np.stack([data.draw(laws(V)) for _ in range(L + 1)]) for _ in range(k_max)])
    X = np.array([[int(np.flatnonzero(P[r, j] > 0)[0]) for j in range(L)] for r in range(k_max)])
    ks = (1, 2, 3)
    b = Builds(X, P, Q, {})
    opt = depth_quantities("optimal", ks, b, L)
    lp = depth_quantities("lp", ks, b, L)
    tok = depth_quantities("token", ks, b, L)
    wor = depth_quantities("without-replacement", ks, b, L)
    for j in range(L):
        p, q = _rational(P[0, j]), _rational(Q[0, j])
        m = 16 * V
        assert abs(tok[("acc", 1)][j] - float(sum(min(a, c) for a, c in zip(p, q)))) <= _tol(m)
        for k in ks:
            want = float(_min_cut(_iid_sets(p, k), q))
            assert abs(opt[("acc", k)][j] - want) <= _tol(m), (j, k)
            assert lp[("acc", k)][j] == opt[("acc", k)][j]
            assert abs(alpha_k(P[0, j], Q[0, j], k) - want) <= _tol(m)
            # without replacement: the package's validation flushes subnormal entries to 0 (a law (2/3, 1/3,
            # 5e-324) gives two distinct drafts); k above that support is undefined: NaN, not a ValueError
            flushed = _rational(np.where(P[0, j] >= NEGLIGIBLE, P[0, j], 0.0))
            if sum(1 for x in flushed if x > 0) >= k:
                want_w = float(_min_cut(_wor_sets(flushed, k), q))
                assert abs(wor[("acc", k)][j] - want_w) <= _tol(m), (j, k)
                assert abs(alpha_k_without_replacement(P[0, j], Q[0, j], k) - want_w) <= _tol(m)
            else:
                assert math.isnan(wor[("acc", k)][j])
    for name, build in (("kseq", kseq), ("multiround", multiround)):
        got = depth_quantities(name, ks, Builds(X, P, Q, {}), L)
        for j in range(L):
            for k in ks:
                assert abs(got[("acc", k)][j] - build(P[0, j], Q[0, j], k).acceptance()) <= _tol(16 * V)


def test_depth_quantities_on_a_subnormal_draft_entry_regression():
    # found by the test above: a draft law (2/3, 1/3, 5e-324) at a depth. The without-replacement optimum raised
    # ValueError for k = 3 (the closed form's validation flushes the subnormal: two distinct drafts) where k distinct
    # drafts are undefined (NaN, not recorded); "optimal"/"lp" and k-Seq's batched sort warned (RuntimeWarning:
    # overflow in q / p, an error under the package's filterwarnings)
    p, e, u = np.array([2 / 3, 1 / 3, 5e-324]), np.array([1.0, 0.0, 0.0]), np.full(3, 1 / 3)
    P, Q, X = np.stack([[p], [e], [e]]), np.stack([[u, u]] * 3), np.zeros((3, 1), dtype=np.int64)
    ks = (1, 2, 3)
    wor = depth_quantities("without-replacement", ks, Builds(X, P, Q, {}), 1)
    assert wor[("acc", 2)][0] == pytest.approx(2 / 3, abs=1e-15) and math.isnan(wor[("acc", 3)][0])
    for name in ("optimal", "lp", "kseq", "multiround"):
        got = depth_quantities(name, ks, Builds(X, P, Q, {}), 1)
        for k in ks:  # token 2 is (almost) never drafted: 2/3 whatever k
            assert got[("acc", k)][0] == pytest.approx(2 / 3, abs=1e-15), (name, k)
