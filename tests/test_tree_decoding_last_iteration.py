"""The tree decoders' last iterations: the tree's first ``D_i = min(D, left - 1)`` levels when ``left`` tokens remain
before ``max_new_tokens`` (plain decoding's step at ``left = 1``), the output law still the target's, and every
per-iteration record that of the iteration as made.

Losslessness is tested by Pearson's chi-square of the joint law of all the generated tokens against the target's
exact law (:func:`otspec.decoding.exact_prefix_law`: plain target scoring, no verifier, no tree), with
``max_new_tokens = 3`` and trees of depth 2, so that whole trees, trees cut to their first level and plain decoding's
step are all met. Each chi-square test fails spuriously with probability ALPHA_FAIL = 1e-4; this file holds 8 of
them, so its false-failure rate stays below 1e-3; the seeds are fixed, so a run is reproducible.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import otspec.decoding as D  # noqa: E402
import otspec.tree as T  # noqa: E402
from otspec.decoding._tree_loop import tree_plan  # noqa: E402
from otspec.testing import chi2_gof  # noqa: E402
from tests.test_decoding_last_iteration import _joint_counts, assert_full_acceptance_records  # noqa: E402
from tests.toy_lm import toy_target_draft  # noqa: E402

torch.set_num_threads(1)
ALPHA_FAIL = 1e-4
V = 3
PROMPT = [1, 2]

#: A static tree sampled i.i.d. (SpecInfer) and without replacement (Sequoia), a top-k tree and an EAGLE-2 tree, all
#: of depth 2; each on the host and on the device route. The default suite keeps one static shape (the top-k tree)
#: and EAGLE-2's (its own pruning, the budget capped) on both routes; the i.i.d. and without-replacement trees are
#: cut by the same ``TreePlan.pruned`` on the same loops and run under ``-m slow`` (their pruned first iteration stays
#: in the default suite through tests/test_tree_decoding.py::test_lossless_first_two_tokens_toy, whose
#: ``max_new_tokens = 2`` drafts depth-2 trees cut to their first level, SpecInfer's and Sequoia's on both routes,
#: and through test_predictions_of_pruned_iterations_agree_with_measured below, i.i.d. on both routes).
TREES = [pytest.param("iid:branching(2,2):specinfer", marks=pytest.mark.slow),
         pytest.param("wor:branching(2,1):sequoia", marks=pytest.mark.slow), "topk:[[0],[1],[0,0],[0,1]]",
         "eagle2:2,2,5"]


@pytest.fixture(scope="module")
def toy_pair():
    return toy_target_draft(V, seed=0, named=True)


@pytest.mark.parametrize("engine", ["numpy", "torch"])
@pytest.mark.parametrize("tree", TREES)
def test_joint_law_with_pruned_trees(toy_pair, tree, engine):
    """Depth-2 trees, 3 tokens: the first iteration drafts the whole tree, the next one its first level or plain
    decoding's step; the joint law of the 3 tokens is the target's (chi-square, 27 cells)."""
    target, draft = toy_pair
    counts, law, met = _joint_counts(target, draft, 3, 700, tree=tree, engine=engine)
    assert met == {0, 1, 2}  # whole trees, trees of one level, plain decoding's step
    g = chi2_gof(counts, law, alpha_fail=ALPHA_FAIL)
    assert g.outside_support == 0 and g.passed, (tree, engine, g)


@pytest.mark.parametrize("engine", ["numpy", "torch"])
@pytest.mark.parametrize("tree", ["iid:branching(2,2,1):specinfer", "topk:branching(2,2,1)", "eagle2:3,2,10"])
def test_records_of_pruned_iterations_are_their_own(tree, engine):
    """Identical memoryless draft and target, greedy: every drafted level is accepted, so each iteration's records
    are known exactly -- ``D_i`` accepted, ``D_i + 1`` made, predictions equal to them, ``reached`` ones up to
    ``D_i`` and zeros after, :math:`\\alpha_1 = 1`; plain decoding's step (``D_i = 0``) verifies nothing: NaN
    acceptances, which :func:`summarize` leaves out."""
    # one law at every position: the greedy path is the most likely path of every depth, so EAGLE-2 keeps it too
    lm = D.CallableLM(lambda ids: torch.tensor([1.0, 0.5, 0.0]).expand(ids.shape + (V,)).clone(), vocab_size=V)
    L = 3
    for m, lengths in [(7, [3, 2]), (5, [3, 0]), (3, [2]), (1, [0]), (10, [3, 3, 1])]:
        res = D.speculative_decode(PROMPT, draft=lm, target=lm, tree=tree, max_new_tokens=m, rng=0, engine=engine,
                                   temperature=0)
        assert res.engine == engine and res.draft_calls == sum(lengths)  # one draft call per level drafted
        assert_full_acceptance_records(res, lengths, L, m)


@pytest.mark.parametrize("engine", ["numpy", "torch"])
def test_predictions_of_pruned_iterations_agree_with_measured(toy_pair, engine):
    """Short runs (depth 3, 3 tokens: every iteration pruned, 2, 1 or no levels) -- measured accepted tokens against
    the exact predictions of the pruned trees (martingale z-score; predictions of the whole tree would overshoot)."""
    target, draft = toy_pair
    runs = [D.speculative_decode(PROMPT, draft=draft, target=target, tree="iid:branching(2,1,1):specinfer",
                                 max_new_tokens=3, rng=s, engine=engine) for s in range(80)]
    lengths = np.concatenate([r.draft_lengths for r in runs])
    assert (lengths < 3).all() and set(lengths.tolist()) == {0, 1, 2}
    S = D.summarize(runs)
    assert abs(S.z_accepted) < 4.0, (engine, S.z_accepted)
    np.testing.assert_allclose(S.per_position.sum(), S.mean_accepted, rtol=1e-12)


def test_a_lossy_tree_verifier_keeps_its_tree(toy_pair):
    """A tree verifier not lossless for the process (its output law depends on the shape) drafts the whole tree to
    the end, as the chains' lossy verifiers keep ``L``."""
    target, draft = toy_pair
    for m in (1, 2, 5):
        res = D.speculative_decode(PROMPT, draft=draft, target=target, tree="wor:branching(2,2):specinfer",
                                   allow_lossy=True, max_new_tokens=m, rng=0)
        assert not res.lossless and (res.draft_lengths == 2).all() and res.draft_calls == 2 * res.iterations
        assert res.tokens.shape[0] == m


@pytest.mark.parametrize("tree", ["iid:branching(3,2,2)", "wor:[[0],[1],[2],[0,0],[1,0],[0,0,0],[0,0,1]]",
                                  "topk:branching(2,1,1)", "spechub:branching(2,2,1)", "eagle2:4,3,20",
                                  "eagle2:3,2,4"])
def test_pruned_plan(tree):
    """``TreePlan.pruned(n)``: a shape's nodes of depth <= n (a prefix of its node order), EAGLE-2's first ``n``
    levels with its budget capped at their proposals; the same process, verifier, ``k`` and losslessness; made once
    per depth; the whole plan at ``n >= D``."""
    lm = D.CallableLM(lambda ids: torch.sin(ids[..., None] * torch.arange(1.0, 9.0)), vocab_size=8)
    plan = tree_plan(tree, process=None, verifier=None, options=None, allow_lossy=False, target=lm, V=8,
                     sampling=D.Sampling())
    assert plan.pruned(plan.L) is plan and plan.pruned(plan.L + 1) is plan
    with pytest.raises(ValueError, match="depth"):
        plan.pruned(0)
    for n in range(1, plan.L):
        cut = plan.pruned(n)
        assert cut is plan.pruned(n) and cut.L == n
        assert (cut.process, cut.verifier, cut.name, cut.k, cut.lossless) == (plan.process, plan.verifier, plan.name,
                                                                             plan.k, plan.lossless)
        if plan.process == "eagle2":
            e = plan.shape
            assert (cut.shape.depth, cut.shape.top_k) == (n, e.top_k)
            assert cut.shape.n == min(e.n, e.top_k + (n - 1) * e.top_k**2)
        else:
            keep = [p for p in plan.shape.paths if len(p) <= n]
            assert cut.shape.paths == tuple(keep) == plan.shape.paths[: len(keep)]
            assert cut.shape == T.TreeShape(keep[1:]) and cut.shape.max_depth == n


def test_the_profiles_timed_tree_decodes_time_whole_trees_only(monkeypatch):
    """The profile's timed decodes (its calibration of the decoder's own work) of a tree family span whole trees
    only: the span ends at the scoring call of the last iteration before the first pruned one, so the steady step is
    that of ``depth``-level iterations (the pruned tail, met in most decodes, is left out)."""
    from otspec.profile import ProfileSettings, toy_pair
    from otspec.profile import _overhead as O

    got = []
    real = O.speculative_decode

    def spy(*args, **kw):
        res = real(*args, **kw)
        got.append(res)
        return res

    monkeypatch.setattr(O, "speculative_decode", spy)
    d, t = toy_pair(5, seed=0)
    s = ProfileSettings(k_max=2, L_max=2, families=["token"], verifiers=["token"],
                        trees=["topk:branching(2,2)", "iid:branching(2,1,1):specinfer"])
    trees = [c for c in O.overhead_configs(s) if ":" in c[0]]
    assert len(trees) == 2
    pruned = 0
    for name, k, depth in trees:
        for seed in range(4):
            _, _, n, _, _ = O._decode_once(d, t, [0, 1], s, name, k, depth, seed)
            res = got[-1]
            assert res.L == depth and res.process is not None
            whole = int(np.argmax(res.draft_lengths < depth)) if (res.draft_lengths < depth).any() else res.iterations
            assert n == whole - 1 and whole >= 2
            pruned += whole < res.iterations
    assert pruned > 0  # the pruned tails were met, and left out
