"""Extreme laws at the tree verifiers, block verification, the test harness and the profile's intervals.

The laws are those of :mod:`tests.test_properties_db` (subnormal entries, ``1e-300`` and ``1e-200`` beside entries
near 1, ``2**-53``, exact zeros in one law and not the other, one-hot laws, ties), here the rows of two-level and
three-level table models, so that path probabilities reach ``1e-900`` (below the float range) and the draft and the
target disagree on supports along a path. Each quantity is compared with a route that does not share its code:

* exact rational arithmetic (:class:`fractions.Fraction` of every float64 input): every realised draft tree
  enumerated from the process's definition and every acceptance path of a per-node rule followed from the published
  rule (:mod:`tests.test_properties_cr`'s references: SpecInfer, Miao et al., arXiv:2305.09781, §4; Sequoia, Chen
  et al., arXiv:2402.12374, §3.2; the target-only rule); Sun et al.'s block optimum (arXiv:2403.10444, Theorem 1)
  summed over every block;
* enumeration of the package's own exact laws (:func:`otspec.tree.check_lossless`,
  :func:`otspec.block.check_lossless`) for the rules without a rational reference here (Traversal Verification,
  greedy block verification, hierarchical verification, SpecTr's rule on a tree);
* the exact law of Pearson's statistic under the null (every count vector of a multinomial enumerated) for the
  harness's stated false-failure rate.

Tolerances: a float64 sum or product of ``m`` terms in ``[0, 1]`` is within ``m * eps`` of its exact value (``eps =
2**-52``); the bounds are ``64 * m * eps`` relative on expected lengths (values of 1e-300 exact too), ``1e-12``
absolute on enumerated laws (the package's stated lossless tolerance is 1e-9). pyproject's filterwarnings turns
every RuntimeWarning of otspec into a failure, so a division by zero or an overflow on these laws fails its test.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from scipy import stats

from otspec._registry import verifier_names
from otspec.block import check_lossless as block_check_lossless
from otspec.block import expected_length as block_expected_length
from otspec.block import make_verifier as make_block_verifier
from otspec.block import tau_law_on_path
from otspec.decoding._metrics import min_runs
from otspec.models import MemorylessModel
from otspec.profile._summary import _interval
from otspec.testing import check_sampler, check_tree_sampler, chi2_gof
from otspec.tree import DraftTree, TreeShape, make_tree_verifier, output_law, sample_tree, tree_laws, value
from otspec.tree import _verifiers as tree_verifiers_module
from otspec.tree import check_lossless as tree_check_lossless
from tests.test_properties_cr import LOSSLESS, LOSSY, _as_table, _emission, _Laws, _run_case, shapes, table_models
from tests.test_properties_db import extreme_laws, extreme_pairs

EPS = 2.0**-52
TINY_NORMAL = float(np.finfo(np.float64).tiny)  # 2.2e-308
FAST = settings(max_examples=8, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
SLOW = settings(max_examples=200, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


# ----------------------------------------------------------------------------- the harness's chi-square test


def _exact_false_failure_rate(law, N: int, alpha_fail: float) -> float:
    """``P(chi2_gof(counts, law).passed is False)`` for ``counts ~ Multinomial(N, law)`` on three cells, exact.

    For each count ``c2`` of the last cell, Pearson's statistic (any pooling: a sum of squares of affine functions
    of ``c1``) is convex in the count ``c1`` of the middle cell, so the passing ``c1`` form an interval around the
    statistic's minimum: found by bisection on chi2_gof's own results (a few hundred calls, not every vector)."""
    law = np.asarray(law, dtype=np.float64)

    def gof(c1: int, c2: int):
        return chi2_gof(np.array([N - c1 - c2, c1, c2]), law, alpha_fail=alpha_fail)

    total = 0.0
    for c2 in range(N + 1):
        w2 = float(stats.binom.pmf(c2, N, law[2]))
        if w2 < 1e-30:  # left out: below (N + 1) * 1e-30 in all
            continue
        n = N - c2
        lo, hi = 0, n  # the statistic's minimum over c1 in [0, n]: the first c1 where it stops decreasing
        while lo < hi:
            mid = (lo + hi) // 2
            if gof(mid + 1, c2).statistic >= gof(mid, c2).statistic:
                hi = mid
            else:
                lo = mid + 1
        if not gof(lo, c2).passed:
            total += w2  # every c1 fails
            continue
        a, b = 0, lo  # the first passing c1
        while a < b:
            mid = (a + b) // 2
            a, b = (a, mid) if gof(mid, c2).passed else (mid + 1, b)
        left = a
        a, b = lo, n  # the last passing c1
        while a < b:
            mid = (a + b + 1) // 2
            a, b = (mid, b) if gof(mid, c2).passed else (a, mid - 1)
        right = a
        r = law[1] / (law[0] + law[1])
        passing = float(stats.binom.cdf(right, n, r) - stats.binom.cdf(left - 1, n, r))
        total += w2 * (1.0 - passing)
    return total


def test_chi2_gof_false_failure_rate_is_at_most_alpha_fail_with_a_rare_cell():
    # A cell of expected count 0.2 (N = 200, mass 1e-3), pooled alone, gave Pearson's statistic a tail far heavier
    # than chi-square: the exact false-failure rate was 3.4e-3 at alpha_fail = 1e-4 (34 times the stated rate;
    # 1.0e-3 at N = 1000). Pooled with the next smallest cells until its expected count is 5 (as check_sampler
    # already did) it is 9.1e-5. Fails on the plain pooling. Exact (an enumeration): no false-failure rate here.
    law = [0.5, 0.499, 0.001]
    assert _exact_false_failure_rate(law, 200, 1e-4) <= 1e-4


def test_min_runs_leaves_two_tested_cells():
    # the fewest runs for which chi2_gof has two cells of expected count >= 5: the likeliest and the rest together
    # (fails on ceil(5 / max law) alone: 6 runs for (0.999, 0.001), where the rest's expected count is 0.006);
    # exact in rationals, also where 5 / rest overflows (a rest of 2e-300 needs 2.5e300 runs)
    for law in ([0.999, 0.001], [0.5, 0.5], [0.01] * 100, [1.0 - 2e-300, 1e-300, 1e-300], [0.9, 0.05, 0.05],
                [1.0 - 2.0**-53, 2.0**-53], [0.25, 0.75]):
        law = np.asarray(law)
        n = min_runs(law)
        top, rest = Fraction(float(law.max())), Fraction(float(np.sort(law)[:-1].sum()))
        assert n * top >= 5 and n * rest >= 5 and not ((n - 1) * top >= 5 and (n - 1) * rest >= 5), (law, n)
        if n < 10**6:  # chi2_gof runs at that count (no "too few samples")
            counts = np.zeros(law.shape[0], dtype=np.int64)
            counts[np.argmax(law)] = n
            chi2_gof(counts, law)
    assert min_runs(np.array([1.0])) == 1


# ----------------------------------------------------------------------------- tree verifiers on extreme models


def extreme_models(max_v: int = 3, depth: int = 2):
    """``(draft, target, V)``: two TableModels of ``depth + 1`` levels whose rows come from a pool of three extreme
    laws each (ties between prefixes, zeros in one model only, 1e-300 beside ~1: path probabilities to 1e-900);
    one draw in four has ``target == draft``."""
    return table_models(max_v=max_v, depth=depth, row_laws=extreme_laws)


# a second child's residual of mass 1e-300 (the first child's rejection has probability 1e-300): Sequoia's and
# SpecInfer's E[tau] and law there are exact in relative terms, not only to 1e-12
_TINY_REJECT = (MemorylessModel([0.5, 0.5 - 1e-300, 1e-300]), MemorylessModel([0.5, 0.5, 0.0]), 3)


def _check_rational_tree(name, process, models, shape, max_trees):
    # fails on: an acceptance ratio or residual formed with a cancellation (a rejection of probability 1e-300 left
    # as 0 or as 2e-300), E[tau] summed with 1 - (...) instead of the reach products, a subnormal ratio overflowing
    draft, target, V = models
    if name == "sequoia" and shape.has_rank_gaps:
        return
    if process == "iid" and V**shape.n > max_trees:
        return
    out = _run_case(name, process, shape, draft, target, V)
    if out is None:
        return
    trees, etau, law, _ = out
    D = int(shape.max_depth)
    m = len(trees) * (shape.n + 1) * V ** (D + 1)
    got = value(shape, draft, target, process=process, verifier=name, allow_lossy=True)
    assert abs(got - float(etau)) <= 64 * m * EPS * float(etau), (got, float(etau))  # relative: 1e-300 exact too
    R = output_law(shape, draft, target, process=process, verifier=name)
    assert R.min() >= 0.0 and np.abs(R - _as_table(law, V, D + 1)).max() <= 1e-12


@pytest.mark.parametrize("name,process", LOSSLESS + LOSSY)
@FAST
@given(models=extreme_models(), shape=shapes(max_nodes=4, max_depth=2))
@example(models=_TINY_REJECT, shape=TreeShape([(0,), (1,), (0, 0)]))
def test_per_node_tree_rules_match_rationals_on_extreme_models(name, process, models, shape):
    _check_rational_tree(name, process, models, shape, 81)


@pytest.mark.slow
@pytest.mark.parametrize("name,process", LOSSLESS + LOSSY)
@SLOW
@given(models=extreme_models(max_v=3, depth=3), shape=shapes(max_nodes=6, max_depth=3))
def test_per_node_tree_rules_match_rationals_on_extreme_models_sweep(name, process, models, shape):
    _check_rational_tree(name, process, models, shape, 243)


_TREE_RULES = [n for n in verifier_names(kind="tree") if n != "spechub"]  # SpecHub: its own draft process
_CHAIN_RULES = ("gbv", "hsd")  # k disjoint chains of one length (hsd: one chain)


@st.composite
def rule_shapes(draw, name: str, max_nodes: int = 4, max_depth: int = 2):
    """A gapless shape for the rule ``name``: ``TreeShape.chains(k, L)`` for the chain rules."""
    if name in _CHAIN_RULES:
        L = draw(st.integers(1, max_depth))
        return TreeShape.chains(1 if name == "hsd" else draw(st.integers(1, max(1, max_nodes // L))), L)
    return draw(shapes(max_nodes=max_nodes, max_depth=max_depth, gaps=False))


def _check_tree_enumeration(name, models, data, process_index, max_nodes=4, max_depth=2):
    # every published tree rule on a process it claims: its law completed by the target is the target's, and its
    # two routes to E[tau] agree relatively (fails on a rule accepting a child of target mass 0, a rejection of
    # probability 1e-300 lost in a complement, a subnormal draft probability overflowing a ratio)
    draft, target, V = models
    shape = data.draw(rule_shapes(name, max_nodes, max_depth))
    v = make_tree_verifier(name)
    procs = [p for p in v.processes if p in ("iid", "wor", "topk")] or ["iid"]  # hsd claims none: checked on iid
    process = procs[process_index % len(procs)]
    if process == "iid" and V**shape.n > 81:
        return
    try:
        chk = tree_check_lossless(v, shape, draft, target, process=process)
    except ValueError as exc:  # the one refusal: more distinct children than the draft's support at a node
        assert "positive probability" in str(exc), exc
        return
    if chk.claimed_lossless:
        assert chk.max_error <= 1e-12, (name, process, chk.max_error)
    assert abs(math.fsum(chk.law.ravel().tolist()) - 1.0) <= 1e-12 and chk.law.min() >= 0.0
    assert chk.acceptance_error <= 64 * chk.n_cases * (shape.n + 1) * V * EPS * chk.acceptance


@pytest.mark.parametrize("name", _TREE_RULES)
@FAST
@given(models=extreme_models(), data=st.data(), process_index=st.integers(0, 2))
def test_tree_rules_lossless_by_enumeration_on_extreme_models(name, models, data, process_index):
    _check_tree_enumeration(name, models, data, process_index)


@pytest.mark.slow
@pytest.mark.parametrize("name", _TREE_RULES)
@SLOW
@given(models=extreme_models(max_v=3, depth=3), data=st.data(), process_index=st.integers(0, 2))
def test_tree_rules_lossless_by_enumeration_on_extreme_models_sweep(name, models, data, process_index):
    _check_tree_enumeration(name, models, data, process_index, 6, 3)


@pytest.mark.parametrize("name", _TREE_RULES)
@FAST
@given(models=extreme_models(), data=st.data(), seed=st.integers(0, 2**32))
def test_tree_rules_leave_their_inputs_alone_and_repeat_under_a_seed(name, models, data, seed):
    # emission, expected_accepted and sample never write the laws they are handed (compared with copies), and a
    # sample is a function of the seed (fails on a residual formed in place in p_nodes or q_nodes)
    draft, target, V = models
    shape = data.draw(rule_shapes(name))
    v = make_tree_verifier(name)
    tree = sample_tree(shape, draft, process="iid", rng=seed)
    P, Q = tree_laws(tree, draft, target)
    P0, Q0 = P.copy(), Q.copy()
    E = v.emission(tree, P, Q)
    e = v.expected_accepted(tree, P, Q)
    draws = [v.sample(tree, P, Q, rng=seed) for _ in range(2)]
    assert np.array_equal(P, P0) and np.array_equal(Q, Q0)
    assert draws[0] == draws[1]
    node, tok = draws[0]
    assert E[node, tok] > 0.0  # a draw the exact law gives probability 0 is a bug of one of them
    assert abs(math.fsum(E.ravel().tolist()) - 1.0) <= 1e-12 and E.min() >= 0.0
    assert abs(e - math.fsum((tree.depth[:, None] * E).ravel().tolist())) <= 64 * E.size * EPS * max(e, 1e-300)


# ----------------------------------------------------------------------------- decoding's host-side token step


def _multiround_law(pf, qf, drafts) -> list[Fraction]:
    """Multi-round rejection sampling's output law given its drafts, in rationals (Miao et al., arXiv:2305.09781,
    Algorithm 1): ``T_0 = q``, ``T_{i+1} = (T_i - p)_+`` normalised (``T_i`` where it has no mass), the ``i``-th
    draft accepted by the strict coin ``u p(x) < T_{i-1}(x)``: 0 where ``T_{i-1}(x) = 0``, else ``min(1, T / p)``
    (1 at ``p(x) = 0``)."""
    T, out, rem = list(qf), [Fraction(0)] * len(qf), Fraction(1)
    for x in drafts:
        a = Fraction(0) if T[x] == 0 else Fraction(1) if pf[x] <= T[x] else T[x] / pf[x]
        out[x] += rem * a
        rem *= 1 - a
        r = [max(t - s, Fraction(0)) for t, s in zip(T, pf)]
        if sum(r) > 0:
            T = [v / sum(r) for v in r]
    return [o + rem * t for o, t in zip(out, T)]


@FAST
@given(pair=extreme_pairs(1, 4), data=st.data())
@example(pair=(np.array([1.0, 0.0]), np.array([1.0, 0.0])), data=None)
def test_step_law_matches_rationals_on_extreme_laws(pair, data):
    # the exact law of one verified depth of the decoder's chains (step_law_t) against the rule in rationals, on any
    # drafts, those of draft probability 0 included: with p = q = (1, 0) and the draft 1 (p = q = 0 there) the law
    # was (0, 1), a token of target mass 0 surely, where the sampler's strict coin never accepts it (law (1, 0))
    torch = pytest.importorskip("torch")
    from otspec.decoding._verifiers import step_law_t

    p, q = pair
    V = p.shape[0]
    drafts = [1] if data is None else data.draw(st.lists(st.integers(0, V - 1), min_size=1, max_size=3))
    got = step_law_t(torch.tensor(p), torch.tensor(q), drafts).numpy()
    ref = _multiround_law([Fraction(float(x)) for x in p], [Fraction(float(x)) for x in q], drafts)
    assert np.all(got[np.asarray(q) == 0] == 0.0)
    assert np.abs(got - np.array([float(x) for x in ref])).max() <= 8 * (len(drafts) + 1) * (V + 1) * EPS


# ----------------------------------------------------------------------------- block verification along one path


def _coin(t: Fraction, d: Fraction) -> Fraction:
    """``P(u d < t)`` for ``u`` uniform on [0, 1): the strict acceptance coin, in rationals."""
    return Fraction(0) if t == 0 else Fraction(1) if d <= t else t / d


def _tau_law_rational(name: str, block, P, Q) -> list[Fraction]:
    """``P(tau = t | X^L)`` in rationals from the published rules (Sun et al., arXiv:2403.10444): per-token
    acceptance (``"token"``), Algorithm 3's backward walk (``"block"``: ``P(tau = L) = min(1, w_L)``, then
    ``X^k`` accepted w.p. ``min(1, p_remain / p_rej)``, ``k = L-1 .. 1``, with ``w_k = prod_{i <= k} q_i / p_i``
    (ratio 1 at ``p_i = 0``), ``p_remain, p_rej = sum (w_k q_{k+1} - p_{k+1})_+, sum (p_{k+1} - w_k q_{k+1})_+``),
    and the one-correction-token variant (``h_t``: ``h_0 = 1``, ``h_L = v_L``, ``h_i = Z_i / (Z_i + 1 - v_i)``, ``v``
    the capped chain ``v_i = min(1, v_{i-1} r_i)``, ``Z_i = sum (v_i q_{i+1} - p_{i+1})_+``)."""
    L = len(block)
    r = [Q[i][x] / P[i][x] if P[i][x] > 0 else Fraction(1) for i, x in enumerate(block)]
    out = [Fraction(0)] * (L + 1)
    if name == "token":
        reach = Fraction(1)
        for i, x in enumerate(block):
            a = _coin(Q[i][x], P[i][x])
            out[i] += reach * (1 - a)
            reach *= a
        out[L] += reach
        return out
    if name == "block":
        w = [Fraction(1)]
        for ri in r:
            w.append(w[-1] * ri)
        out[L] = min(Fraction(1), w[L])
        left = 1 - out[L]
        for k in range(L - 1, 0, -1):
            d = [w[k] * b - a for a, b in zip(P[k], Q[k])]
            remain, rej = sum(max(x, 0) for x in d), sum(max(-x, 0) for x in d)
            h = Fraction(1) if remain >= rej else remain / rej
            out[k] = left * h
            left *= 1 - h
        out[0] = left
        return out
    v = [Fraction(1)]
    for ri in r:
        v.append(min(Fraction(1), v[-1] * ri))
    h = [Fraction(1)] + [Fraction(0)] * L
    h[L] = v[L]
    for i in range(1, L):
        Z = sum(max(v[i] * b - a, 0) for a, b in zip(P[i], Q[i]))
        h[i] = Fraction(1) if Z + 1 - v[i] == 0 else Z / (Z + 1 - v[i])
    for t in range(L + 1):
        out[t] = h[t] * math.prod((1 - h[j] for j in range(t + 1, L + 1)), start=Fraction(1))
    return out


@st.composite
def extreme_paths(draw, max_v: int = 4, max_l: int = 4):
    """``(block, P, Q)``: ``L`` draft and target laws from the extreme strategy, a block of any tokens (those of
    draft probability 0 included); path probabilities to 1e-1200."""
    V, L = draw(st.integers(1, max_v)), draw(st.integers(1, max_l))
    P = [draw(extreme_laws(V)) for _ in range(L)]
    Q = [draw(extreme_laws(V)) for _ in range(L)]
    if draw(st.booleans()):  # blocks the draft proposes
        block = [draw(st.sampled_from(np.flatnonzero(p > 0).tolist())) for p in P]
    else:
        block = draw(st.lists(st.integers(0, V - 1), min_size=L, max_size=L))
    return block, P, Q


def _exact(row) -> list[Fraction]:
    """A row in rationals as tau_law_on_path reads it: no subnormal flushed, no rescaling."""
    return [Fraction(float(x)) for x in row]


@pytest.mark.parametrize("name", ["token", "block", "block-onestep"])
@FAST
@given(path=extreme_paths())
@example(path=([0, 0, 0], [np.array([1e-300, 1.0 - 1e-300])] * 3, [np.array([1.0 - 1e-300, 1e-300])] * 3))
@example(path=([1, 1, 1], [np.array([1.0 - 1e-300, 1e-300])] * 3, [np.array([1e-300, 1.0 - 1e-300])] * 3))
def test_tau_law_on_path_matches_rationals_on_extreme_paths(name, path):
    # the law of the accepted length along one block, exact past the float range (weights 1e+900 and 1e-900 on the
    # way; subnormal entries read as given, as documented): every entry within a few roundings per depth, and the
    # full-block entry of the token and block rules (a product of ratios, well conditioned) relatively (fails on
    # weights whose products overflow to inf * 0 = nan or underflow to 0 before a large ratio). The other entries
    # hold complements 1 - h of ratios of sums, which move by an ulp's worth when a row's sum is 1 within an ulp:
    # absolute there.
    block, P, Q = path
    L, V = len(block), P[0].shape[0]
    P0, Q0 = [p.copy() for p in P], [q.copy() for q in Q]
    got = tau_law_on_path(name, block, P, Q)
    assert all(np.array_equal(a, b) for a, b in zip(P + Q, P0 + Q0))  # inputs unchanged
    ref = [float(x) for x in _tau_law_rational(name, block, [_exact(p) for p in P], [_exact(q) for q in Q])]
    tol = 16 * L * (V + 2) * EPS
    assert np.abs(got - np.array(ref)).max() <= tol, (got, ref)
    if name != "block-onestep":
        assert abs(got[L] - ref[L]) <= tol * ref[L] + 4 * L * TINY_NORMAL, (got, ref)


@pytest.mark.parametrize("name", ["token", "block", "block-onestep"])
@FAST
@given(models=extreme_models(max_v=3, depth=3), L=st.integers(1, 3))
def test_block_verifiers_lossless_by_enumeration_on_extreme_models(name, models, L):
    # the law of the output, continued by the target, is the target's (every block enumerated), and the expected
    # length of block verification is Theorem 1's optimum in rationals, relative (fails on a backward walk's ratio
    # or a residual formed from weights lost below 2**-1022)
    draft, target, V = models
    chk = block_check_lossless(draft, target, L, name)
    assert chk.max_error <= 1e-12
    if name != "block":
        return
    dl, tl = _Laws(draft), _Laws(target)
    opt = Fraction(0)
    for ell in range(1, L + 1):
        for x in itertools.product(range(V), repeat=ell):
            pm = math.prod((dl(x[:i])[x[i]] for i in range(ell)), start=Fraction(1))
            qm = math.prod((tl(x[:i])[x[i]] for i in range(ell)), start=Fraction(1))
            opt += min(pm, qm)
    got = block_expected_length(draft, target, L, "block")
    assert abs(got - float(opt)) <= 64 * L * V**L * EPS * float(opt), (got, float(opt))


@pytest.mark.parametrize("p,q", [([0.0, 1.0 - 1e-6, 1e-6], [1e-9, 0.0, 1.0 - 1e-9]),
                                 ([0.0, 1.0, 1e-299], [1.0 - 1e-7, 0.0, 1e-7])])
def test_traversal_keeps_a_small_residual_after_a_rejection_at_little_draft_mass(p, q):
    # Traversal Verification on a wor pair (tokens 1 then 2, draft mass 1e-6 left after the first): the second
    # rejection moves the root's level to t' ~ 1e6 and leaves S(t') = q(0) = 1e-9; the noise floor was
    # 64 eps (S + t + t') = 1.4e-8, so the level was kept and the root emitted token 2 instead of token 0: a loss
    # of 1e-9 (1e-7 at draft mass 1e-299 left). Fails on that floor; the rounding bound is 64 eps (S + (t + t') l).
    chk = tree_check_lossless("traversal", TreeShape([(0,), (1,)]), MemorylessModel(p), MemorylessModel(q),
                              process="wor")
    assert chk.max_error <= 1e-12, chk.max_error


@pytest.mark.parametrize("jit", [True, False])
@pytest.mark.parametrize("name", ["sequoia", "traversal"])
@pytest.mark.parametrize("tiny", [5e-324, 1e-310, 1e-300])
def test_wor_rules_reject_at_a_subnormal_draft_mass_left(jit, name, tiny, monkeypatch):
    # root laws p = (0, 1, tiny), q = (1/2, 0, 1/2), children tokens 1 then 2 (drawn without replacement): token 1
    # is rejected surely, token 2 (draft law 1 off token 1) accepted w.p. 1/2, and its rejection leaves the residual
    # (1, 0, 0), so row 0 of the emission is (1/2, 0, 0). At a draft mass left l = tiny below 2**-1022 the level
    # t' = t + S / l overflowed to inf, inf * 0 = nan dropped token 0 (p = 0) from S(t'), the level was kept and the
    # rejected token 2 emitted: (1/4, 0, 1/4). Fails on the level's terms formed as q - t p where p = 0, either
    # route (compiled kernel or numpy).
    monkeypatch.setattr(tree_verifiers_module, "JIT", jit and tree_verifiers_module.JIT)
    tree = DraftTree.from_paths([(1,), (2,)])
    P = np.array([[0.0, 1.0, tiny], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    Q = np.array([[0.5, 0.0, 0.5], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    v = make_tree_verifier(name)
    E = v.emission(tree, P, Q)
    assert np.array_equal(E[0], [0.5, 0.0, 0.0]) and np.array_equal(E[2], [0.5, 0.0, 0.0]), E
    assert all(v.sample(tree, P, Q, rng=s) != (0, 2) for s in range(20))


# ----------------------------------------------------------------------------- the harness on extreme laws


def _flushed_law(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return np.where(x < TINY_NORMAL, 0.0, x)


def _speculative_step(p, q, *, strict: bool = True, residual: bool = True):
    """Leviathan et al.'s step (arXiv:2211.17192, Algorithm 1), batched: accept ``x`` when ``u p(x) < q(x)``
    (``<=`` with ``strict=False``), else draw from ``(q - p)_+`` normalised (``q`` with ``residual=False``)."""
    p, q = _flushed_law(p), _flushed_law(q)
    r = np.maximum(q - p, 0.0)
    r = r / r.sum() if residual and r.sum() > 0 else q / q.sum()

    def step(drafts, rng):
        x = drafts[:, 0]
        u = rng.random(x.shape[0])
        acc = u * p[x] < q[x] if strict else u * p[x] <= q[x]
        return np.where(acc, x, rng.choice(p.shape[0], size=x.shape[0], p=r))

    return step


@FAST
@given(pair=extreme_pairs(1, 5), seed=st.integers(0, 2**16))
@example(pair=(np.array([1e-300, 1.0 - 1e-300]), np.array([1.0 - 1e-300, 1e-300])), seed=0)
def test_check_sampler_passes_an_exact_step_and_leaves_the_laws_alone(pair, seed):
    # an exact sampler on extreme laws (1e-300 cells, zeros in one law only, one-hot laws) passes: its failure
    # probability is the stated alpha_fail = 1e-4 per example (9 examples with the explicit one, fixed seeds: the
    # outcome is fixed, and a correct step fails one of them with probability about 9e-4; the boundary phase fails
    # only on a draw outside the support, never for this step); p and q are never written
    p, q = pair
    p0, q0 = p.copy(), q.copy()
    res = check_sampler(_speculative_step(p, q), p, q, batched=True, tv=0.05, boundary_coins=True, rng=seed)
    assert np.array_equal(p, p0) and np.array_equal(q, q0)
    assert res.passed, res
    again = check_sampler(_speculative_step(p, q), p, q, batched=True, tv=0.05, boundary_coins=True, rng=seed)
    assert (again.pvalue, again.n_samples) == (res.pvalue, res.n_samples)  # a function of the seed


@pytest.mark.parametrize("kind", ["non-strict coin", "target instead of the residual"])
def test_check_sampler_catches_a_wrong_step_on_extreme_laws(kind):
    # a non-strict coin accepts a draft of target mass 0 on a boundary coin u = 0 (the draft 1 has p = 1/2 > 0 = q);
    # drawing a rejection's token from q instead of (q - p)_+ moves the output law by TV 0.25 here (p holds a 1e-300
    # cell). Each is flagged: the first by a draw outside the support (certain once a boundary coin of 0 meets the
    # draft 1), the second with probability >= 0.99 at tv = 0.05 (the sample-size rule).
    if kind == "non-strict coin":
        p, q = np.array([0.5, 0.5]), np.array([1.0, 0.0])
        step = _speculative_step(p, q, strict=False)
    else:
        p, q = np.array([0.5, 0.5 - 1e-300, 1e-300]), np.array([0.0, 0.5, 0.5])
        step = _speculative_step(p, q, residual=False)
    res = check_sampler(step, p, q, batched=True, tv=0.05, boundary_coins=True, rng=0)
    assert not res.passed
    if kind == "non-strict coin":
        assert res.outside_support > 0


@st.composite
def raw_trees(draw, max_v: int = 4):
    """``(tree, P, Q)``: a gapless shape of up to 4 nodes, any tokens (duplicates among siblings, tokens of draft
    mass 0), and raw extreme rows as a caller hands them (subnormal entries kept: validate_tree_laws does not
    flush them)."""
    shape = draw(shapes(max_nodes=4, max_depth=2, gaps=False))
    V = draw(st.integers(1, max_v))
    toks = [-1] + [draw(st.integers(0, V - 1)) for _ in range(shape.n)]
    tree = DraftTree(shape, shape.parents, toks)
    P = np.array([draw(extreme_laws(V)) for _ in range(shape.n + 1)])
    Q = np.array([draw(extreme_laws(V)) for _ in range(shape.n + 1)])
    if draw(st.booleans()):  # a subnormal draft mass beside exact zeros: a rejection's level past the float range
        P[0] = 0.0
        P[0][draw(st.integers(0, V - 1))] = 1.0
        P[0][draw(st.integers(0, V - 1))] += 5e-324
    return tree, P, Q


@pytest.mark.parametrize("name", ["specinfer", "sequoia", "target-only"])
@FAST
@given(case=raw_trees())
@example(case=(DraftTree.from_paths([(1,), (2,)]), np.array([[0.0, 1.0, 5e-324], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]),
               np.array([[0.5, 0.0, 0.5], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])))
def test_per_node_emission_on_raw_extreme_rows_matches_rationals(name, case):
    # the exact emission on one realised tree against the published rule in rationals on the very rows given (no
    # flush), every entry within 1e-12 and row sums exact to the same (fails on a level overflowing to inf, where
    # inf * 0 = nan dropped the tokens of draft mass 0)
    tree, P, Q = case
    children = [list(tree.children(i)) for i in range(tree.n + 1)]
    toks = tree.tokens.tolist()
    Pr = [[Fraction(float(x)) for x in row] for row in P]
    Qr = [[Fraction(float(x)) for x in row] for row in Q]
    if name == "sequoia" and any(len(set(toks[c] for c in ch)) < len(ch) for ch in children):
        return  # Sequoia's children are distinct tokens
    ref = _emission(name, children, toks, Pr, Qr)
    E = make_tree_verifier(name).emission(tree, P, Q)
    for v, row in ref.items():
        assert np.abs(E[v] - np.array([float(x) for x in row])).max() <= 1e-12, (v, E[v], [float(x) for x in row])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["specinfer", "sequoia", "target-only"])
@SLOW
@given(case=raw_trees(max_v=5))
def test_per_node_emission_on_raw_extreme_rows_sweep(name, case):
    test_per_node_emission_on_raw_extreme_rows_matches_rationals.hypothesis.inner_test(name, case)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["token", "block", "block-onestep"])
@SLOW
@given(path=extreme_paths(max_v=5, max_l=5))
def test_tau_law_on_path_sweep(name, path):
    test_tau_law_on_path_matches_rationals_on_extreme_paths.hypothesis.inner_test(name, path)


def test_token_rule_never_accepts_a_draft_of_target_and_draft_mass_0():
    # per-token verification's law along a block took min(1, q / p) = 1 at p = q = 0 (the block weights'
    # convention), while its sampler's strict coin eta * p < q never accepts there: the law said tau = 1 surely,
    # the sampler tau = 0. Fails on the ratio's convention in _path_tau_law / _tau_given_block.
    law = tau_law_on_path("token", [0], [np.array([0.0, 1.0])], [np.array([0.0, 1.0])])
    assert np.array_equal(law, [1.0, 0.0])
    v = make_block_verifier(MemorylessModel([0.0, 1.0]), MemorylessModel([0.0, 1.0]), 1, "token")
    assert np.array_equal(v.tau_given_block((0,)), [1.0, 0.0])
    assert all(v.verify((0,), rng=s).tau == 0 for s in range(10))


@pytest.mark.parametrize("name", ["gbv", "hsd"])
def test_chain_rules_with_ratios_past_the_float_range(name):
    # one chain 0, 0 with p(0) = 1e-200 and q(0) = 1 at both nodes: the ratios are 1e200 and their product 1e400
    # overflowed (a RuntimeWarning, an error under the suite's filter) in the joint ratio of HSD's last step; both
    # rules accept the whole block surely (capped chain min(1, 1e200) = 1, joint min(1, 1e400) = 1) and emit the
    # bonus from the leaf's target law. Fails on the float products.
    tree = DraftTree.from_paths([(0,), (0, 0)])
    P = np.array([[1e-200, 1.0 - 1e-200], [1e-200, 1.0 - 1e-200], [0.5, 0.5]])
    Q = np.array([[1.0, 0.0], [1.0, 0.0], [0.5, 0.5]])
    E = make_tree_verifier(name).emission(tree, P, Q)
    assert np.array_equal(E, [[0.0, 0.0], [0.0, 0.0], [0.5, 0.5]]), E


def test_spechub_accepts_a_draft_of_subnormal_probability_without_overflow():
    # one child carrying token 1, p(1) = 5e-324 < q(1) = 1/2: accepted surely (min(1, q / p) = 1), the bonus from
    # the child's law; q / p overflowed to inf on the way (a RuntimeWarning, an error under the suite's filter).
    # Fails on the quotient formed before the cap.
    P = np.array([[1.0, 5e-324], [0.5, 0.5]])
    Q = np.array([[0.5, 0.5], [0.5, 0.5]])
    E = make_tree_verifier("spechub").emission(DraftTree.from_paths([(1,)]), P, Q)
    assert np.array_equal(E, [[0.0, 0.0], [0.5, 0.5]]), E
    two = DraftTree.from_paths([(0,), (1,)])
    E = make_tree_verifier("spechub").emission(two, np.vstack([P, P[1:]]), np.vstack([Q, Q[1:]]))
    assert E.min() >= 0.0 and abs(E.sum() - 1.0) <= 1e-15


@pytest.mark.parametrize("name,process", [pytest.param("specinfer", "iid", marks=pytest.mark.slow),
                                          pytest.param("sequoia", "wor", marks=pytest.mark.slow),
                                          ("traversal", "wor"), ("target-only", "topk")])
def test_check_tree_sampler_passes_the_package_samplers_on_extreme_laws(name, process):
    # the tree harness on the package's own samplers, draft (1e-300, 1/2, 1/2 - 1e-300) and target (1/2, 0, 1/2):
    # a child of target mass 0 drafted half the time, a child the draft almost never proposes; each check fails a
    # correct sampler with probability alpha_fail = 1e-4 (fixed seed: a fixed outcome; 4e-4 for the four), and its
    # boundary phase only on a draw outside the target's support
    draft = MemorylessModel([1e-300, 0.5, 0.5 - 1e-300])
    target = MemorylessModel([0.5, 0.0, 0.5])
    res = check_tree_sampler(make_tree_verifier(name), TreeShape([(0,), (1,), (0, 0)]), draft, target,
                             process=process, tv=0.1, boundary_coins=True, rng=0)
    assert res.passed, res


# ----------------------------------------------------------------------------- the profile's intervals

_VALUES = [0.0, 1e-300, 1e-17, 0.1, 0.5, 0.9, 1.0 - 2.0**-53, 1.0]


@FAST
@given(point=st.sampled_from(_VALUES), spread=st.lists(st.sampled_from(_VALUES), min_size=2, max_size=40),
       prompts=st.integers(0, 30), kind=st.integers(0, 3))
@example(point=0.0, spread=[0.0, 0.0], prompts=2, kind=0)  # a verifier that never accepts
@example(point=1e-300, spread=[1e-300, 1e-300], prompts=3, kind=0)  # identical prompts
@example(point=1.0 - 2.0**-53, spread=[1.0, 0.9], prompts=2, kind=0)  # near the top of the range
def test_profile_interval_stays_in_range_and_holds_a_constant_estimate(point, spread, prompts, kind):
    # the 95 % interval of a quantity with a proven range: both ends inside the range, no warning on resamples at
    # an end of the range (the logit scale's u (1 - u) of 1e-300), one prompt flagged as no interval, and
    # identical prompts (every resample the point) give the point itself (fails on a Student half-width divided by
    # a zero u (1 - u), or ends clipped to the wrong side)
    kw = [dict(lower=0.0, upper=1.0), dict(lower=0.0), dict(difference=True), dict(lower=1.0, upper=3.0)][kind]
    res = np.array(spread)
    if kind == 3:  # tokens per call in [1, L + 1], L = 2
        point, res = 1.0 + 2.0 * point, 1.0 + 2.0 * res
    e = _interval(point, res, 10, prompts, **kw)
    a, b = kw.get("lower", -np.inf), kw.get("upper", np.inf)
    assert a <= e.lo <= e.hi <= b, e
    assert e.has_interval == (prompts != 1)
    flat = _interval(point, np.full(50, point), 10, prompts, **kw)
    assert flat.lo <= point <= flat.hi and flat.hi - flat.lo <= 4 * EPS * abs(point), flat
