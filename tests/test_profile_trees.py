"""Draft-tree families in a profile: exact rows, the draw laws, paired and batched runs, summaries, the held-out
choice, the command line and bad input."""

from __future__ import annotations

import json
import math
import re
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

import otspec.__main__ as cli  # noqa: E402
from otspec.decoding._sampling import Sampling  # noqa: E402
from otspec.models import MarkovModel  # noqa: E402
from otspec.profile import ProfileSettings, profile, read_table, summarize, toy_pair  # noqa: E402
from otspec.profile._trees import (  # noqa: E402
    LawBuffers,
    _ShapeJob,
    draw_and_score,
    eagle2_from_universe,
    position_values,
    reach_of,
    resolve_trees,
    tree_rng,
)
from otspec.tree import (  # noqa: E402
    Eagle2Params,
    TreeShape,
    enumerate_trees,
    make_tree_verifier,
    sample_tree,
    tree_laws,
    value,
)

TREES = ("topk:branching(2,2)", "topk:[[0],[2],[0,1]]", "eagle2:3,2,5", "iid:branching(2,2):specinfer,target-only",
         "wor:branching(3,1):sequoia,traversal,target-only")


def _softmax(W: np.ndarray) -> np.ndarray:
    e = np.exp(W - W.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _markov(lm) -> MarkovModel:
    """The toy bigram ``CallableLM`` as an otspec.models Model (numpy softmax: an independent route)."""
    return MarkovModel(_softmax(lm.fn.table))


def _at_context(draft, target, ctx, plan, seed=0):
    """One position's trees after ``ctx``, as the profile draws and scores them."""
    s = Sampling(1.0, None, None, "ties")
    ds, ts = draft.new_state(), target.new_state()
    p = s.probs(draft.logits(ds, torch.tensor([ctx])))[:, -1].numpy()
    q = s.probs(target.logits(ts, torch.tensor([ctx])))[:, -1].numpy()
    got = draw_and_score(draft, ds, target, ts, [ctx[-1]], len(ctx), p, q, plan, s, [tree_rng(seed, 0)])[0]
    assert ds.length == ts.length == len(ctx)  # the states hold the context again
    return got


# --------------------------------------------------------------------------- exact at one context
@pytest.mark.parametrize("seed", [0, 1])
def test_rows_are_exact_at_one_context(seed):
    draft, target = toy_pair(4, seed=seed + 3)
    Md, Mt = _markov(draft), _markov(target)
    ctx = (1, 3, 0)
    plan = resolve_trees(TREES, "branching(3,2)")
    got = _at_context(draft, target, list(ctx), plan, seed)
    vals = position_values(plan, got, 4)
    # the universe: the package's top-k tree, and the target's path probabilities of its nodes
    U = plan.universe
    T = sample_tree(U, Md, process="topk", prefix=ctx)
    np.testing.assert_array_equal(got["universe"].tree.tokens, T.tokens)
    _, Q = tree_laws(T, Md, Mt, prefix=ctx)
    P, _ = tree_laws(T, Md, Mt, prefix=ctx)
    Qp, Pp = np.ones(U.n + 1), np.ones(U.n + 1)
    for c in range(1, U.n + 1):
        Qp[c] = Qp[U.parents[c]] * Q[U.parents[c], T.tokens[c]]
        Pp[c] = P[U.parents[c], T.tokens[c]]  # the draft's probability of the node's token
    np.testing.assert_allclose(vals["treeq"], Qp[1:], rtol=1e-12, atol=0)
    np.testing.assert_allclose(vals["treep"], Pp[1:], rtol=1e-12, atol=0)
    # deterministic trees: the sum of the target's path probabilities, as otspec.tree.value enumerates
    for f in plan.topk:
        want = value(f.shape, Md, Mt, process="topk", verifier="target-only", prefix=ctx)
        np.testing.assert_allclose(vals["tree"][f.label], want, rtol=1e-12, atol=0)
    want = value(Eagle2Params(3, 2, 5), Md, Mt, process="eagle2", verifier="target-only", prefix=ctx)
    np.testing.assert_allclose(vals["tree"]["eagle2:3,2,5"], want, rtol=1e-12, atol=0)
    # sampled trees: each verifier's expected_accepted on the true laws at every node of the drawn tree
    for f in plan.sampled:
        T = got[f.label].tree
        P, Q = tree_laws(T, Md, Mt, prefix=ctx)
        for v, name in zip(f.verifiers, f.names()):
            ver = make_tree_verifier(v)
            np.testing.assert_allclose(vals["tree"][name], ver.expected_accepted(T, P, Q), rtol=1e-12, atol=1e-15)
            np.testing.assert_allclose(vals["treenode"][name], reach_of(T, ver.emission(T, P, Q))[1:], rtol=1e-12,
                                       atol=1e-15)


def test_law_buffers_kept_across_trees_give_the_fresh_values():
    # one LawBuffers through several contexts and families of different sizes (a smaller tree after a larger one
    # leaves rows to reset): every value equal to the one computed with fresh arrays, and the rows that are not
    # the last tree's internal nodes uniform again
    draft, target = toy_pair(4, seed=5)
    plan = resolve_trees(["wor:branching(3,2):sequoia,traversal", "iid:branching(1,1):specinfer",
                          "iid:branching(2,2,1):specinfer,target-only"])
    buf = LawBuffers()
    for i, ctx in enumerate(([0, 1], [2], [3, 3, 1], [1])):
        got = _at_context(draft, target, ctx, plan, i)
        kept, fresh = position_values(plan, got, 4, buf), position_values(plan, got, 4)
        assert kept["tree"] == fresh["tree"]
        for name, r in fresh["treenode"].items():
            np.testing.assert_array_equal(kept["treenode"][name], r)
        last = got[plan.sampled[-1].label]
        other = np.setdiff1d(np.arange(buf.P.shape[0]), last.inner)
        np.testing.assert_array_equal(buf.P[other], 0.25)
        np.testing.assert_array_equal(buf.Q[other], 0.25)


def _top(W: np.ndarray, k: int) -> np.ndarray:
    """Softmax of each row of logits restricted to its ``k`` largest (the sampling's top-k law)."""
    cut = np.sort(W, axis=-1)[:, -k][:, None]
    return _softmax(np.where(W >= cut, W, -np.inf))


def test_eagle2_ranks_by_the_drafts_own_law_under_truncation():
    # with top-k sampling, EAGLE-2 ranks and scores its candidates by the draft's own law (temperature 1,
    # untruncated), as EAGLE's and SGLang's drafters and otspec's tree decoder do, and the target's processed law
    # decides acceptance: the recorded value is otspec.tree.value on those two models, not on the truncated draft
    V, k = 6, 3
    draft, target = toy_pair(V, seed=2, closeness=0.6)
    own, trunc, Mt = _markov(draft), MarkovModel(_top(draft.fn.table, k)), MarkovModel(_top(target.fn.table, k))
    s = Sampling(1.0, k, None, "ties")
    plan = resolve_trees(["eagle2:3,2,5", "eagle2:2,3,6"], "branching(3,3,3)")
    differs = 0
    for ctx in ([0, 1], [4], [2, 2, 3], [5, 0], [3]):
        ds, ts = draft.new_state(), target.new_state()
        logits = draft.logits(ds, torch.tensor([ctx]))[:, -1]
        p, r = s.probs(logits).numpy(), s.own_law(logits).numpy()
        q = s.probs(target.logits(ts, torch.tensor([ctx])))[:, -1].numpy()
        got = draw_and_score(draft, ds, target, ts, [ctx[-1]], len(ctx), p, q, plan, s, [tree_rng(0, 0)],
                             r_root=r)[0]
        vals = position_values(plan, got, V)
        Pp, Qp = np.concatenate([[1.0], vals["treep"]]), np.concatenate([[1.0], vals["treeq"]])
        for f in plan.eagle2:
            want = value(f.shape, own, Mt, process="eagle2", verifier="target-only", prefix=tuple(ctx))
            np.testing.assert_allclose(vals["tree"][f.label], want, rtol=1e-12, atol=0)
            post = eagle2_from_universe(f.shape, plan.universe, plan.index, Pp, Qp)  # the universe's own route
            np.testing.assert_allclose(post, want, rtol=1e-12, atol=0)
            other = value(f.shape, trunc, Mt, process="eagle2", verifier="target-only", prefix=tuple(ctx))
            differs += abs(other - want) > 1e-9
    assert differs > 0  # the truncated draft law would build other trees here: the check can tell them apart
    with pytest.raises(ValueError, match="r_root"):
        draw_and_score(draft, ds, target, ts, [ctx[-1]], len(ctx), p, q, plan, s, [tree_rng(0, 0)])


def test_eagle2_from_the_universe_is_the_recorded_value():
    draft, target = toy_pair(5, seed=2)
    plan = resolve_trees(["eagle2:3,2,5", "eagle2:2,3,7"], "branching(3,3,3)")
    for ctx in ([0, 1], [4], [2, 2, 3]):
        got = _at_context(draft, target, ctx, plan)
        vals = position_values(plan, got, 5)
        Pp, Qp = np.concatenate([[1.0], vals["treep"]]), np.concatenate([[1.0], vals["treeq"]])
        for f in plan.eagle2:
            post = eagle2_from_universe(f.shape, plan.universe, plan.index, Pp, Qp)
            np.testing.assert_allclose(post, vals["tree"][f.label], rtol=1e-12, atol=0)
    # a proposal outside the universe: no value
    assert eagle2_from_universe(Eagle2Params(2, 4, 5), plan.universe, plan.index, Pp, Qp) is None


def test_transformers_kv_cache_left_padded_batch():
    # a tiny Llama pair (KV cache, tree mask): two prompts of unequal lengths in one left-padded batch; every
    # law at the trees' nodes against the same path scored alone, without cache (float32: rtol 1e-4)
    pytest.importorskip("transformers")
    from otspec.decoding._models import next_token_logits
    from tests.toy_lm import tiny_llama

    draft, target = tiny_llama(0), tiny_llama(1)
    ctxs = [[3, 1, 4, 1, 5], [9, 2]]
    pad = [0, 3]
    ids = torch.tensor([[0] * a + c for a, c in zip(pad, ctxs)])
    s = Sampling(1.0, None, None, "ties")
    ds, ts = draft.new_state(pad=pad), target.new_state(pad=pad)
    p = s.probs(draft.logits(ds, ids))[:, -1].numpy()
    q = s.probs(target.logits(ts, ids))[:, -1].numpy()
    plan = resolve_trees(["eagle2:3,2,5", "wor:branching(2,2):sequoia"], "branching(3,2)")
    got = draw_and_score(draft, ds, target, ts, ids[:, -1].numpy(), 5, p, q, plan, s, [tree_rng(0, 0), tree_rng(0, 1)])
    assert ds.length == ts.length == 5 and ds.batch == ts.batch == 2

    def laws(lm, prefixes):
        return s.probs(next_token_logits(lm, prefixes)).numpy()

    for b, ctx in enumerate(ctxs):
        for sc in got[b].values():
            paths = sc.tree.paths()
            prefixes = [ctx + list(paths[v]) for v in sc.inner.tolist()]
            np.testing.assert_allclose(sc.q, laws(target, prefixes), rtol=1e-4, atol=1e-7)
            np.testing.assert_allclose(np.stack([sc.p[v] for v in sc.inner.tolist()]), laws(draft, prefixes),
                                       rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("process,paths", [("iid", [(0,), (1,), (0, 0)]), ("wor", [(0,), (2,), (0, 0), (0, 1)])])
def test_draw_law_matches_the_enumeration(process, paths):
    # chi-square of 6,000 drawn trees against enumerate_trees' exact law; false-failure rate 1e-4
    from scipy.stats import chisquare

    draft, _ = toy_pair(3, seed=5)
    Md = _markov(draft)
    shape, ctx = TreeShape(paths), (2,)
    exact = {tuple(T.tokens.tolist()): w for T, w in enumerate_trees(shape, Md, process=process, prefix=ctx)}
    rng = np.random.default_rng(11)
    counts = dict.fromkeys(exact, 0)
    for _ in range(6000):
        job = _ShapeJob(shape, process, rng, "t")
        job.expand(0, Md.next_dist(ctx))
        for level in range(1, shape.max_depth):
            for v in job.need(level):
                path, u = [], v
                while u > 0:
                    path.append(int(job.tokens[u]))
                    u = int(shape.parents[u])
                job.expand(v, Md.next_dist(ctx + tuple(reversed(path))))
        counts[tuple(job.tree().tokens.tolist())] += 1
    obs = np.array([counts[k] for k in exact])
    exp = np.array([exact[k] for k in exact]) * obs.sum()
    assert chisquare(obs, exp).pvalue > 1e-4


# --------------------------------------------------------------------------- a run
PROMPTS = [[0, 1], [2], [3, 4, 1], [1], [5, 0], [2, 2, 4]]
RUN = dict(k_max=2, L_max=2, max_new_tokens=4, verifiers=["token"], families=["token", "block"], shard_size=3)


@pytest.fixture(scope="module")
def tree_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("trees")
    draft, target = toy_pair(6, seed=1)
    profile(PROMPTS, out=d / "with", draft=draft, target=target, trees=TREES, tree_universe="branching(3,2,2)", **RUN)
    return d


def _frame(path, kinds):
    t = read_table(path).to_pandas()
    return t[t.kind.isin(kinds)].sort_values(["prompt", "pos", "kind", "name", "k", "j", "m"]).reset_index(drop=True)


def test_pairs_with_the_k_L_rows_and_changes_nothing_else(tree_run, tmp_path):
    draft, target = toy_pair(6, seed=1)
    profile(PROMPTS, out=tmp_path / "without", draft=draft, target=target, **RUN)
    a = _frame(tree_run / "with", ("acc", "tau", "calls", "e", "logq"))
    b = _frame(tmp_path / "without", ("acc", "tau", "calls", "e", "logq"))
    plan = resolve_trees(TREES, "branching(3,2,2)")
    # the trees' own emission rows along the text, beside: every name but the rules on children drawn without
    # replacement that read the draft's law (no closed form, and one drawn tree is no estimator)
    own = a.name.isin(plan.names())
    assert set(a[own].name) == set(plan.names()) - {"wor:branching(3,1)/traversal", "wor:branching(3,1)/sequoia"}
    assert set(a[own].kind) == {"e"}
    a = a[~own].reset_index(drop=True)
    assert len(a) == len(b) > 0
    np.testing.assert_array_equal(a["value"].to_numpy(), b["value"].to_numpy())  # same contexts, same drafts
    assert (a.drop(columns="value") == b.drop(columns="value")).all().all()
    # the tree rows sit at every profiled position of every prompt
    t = _frame(tree_run / "with", ("tree",))
    assert set(t.groupby(["prompt", "pos"]).name.nunique()) == {len(plan.names())}
    assert len(t.groupby(["prompt", "pos"])) == len(b.groupby(["prompt", "pos"]))


def test_topk_rows_are_sums_of_the_universe(tree_run):
    plan = resolve_trees(TREES, "branching(3,2,2)")
    t = read_table(tree_run / "with").to_pandas()
    q = t[t.kind == "treeq"].pivot_table(index=["prompt", "pos"], columns="j", values="value")
    assert q.shape[1] == plan.universe.n
    for f in plan.topk:
        rows = t[(t.kind == "tree") & (t.name == f.label)].set_index(["prompt", "pos"]).value
        assert (t[(t.kind == "tree") & (t.name == f.label)].k == f.n).all()
        idx = [plan.index[p] for p in f.shape.paths[1:]]
        want = q[idx].apply(lambda r: math.fsum(r.tolist()), axis=1)
        np.testing.assert_allclose(rows.loc[want.index].to_numpy(), want.to_numpy(), rtol=1e-15, atol=0)


def test_batched_runs_record_the_same_tree_rows(tree_run, tmp_path):
    draft, target = toy_pair(6, seed=1)
    profile(PROMPTS, out=tmp_path / "b", draft=draft, target=target, trees=TREES, tree_universe="branching(3,2,2)",
            batch_size=3, **RUN)
    a = _frame(tree_run / "with", ("tree", "treeq", "treep", "treenode"))
    b = _frame(tmp_path / "b", ("tree", "treeq", "treep", "treenode"))
    assert len(a) == len(b) > 0
    np.testing.assert_array_equal(a["value"].to_numpy(), b["value"].to_numpy())


def test_summary_tokens_per_call_and_held_out_choice(tree_run):
    s = summarize(tree_run / "with", n_boot=200)
    ts = s.trees
    t = read_table(tree_run / "with").to_pandas()
    for name, e in ts.tokens_per_call.items():
        v = t[(t.kind == "tree") & (t.name == name)].value
        np.testing.assert_allclose(e.value, 1.0 + v.mean(), rtol=1e-12)
        assert e.lo <= e.value <= e.hi and e.positions == len(v)
    assert set(ts.chains) == set(s.sets["all"].tokens_per_call)  # the (k, L) schemes of the same positions
    ch = ts.choice
    q = t[t.kind == "treeq"].pivot_table(index=["prompt", "pos"], columns="j", values="value")
    prompt = q.index.get_level_values(0).to_numpy()
    mean_even = q[prompt % 2 == 0].mean(axis=0)
    plan = resolve_trees(TREES, "branching(3,2,2)")
    for st in ch.static[:6]:
        ids = [plan.index[p] for p in st.paths]
        assert len(ids) == st.n
        # the n paths of largest mean Q on the even prompts ...
        assert mean_even[ids].min() >= mean_even.drop(ids).max() if st.n < plan.universe.n else True
        # ... measured on the odd ones
        np.testing.assert_allclose(st.tokens_per_call.value, 1.0 + q[prompt % 2 == 1][ids].sum(axis=1).mean(),
                                   rtol=1e-12)
    # every family on the evaluation half, and the best static shape of a top-k family's size against it (paired)
    for name, e in ch.heldout.items():
        v = t[(t.kind == "tree") & (t.name == name) & (t.prompt % 2 == 1)].value
        np.testing.assert_allclose(e.value, 1.0 + v.mean(), rtol=1e-12)
    for f in plan.topk:
        d = ch.versus[f.label]
        np.testing.assert_allclose(d.value, ch.static[f.n - 1].tokens_per_call.value - ch.heldout[f.label].value,
                                   rtol=1e-12, atol=1e-15)
        assert d.lo <= d.value <= d.hi
    assert ch.fastest in ch.static
    assert ch.export["medusa_choices"] == [list(p) for p in ch.fastest.paths]
    assert ch.sequoia and len(ch.acceptance) == 3 and ch.sequoia_source.endswith("/sequoia")


def _rewrite(src, dst, change):
    """A copy of a run whose tree rows go through ``change(table) -> table``."""
    shutil.copytree(src, dst)
    for path in sorted(dst.glob("shard-*.parquet")):
        pq.write_table(change(pq.read_table(path)), path)


def _scale_subtree(table, parity: int, js, factor: float):
    """The target path probabilities of the universe nodes ``js`` (a whole subtree) scaled on one parity."""
    kind, prompt, j = (table[c].to_numpy(zero_copy_only=False) for c in ("kind", "prompt", "j"))
    v = table["value"].to_numpy().copy()
    hit = (kind == "treeq") & (prompt % 2 == parity) & np.isin(j, js)
    v[hit] = np.minimum(v[hit] * factor, 1.0)
    return table.set_column(table.schema.get_field_index("value"), "value", pa.array(v))


def test_the_choice_never_reads_the_evaluation_half(tree_run, tmp_path):
    plan = resolve_trees(TREES, "branching(3,2,2)")
    base = summarize(tree_run / "with", n_boot=50).trees.choice
    sub = [plan.index[p] for p in plan.universe.paths[1:] if p[0] == 2]  # the subtree of the rank-2 child
    # the odd prompts made to favour it hugely: no chosen shape changes, their values do
    _rewrite(tree_run / "with", tmp_path / "odd", lambda t: _scale_subtree(t, 1, sub, 1e6))
    odd = summarize(tmp_path / "odd", n_boot=50).trees.choice
    assert [s.paths for s in odd.static] == [s.paths for s in base.static]
    assert odd.fastest.paths == base.fastest.paths
    assert any(a.tokens_per_call.value != b.tokens_per_call.value for a, b in zip(odd.static, base.static))
    # the same change on the even prompts moves the choice (the test can fail)
    _rewrite(tree_run / "with", tmp_path / "even", lambda t: _scale_subtree(t, 0, sub, 1e6))
    even = summarize(tmp_path / "even", n_boot=50).trees.choice
    assert even.static[0].paths == ((2,),) and base.static[0].paths != ((2,),)


def test_report_and_figures(tree_run, tmp_path):
    pytest.importorskip("matplotlib")
    from otspec.profile import write_report

    path = write_report(tree_run / "with", dest=tmp_path / "rep", n_boot=50)
    text = path.read_text()
    assert "## Draft trees, on all" in text and "## Choosing a draft tree" in text and "medusa_choices" in text
    assert "--speculative-num-steps" in text and "Sequoia's dynamic programme" in text
    for f in ("trees_tokens.png", "trees_speedup.png", "tree_chosen.png"):  # 24 positions: too few to draw
        assert not (tmp_path / "rep" / f).exists() and re.search(rf"- The .*\({f}|, {f}\).*left out", text)


def test_tree_costs_are_calibrated(tree_run):
    t = read_table(tree_run / "with", timing=True).to_pandas()
    cost = t[(t.kind == "cost") & (t.name == "tree-target")]
    plan = resolve_trees(TREES, "branching(3,2,2)")
    assert {f.n + 1 for f in plan.families} <= set(cost.m)
    assert (cost.groupby("m").size() == 3).all()


# --------------------------------------------------------------------------- bad input, before any model call
@pytest.mark.parametrize("trees,match", [
    (["topk:[[0],[0,0,1]]"], r"`trees\[0\]`: `paths` must be prefix-closed: the parent path \(0, 0\) of \(0, 0, 1\)"),
    (["wor:chains(2,2):specinfer"], r"`trees\[0\]`: verifier 'specinfer' is not lossless on 'wor' trees"),
    (["iid:chains(2,2):sequoia"], r"verifier 'sequoia' is not lossless on 'iid'"),
    (["wor:[[0],[2]]:traversal"], r"skips a sibling rank"),
    (["tpk:chains(2,2)"], r"process must be one of .* got 'tpk' \(did you mean 'topk'\?\)"),
    (["topk:chains(2,2):specinfer"], r"verifier 'specinfer' is not lossless on 'topk' trees"),
    (["wor:chains(2,2):hsd"], r"'hsd' is not lossless on 'wor' trees of this shape: it is lossless for no draft "
                              r"process \(lossy as its authors coded it\)$"),
    (["eagle2:3,2"], r"eagle2 takes three integers"),
    (["eagle2:2,2,9"], r"exceeds the 6 nodes proposed"),
    (["iid:chains(2,2):specinfr"], r"unknown tree verifier 'specinfr' \(did you mean 'specinfer'\?\)"),
    (["topk:branching(40,40)"], r"branching\(40,40\) has 1,640 draft nodes, above the limit MAX_DRAFT_TREE_NODES = 1,024"),
    (["topk:chains(1,65)"], r"depth 65 is above the limit MAX_TREE_DEPTH"),
    (["topk:chains(2,2)", "topk:[[0],[1],[0,0],[1,0]]"], r"`trees\[1\]` repeats the family"),
    (["topk:star(3)"], r"a shape must be branching"),
    ([3], r"`trees\[0\]` must be a text"),
])
def test_bad_trees_are_refused(trees, match):
    with pytest.raises((ValueError, TypeError), match=match):
        ProfileSettings(trees=trees)


def _counting_pair(**attrs):
    draft, target = toy_pair(4, seed=0)
    for lm in (draft, target):
        for k, v in attrs.items():
            setattr(lm, k, v)
    return draft, target


def test_too_deep_or_too_wide_for_the_models_is_refused_before_any_call(tmp_path):
    draft, target = _counting_pair(max_positions=8)
    with pytest.raises(ValueError, match=r"reaches position 9, past the draft model's context of 8 positions"):
        profile([[0, 1, 2]], out=tmp_path / "a", draft=draft, target=target, max_new_tokens=4, trees=["topk:chains(1,3)"])
    with pytest.raises(ValueError, match=r"needs 3 distinct children at a node, but `top_k` = 2 leaves at most 2"):
        profile([[0]], out=tmp_path / "b", draft=draft, target=target, top_k=2, trees=["wor:branching(3)"])
    with pytest.raises(ValueError, match=r"needs 5 distinct children .* a vocabulary of 4 tokens"):
        profile([[0]], out=tmp_path / "c", draft=draft, target=target, tree_universe="branching(5)")
    assert draft.n_calls == target.n_calls == 0
    assert not any((tmp_path / x).exists() for x in "abc")


def test_a_folder_with_other_tree_settings_is_refused(tmp_path):
    draft, target = toy_pair(4, seed=0)
    kw = dict(out=tmp_path / "r", draft=draft, target=target, max_new_tokens=2, k_max=1, L_max=1,
              verifiers=["token"], families=["token"])
    profile([[0]], trees=["topk:chains(1,2)"], **kw)
    man = json.loads((tmp_path / "r" / "manifest.json").read_text())
    assert man["settings"]["trees"] == ["topk:chains(1,2)"]
    with pytest.raises(ValueError, match=r"holds a run with other settings \(trees: \['topk:chains\(1,2\)'\] there, "
                                         r"\['topk:chains\(2,2\)'\] here"):
        profile([[0]], trees=["topk:chains(2,2)"], **kw)
    assert profile([[0]], trees=["topk:chains(1,2)"], **kw).shards_skipped == 1  # the same settings resume


def test_settings_without_trees_keep_their_manifest_entry():
    d = ProfileSettings().to_dict()
    assert "trees" not in d and "tree_universe" not in d
    s = ProfileSettings(trees=[("wor", TreeShape.chains(2, 2), "sequoia"), ("eagle2", Eagle2Params(2, 2, 4))])
    assert s.trees == ("wor:[[0],[1],[0,0],[1,0]]:sequoia", "eagle2:2,2,4")
    assert ProfileSettings(**s.to_dict()).trees == s.trees


# --------------------------------------------------------------------------- command line
def test_command_line_end_to_end(tmp_path, capsys):
    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps({"input_ids": p}) + "\n" for p in ([0, 1], [2], [3], [4, 5])))
    args = ["profile", "--draft", "toy:6", "--target", "toy:6", "--prompts", str(f), "--out", str(tmp_path / "r"),
            "--k-max", "1", "--L-max", "2", "--max-new-tokens", "3", "--families", "token", "--verifiers", "token",
            "--no-progress", "--trees", "topk:branching(2,2)", "wor:chains(2,2):sequoia", "eagle2:2,2,4",
            "--tree-universe", "branching(3,2)"]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "draft trees: topk:branching(2,2), wor:chains(2,2)/sequoia, eagle2:2,2,4 (top-k universe: 9 rank paths)" in out
    assert cli.main(["report", str(tmp_path / "r"), "--no-figures"]) == 0
    text = (tmp_path / "r" / "report.md").read_text()
    assert "| wor:chains(2,2)/sequoia | wor | 4 | 2 |" in text and "medusa_choices" in text
    # other tree settings on the same folder: refused before loading, naming the flag
    assert cli.main(args[:-3] + ["topk:branching(3)"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and re.search(r"holds a run with other settings \(.*trees: \[.*'eagle2:2,2,4'\] "
                                                   r"there, \[.*'topk:branching\(3\)'\] here\)", err), err


def test_command_line_bad_trees_name_the_flag(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cli, "_load_pair", lambda *a, **k: pytest.fail("a model was loaded"))
    f = tmp_path / "p.jsonl"
    f.write_text('{"input_ids": [0]}\n')
    base = ["profile", "--draft", "toy:4", "--target", "toy:4", "--prompts", str(f), "--out", str(tmp_path / "r")]
    assert cli.main(base + ["--trees", "topk:[[1],[0,0]]"]) == 2
    err = capsys.readouterr().err
    assert re.match(r"error: `--trees\[0\]`: `paths` must be prefix-closed: the parent path \(0,\) of \(0, 0\)", err)
    assert cli.main(base + ["--tree-universe", "branching(5)"]) == 2
    assert "`--trees`: the top-k universe (`--tree-universe`" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
