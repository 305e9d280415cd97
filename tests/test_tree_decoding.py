"""Speculative decoding with draft trees (``speculative_decode(tree=..., process=...)``).

Independent routes:

* the realised trees: the decoder grows them depth by depth from its batched draft calls; with the
  same seed they must be exactly the trees of ``otspec.tree.sample_tree`` (``sample_spechub_tree``),
  which queries a plain model once per node;
* the laws the verifier sees: every node's ``q`` (one tree-attention call) and every drafted node's
  ``p`` (the draft's KV cache, rows selected per depth) against scoring the node's whole path from
  scratch;
* losslessness: Pearson's chi-square of the first 2 (slow: 3) decoded tokens against the target's
  exact law from plain target scoring (``exact_prefix_law``), for every registered tree verifier on
  a process it is lossless for (on both routes where the device one exists), on the toy pair and on a
  tiny Llama; a lossy pairing fails the
  same test (the test can fail);
* greedy decoding: token for token the target's greedy continuation (``autoregressive_decode``);
* acceptance: measured tokens per call against ``otspec.tree.value`` (exact enumeration over the
  realised trees) at every context the run visited, within Monte Carlo error.

Each chi-square or z test fails spuriously with probability ALPHA_FAIL = 1e-4; this file has 36 of
them (slow ones included), so its false-failure rate is below 3.6e-3 (union bound); the seeds are
fixed, so a run is reproducible.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import otspec  # noqa: E402
import otspec.decoding as D  # noqa: E402
import otspec.tree as T  # noqa: E402
from otspec.decoding._tree_device import DEVICE_TREE_PROCESSES, DEVICE_TREE_VERIFIERS  # noqa: E402
from otspec.models import random_markov_model  # noqa: E402
from otspec.testing import chi2_gof  # noqa: E402
from otspec.tree._published import enumerate_spechub_trees, sample_spechub_tree  # noqa: E402
from tests.test_decoding import _Counting as _CountingLM  # noqa: E402
from tests.test_decoding import _tiny_llama  # noqa: E402
from tests.toy_lm import table_fn  # noqa: E402

torch.set_num_threads(1)
ALPHA_FAIL = 1e-4
#: two-sided normal quantile at ALPHA_FAIL
Z_FAIL = 3.890591886413094
V = 5
SHAPE = T.TreeShape([(0,), (1,), (0, 0), (1, 0)])  # two chains of two: every verifier's shape (GBV's too)
EAGLE = T.Eagle2Params(depth=2, top_k=2, total_tokens=4)

#: (verifier, process, tree) -- every registered tree verifier on a process (and shape) it is lossless for
LOSSLESS = [
    ("specinfer", "iid", SHAPE),
    ("sequoia", "wor", SHAPE),
    ("target-only", "topk", SHAPE),
    ("target-only", "eagle2", EAGLE),
    ("target-only", "iid", SHAPE),
    (T.SpecTrTreeVerifier(token_verifier="optimal"), "iid", SHAPE),
    ("traversal", "wor", SHAPE),
    ("gbv", "iid", SHAPE),
    ("hsd", "iid", T.TreeShape.chains(1, 1)),
    ("spechub", "spechub", SHAPE),
]
#: the pairings of LOSSLESS that the device route runs (engine="auto" picks it)
ON_DEVICE = [c for c in LOSSLESS if isinstance(c[0], str) and c[0] in DEVICE_TREE_VERIFIERS
             and c[1] in DEVICE_TREE_PROCESSES]


def test_every_registered_tree_verifier_is_covered():
    assert {T.make_tree_verifier(v).name for v, _, _ in LOSSLESS} == set(otspec.multidraft.verifier_names(kind="tree"))
    for v, process, tree in LOSSLESS:
        assert T.make_tree_verifier(v).lossless_for(process, tree), (v, process)


# ----------------------------------------------------------------------------- toy models
class _TableModel:
    """``otspec.models.Model`` view of a toy CallableLM's second-order table (the law after a context)."""

    def __init__(self, table):
        self.table = table
        self.vocab_size = int(table.shape[-1])

    def next_dist(self, prefix):
        prev = int(prefix[-2]) if len(prefix) >= 2 else 0
        return D.Sampling().probs(self.table[prev, int(prefix[-1])][None])[0].numpy()


def _pair(seed=0, noise=0.8):
    """(target, draft) CallableLMs of second-order tables and their Model views."""
    g = torch.Generator().manual_seed(seed)
    tq = torch.randn(V, V, V, generator=g, dtype=torch.float64) * 1.5
    tp = tq + noise * torch.randn(V, V, V, generator=g, dtype=torch.float64)
    return D.CallableLM(table_fn(tq), V), D.CallableLM(table_fn(tp), V), _TableModel(tq), _TableModel(tp)


@pytest.fixture(scope="module")
def toy():
    return _pair()


@pytest.fixture(scope="module")
def tiny_hf():
    target = _tiny_llama(1, layers=3)
    return D.HFCausalLM(target), D.HFCausalLM(D.layer_skip_draft(target, [0, 2]))


class _Recording(T.TreeVerifier):
    """A tree verifier that records what the decoder hands it: (tree, p_nodes, q_nodes, output)."""

    def __init__(self, inner):
        self.inner = inner
        self.name = inner.name
        self.processes = inner.processes
        self.seen = []

    def lossless_for(self, process, shape=None):
        return self.inner.lossless_for(process, shape)

    def emission(self, tree, p_nodes, q_nodes, *, validate=True):
        return self.inner.emission(tree, p_nodes, q_nodes, validate=validate)

    def expected_accepted(self, tree, p_nodes, q_nodes, *, validate=True):
        return self.inner.expected_accepted(tree, p_nodes, q_nodes, validate=validate)

    def sample(self, tree, p_nodes, q_nodes, *, rng=None, validate=True):
        out = self.inner.sample(tree, p_nodes, q_nodes, rng=rng, validate=validate)
        self.seen.append((tree, np.array(p_nodes), np.array(q_nodes), out))
        return out


def _run(target, draft, prompt, verifier, process, tree, **kw):
    rec = _Recording(T.make_tree_verifier(verifier))
    res = D.speculative_decode(prompt, draft=draft, target=target, tree=tree, process=process, verifier=rec, **kw)
    return res, rec.seen


# ----------------------------------------------------------------------------- the realised trees
@pytest.mark.parametrize("process,tree", [
    ("iid", SHAPE), ("wor", T.TreeShape([(0,), (1,), (2,), (0, 0), (0, 1), (2, 0), (0, 0, 0)])),
    ("topk", T.TreeShape([(0,), (1,), (0, 0), (0, 2), (1, 1), (0, 0, 0)])),
    ("eagle2", T.Eagle2Params(depth=3, top_k=2, total_tokens=6)), ("spechub", SHAPE), ("iid", T.TreeShape.chains(3, 2)),
])
def test_first_tree_is_sample_trees_tree_for_the_same_seed(toy, process, tree):
    """The decoder's per-depth growth draws exactly the tree otspec.tree draws node by node (same generator); the
    first iteration drafts the whole tree (``max_new_tokens`` leaves it ``depth + 1`` tokens to make)."""
    target, draft, _, dm = toy
    depth = tree.depth if process == "eagle2" else tree.max_depth
    for seed in range(4):
        res, seen = _run(target, draft, [1, 2], "target-only" if process != "spechub" else "spechub", process, tree,
                         max_new_tokens=depth + 1, rng=seed)
        assert res.draft_lengths[0] == depth
        gen = D.make_rng(seed)
        if process == "spechub":
            want = sample_spechub_tree(tree, dm, prefix=(1, 2), rng=gen)
        else:
            want = T.sample_tree(tree, dm, process=process, prefix=(1, 2), rng=gen)
        got = seen[0][0]
        np.testing.assert_array_equal(got.parents, want.parents)
        np.testing.assert_array_equal(got.tokens, want.tokens)


@pytest.mark.parametrize("process,verifier,tree", [("iid", "specinfer", T.TreeShape([(0,), (1,), (2,), (1, 0), (2, 0),
                                                                                    (2, 0, 0)])),
                                                   ("eagle2", "target-only", T.Eagle2Params(3, 2, 6))])
@pytest.mark.parametrize("models", ["toy", "tiny_hf"])
def test_laws_at_every_node_are_the_models_laws(request, models, process, verifier, tree):
    """q at every node (one tree call) and p at every drafted node (KV cache, rows per depth) equal the laws of
    the node's full path scored from scratch, over several iterations (the caches carried between them)."""
    target, draft = request.getfixturevalue(models)[:2]
    prompt = [1, 2, 3]
    res, seen = _run(target, draft, prompt, verifier, process, tree, max_new_tokens=20, rng=3)
    exact = models == "toy"
    ctx = list(prompt)
    sampling = D.Sampling()
    drafted = 0
    for tr, P, Q, (a, y) in seen:
        paths = tr.paths()
        has_child = np.zeros(tr.n + 1, dtype=bool)
        has_child[tr.parents[1:]] = True
        ids = [ctx + list(s) for s in paths]
        q = sampling.probs(D.next_token_logits(target, ids)).numpy()
        p = sampling.probs(D.next_token_logits(draft, ids)).numpy()
        tol = dict(rtol=0, atol=0) if exact else dict(rtol=0, atol=2e-6)
        np.testing.assert_allclose(Q, q, **tol)
        np.testing.assert_allclose(P[has_child], p[has_child], **tol)
        drafted += int(has_child.sum())
        ctx += list(paths[a]) + [int(y)]
    # the last iteration may be plain decoding's step (one token left): no tree, no verifier
    assert len(seen) == int((res.draft_lengths > 0).sum()) >= 3 and drafted > 3 * len(seen) - 1
    made = ctx[len(prompt):]
    assert len(made) == 20 - int(res.draft_lengths[-1] == 0)
    np.testing.assert_array_equal(made, res.tokens[: len(made)])


@pytest.mark.parametrize("verifier,process,tree",
                         LOSSLESS + [(T.SpecTrTreeVerifier("optimal"), "iid", T.TreeShape([(0,), (1,), (1, 0)]))])
def test_verifiers_never_read_the_draft_law_of_an_undrafted_node(verifier, process, tree):
    """The decoder drafts no law at a node without children (a leaf whose path no drafted node shares): it hands
    the verifier that node's q instead. Emission and samples do not change when that row is anything else.
    V = 2 makes repeated siblings (SpecTr's groups read p at the first of equal nodes) frequent."""
    d, t = random_markov_model(2 if process != "spechub" else 3, rng=4), random_markov_model(2, rng=5)
    if process == "spechub":
        t = random_markov_model(3, rng=5)
        trees = [tr for tr, _ in enumerate_spechub_trees(tree, d)]
    else:
        trees = [tr for tr, _ in T.enumerate_trees(tree, d, process=process)]
    v = T.make_tree_verifier(verifier)
    rng = np.random.default_rng(0)
    for tr in trees[:40]:
        P, Q = T.tree_laws(tr, d, t)
        paths = tr.paths()
        drafted = {paths[i] for i in set(tr.parents[1:].tolist())}
        other = P.copy()
        for i, s in enumerate(paths):
            if s not in drafted:
                other[i] = rng.dirichlet(np.ones(P.shape[1]))
        np.testing.assert_array_equal(v.emission(tr, P, Q), v.emission(tr, other, Q))
        for seed in range(3):
            assert v.sample(tr, P, Q, rng=seed) == v.sample(tr, other, Q, rng=seed)


# ----------------------------------------------------------------------------- losslessness
def _counts(target, draft, prompt, m, runs, seed, **kw):
    """Counts of the first ``m`` tokens of ``runs`` decodes over the target's exact law's cells (one more cell for
    anything outside them), and that law with 0 appended."""
    cells, law = D.exact_prefix_law(target, prompt, m, temperature=kw.get("temperature", 1.0),
                                     top_k=kw.get("top_k"), top_p=kw.get("top_p"))
    index = {c: i for i, c in enumerate(cells)}
    counts = np.zeros(len(cells) + 1, dtype=np.int64)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(runs):
        res = D.speculative_decode(prompt, draft=draft, target=target, max_new_tokens=m, rng=gen, **kw)
        counts[index.get(tuple(res.tokens[:m].tolist()), len(cells))] += 1
    return counts, np.append(law, 0.0)


def _fast_or_slow(case):
    """A case of the chi-square below, marked slow for "target-only" (the verifier that ignores the draft law): its
    top-k and EAGLE-2 processes keep a default chi-square on both routes in
    tests/test_tree_decoding_last_iteration.py::test_joint_law_with_pruned_trees (whole and pruned trees, 3 tokens),
    and i.i.d. drafting keeps SpecInfer's cases here; all of them run under ``-m slow``."""
    return pytest.param(*case, marks=pytest.mark.slow) if case[0] == "target-only" else case


@pytest.mark.parametrize("verifier,process,tree,engine", [_fast_or_slow((*c, "auto")) for c in LOSSLESS]
                         + [_fast_or_slow((*c, "numpy")) for c in ON_DEVICE])
def test_lossless_first_two_tokens_toy(toy, verifier, process, tree, engine):
    """Every verifier by its default route ("auto": on the device where it has that route), and those with a
    device route on the host too."""
    target, draft = toy[:2]
    counts, law = _counts(target, draft, [1, 2], 2, 600, 11, tree=tree, process=process, verifier=verifier,
                          engine=engine)
    g = chi2_gof(counts, law, alpha_fail=ALPHA_FAIL)
    assert g.outside_support == 0 and g.passed, (verifier, process, g)


@pytest.mark.slow
@pytest.mark.parametrize("verifier,process,tree", LOSSLESS)
def test_lossless_first_three_tokens_toy_slow(toy, verifier, process, tree):
    target, draft = toy[:2]
    counts, law = _counts(target, draft, [1, 2], 3, 4000, 12, tree=tree, process=process, verifier=verifier)
    assert chi2_gof(counts, law, alpha_fail=ALPHA_FAIL).passed, (verifier, process)


def test_a_lossy_pairing_fails_the_same_test(toy):
    """SpecInfer's rule on top-k children (it assumes i.i.d. ones) is lossy: refused, and with allow_lossy the
    chi-square above rejects it (the test can fail)."""
    target, draft = toy[:2]
    with pytest.raises(ValueError, match=r"lossless for the processes \('iid',\)"):
        D.speculative_decode([1, 2], draft=draft, target=target, tree=SHAPE, process="topk", verifier="specinfer")
    counts, law = _counts(target, draft, [1, 2], 2, 600, 11, tree=SHAPE, process="topk", verifier="specinfer",
                          allow_lossy=True)
    assert not chi2_gof(counts, law, alpha_fail=ALPHA_FAIL).passed
    res = D.speculative_decode([1, 2], draft=draft, target=target, tree=SHAPE, process="topk", verifier="specinfer",
                               allow_lossy=True, max_new_tokens=4, rng=0)
    assert res.lossless is False


@pytest.mark.parametrize("verifier,process,tree", [
    LOSSLESS[0], pytest.param(*LOSSLESS[3], marks=pytest.mark.slow), *[pytest.param(*c, marks=pytest.mark.slow)
                                                                     for c in LOSSLESS[1:3] + LOSSLESS[4:]]])
def test_lossless_tiny_transformers(tiny_hf, verifier, process, tree):
    """The same through HFCausalLM: the draft's KV cache with rows per depth, the target's tree attention."""
    target, draft = tiny_hf
    counts, law = _counts(target, draft, [3, 1], 2, 400, 13, tree=tree, process=process, verifier=verifier)
    g = chi2_gof(counts, law, alpha_fail=ALPHA_FAIL)
    assert g.outside_support == 0 and g.passed, (verifier, process, g)


# ----------------------------------------------------------------------------- greedy decoding
@pytest.mark.parametrize("tree,process,verifier", [
    (T.TreeShape([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]), "topk", "target-only"),
    (T.Eagle2Params(depth=3, top_k=2, total_tokens=6), "eagle2", "target-only"),
    (SHAPE, "iid", "specinfer"),
])
@pytest.mark.parametrize("models", ["toy", "tiny_hf"])
def test_greedy_tree_decoding_is_greedy_target_decoding(request, models, tree, process, verifier):
    target, draft = request.getfixturevalue(models)[:2]
    ref = D.autoregressive_decode(target, [1, 2], max_new_tokens=30, temperature=0, rng=0).tokens
    accepted = rejected = 0
    for seed in range(2):
        res = D.speculative_decode([1, 2], draft=draft, target=target, tree=tree, process=process, verifier=verifier,
                                   max_new_tokens=30, temperature=0, rng=seed)
        np.testing.assert_array_equal(res.tokens, ref)
        np.testing.assert_array_equal(res.predicted_accepted, res.accepted)  # one-hot laws: exact predictions
        accepted += int(res.accepted.sum())
        rejected += int((res.accepted < res.L).sum())
    assert accepted > 0 and rejected > 0


# ----------------------------------------------------------------------------- acceptance and the record
@pytest.mark.parametrize("verifier,process,tree", [("specinfer", "iid", T.TreeShape([(0,), (1,), (0, 0)])),
                                                   ("target-only", "topk", SHAPE)])
def test_tokens_per_call_agree_with_tree_value(toy, verifier, process, tree):
    """Measured accepted tokens per iteration against otspec.tree.value at the context of each iteration
    (exact, enumerating the realised trees): z of the summed differences within |z| < Z_FAIL; the per-iteration
    prediction from the realised tree (predicted_accepted) agrees too."""
    target, draft, tm, dm = toy
    diffs, pdiffs = [], []
    for seed in range(3):
        res = D.speculative_decode([1, 2], draft=draft, target=target, tree=tree, process=process,
                                   verifier=verifier, max_new_tokens=60, rng=seed)
        start = np.concatenate([[0], np.cumsum(res.emitted)[:-1]])  # tokens decoded before each iteration
        for acc, pred, c, n in zip(res.accepted, res.predicted_accepted, start, res.draft_lengths):
            # the last iterations draft the tree's first n = min(L, left - 1) levels (none: plain decoding's step)
            cut = T.TreeShape([s for s in tree.paths if len(s) <= n]) if n else None
            exact = 0.0 if cut is None else T.value(cut, dm, tm, process=process, verifier=verifier,
                                                    prefix=[1, 2] + res.tokens[:c].tolist())
            diffs.append(acc - exact)
            pdiffs.append(pred - exact)
        np.testing.assert_array_equal(res.emitted, res.accepted + 1)
    d = np.array(diffs)
    z = d.sum() / np.sqrt((d**2).sum())
    assert abs(z) < Z_FAIL, z
    if process == "topk":  # one tree per context: the prediction given the tree is the value itself
        np.testing.assert_allclose(pdiffs, 0.0, atol=1e-12)


def test_decode_result_records_one_target_call_and_one_draft_call_per_depth(toy):
    target, draft = toy[:2]
    res = D.speculative_decode([1, 2], draft=draft, target=target, tree=SHAPE, process="iid", max_new_tokens=25, rng=1)
    assert (res.k, res.L, res.process, res.tree, res.verifier_name, res.lossless) == (2, 2, "iid", SHAPE,
                                                                                       "specinfer", True)
    np.testing.assert_array_equal(res.target_calls, 1)
    # one draft call per level drafted: L_i = min(L, left - 1) levels (plain decoding's step: none)
    assert res.total_target_calls == res.iterations and res.draft_calls == res.draft_lengths.sum()
    assert (res.draft_lengths[:-2] == 2).all() and res.draft_lengths[-1] < 2
    assert res.tokens.shape == (25,) and res.reached.shape == res.predicted_reached.shape == (res.iterations, 2)
    np.testing.assert_array_equal(res.reached.sum(axis=1), res.accepted)
    drafted = res.draft_lengths > 0  # plain decoding's step: nothing verified, alpha NaN, no depth reached
    np.testing.assert_allclose(res.predicted_reached[drafted, 0], res.alpha_first[drafted], rtol=1e-15)
    assert np.isnan(res.alpha_first[~drafted]).all() and (res.predicted_reached[~drafted] == 0).all()
    np.testing.assert_allclose(res.predicted_accepted, res.predicted_reached.sum(axis=1), rtol=1e-12)
    e = D.speculative_decode([1, 2], draft=draft, target=target, tree=EAGLE, max_new_tokens=10, rng=1)
    assert (e.process, e.verifier_name, e.k, e.L) == ("eagle2", "target-only", 2, 2)
    assert e.draft_calls == e.draft_lengths.sum() and (e.draft_lengths[:-2] == 2).all()
    np.testing.assert_allclose(e.alpha_first, e.alpha_opt_first, rtol=1e-14)  # target-only: q of the root's children
    same = D.speculative_decode([1, 2], draft=target, target=target, tree=SHAPE, process="iid", max_new_tokens=12,
                                rng=0)
    np.testing.assert_array_equal(same.accepted, 2)  # identical models accept every draft
    assert same.block_efficiency == 3.0


# ----------------------------------------------------------------------------- bad input
class _Counting(_CountingLM):
    """test_decoding's call-counting wrapper, with tree scoring (counted too) unless ``tree=False``."""

    def __init__(self, lm, tree=True):
        super().__init__(lm)
        if tree:
            self.tree_logits = self._tree_logits

    def _tree_logits(self, *a, **kw):
        self.calls += 1
        return self.lm.tree_logits(*a, **kw)


@pytest.mark.parametrize("kw,exc,match", [
    ({"tree": SHAPE}, ValueError, r"`process` must name the draft process .* got None"),
    ({"tree": SHAPE, "process": "iidd"}, ValueError, "`process` must be one of .*did you mean 'iid'"),
    ({"tree": SHAPE, "process": "eagle2"}, TypeError, "needs `tree` to be an Eagle2Params"),
    ({"tree": EAGLE, "process": "iid"}, TypeError, "needs `tree` to be a TreeShape"),
    ({"tree": [(0,), (1, 0)], "process": "iid"}, ValueError, r"`tree` \(rank paths\).*prefix-closed"),
    ({"tree": "ab", "process": "iid"}, ValueError, r"`tree` must be 'process:shape\[:verifiers\]'"),
    ({"tree": b"ab", "process": "iid"}, TypeError, "`tree` must be a TreeShape"),
    ({"tree": "topk:[]"}, ValueError, "at least one draft node"),
    ({"tree": "iid:chains(2,2)", "process": "wor"}, ValueError, "names the process 'iid' and `process` is 'wor'"),
    ({"tree": T.DraftTree.from_paths([(1,)]), "process": "iid"}, TypeError, "realised DraftTree"),
    ({"tree": [()], "process": "iid"}, ValueError, "at least one draft node"),
    ({"tree": SHAPE, "process": "wor", "verifier": "specinfer"}, ValueError,
     r"'specinfer' is not lossless on process='wor'.*\('iid',\).*allow_lossy=True"),
    ({"tree": T.TreeShape([(0,), (2,)]), "process": "wor", "verifier": "sequoia"}, ValueError,
     r"lossless for the processes \('wor',\) \(for this shape: \(\)\)"),
    ({"tree": T.TreeShape([(0,), (1,), (0, 0)]), "process": "iid", "verifier": "gbv"}, ValueError, "not lossless"),
    ({"tree": SHAPE, "process": "iid", "verifier": "kseq"}, ValueError, "`verifier`"),
    ({"tree": SHAPE, "process": "iid", "verifier": "spectr-tree", "verifier_options": {"bogus": 1}}, ValueError,
     "takes the options"),
    ({"tree": SHAPE, "process": "iid", "allow_lossy": 1}, TypeError, "`allow_lossy` must be a bool"),
    ({"tree": SHAPE, "process": "iid", "k": 2}, ValueError, "`k` describes draft chains"),
    ({"tree": SHAPE, "process": "iid", "L": 3}, ValueError, "`L` describes draft chains"),
    ({"process": "iid"}, ValueError, "`process` describes how a draft tree"),
    ({"allow_lossy": True}, ValueError, "`allow_lossy` applies to draft trees"),
    ({"tree": SHAPE, "process": "wor", "temperature": 0}, ValueError, "greedy decoding"),
    ({"tree": SHAPE, "process": "wor", "top_k": 1}, ValueError, "top_k=1"),
    ({"tree": T.TreeShape([(0,), (5,)]), "process": "topk"}, ValueError, "vocabulary has 5"),
    ({"tree": T.TreeShape([(0,), (1,), (2,)]), "process": "spechub"}, ValueError, "one or two children"),
    ({"tree": SHAPE, "process": "iid", "verifier_options": [1]}, TypeError, "`verifier_options`"),
])
def test_bad_tree_input_before_any_model_call(toy, kw, exc, match):
    t, d = _Counting(toy[0]), _Counting(toy[1])
    with pytest.raises(exc, match=match):
        D.speculative_decode([1, 2], draft=d, target=t, **kw)
    assert t.calls == 0 and d.calls == 0


def test_target_without_tree_scoring_is_refused(toy):
    t, d = _Counting(toy[0], tree=False), _Counting(toy[1])
    with pytest.raises(TypeError, match="`target` must score draft trees"):
        D.speculative_decode([1, 2], draft=d, target=t, tree=SHAPE, process="iid")
    assert t.calls == 0 and d.calls == 0


def test_spechub_vocabulary_bound():
    big = D.CallableLM(lambda ids: torch.zeros(ids.shape + (D._tree_loop.SPECHUB_MAX_VOCAB + 1,)),
                       D._tree_loop.SPECHUB_MAX_VOCAB + 1)
    with pytest.raises(ValueError, match="SPECHUB_MAX_VOCAB"):
        D.speculative_decode([1], draft=big, target=big, tree=SHAPE, process="spechub")


def test_chains_keep_their_defaults(toy):
    """Without `tree` the defaults are those of before: verifier 'token', k = 1, L = 4."""
    target, draft = toy[:2]
    res = D.speculative_decode([1, 2], draft=draft, target=target, max_new_tokens=8, rng=0)
    assert (res.verifier_name, res.k, res.L, res.process, res.tree) == ("token", 1, 4, None, None)


def test_sample_rows_on_a_broadcast_law_equals_the_copied_rows():
    # one cumulative sum for a law broadcast to every row (i.i.d. children): the same draws as the rows copied
    from otspec.decoding._sampling import sample_rows

    rng = np.random.default_rng(5)
    p = rng.dirichlet(np.full(50, 0.3))
    p[[3, 17]] = 0.0
    B = np.broadcast_to(p, (9, p.shape[0]))
    assert B.strides[0] == 0
    np.testing.assert_array_equal(sample_rows(B, np.random.default_rng(1)),
                                  sample_rows(np.array(B), np.random.default_rng(1)))
