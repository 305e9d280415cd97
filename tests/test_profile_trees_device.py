"""The profile's sampled tree families (i.i.d. and without replacement) on the laws' device: the draws' law, the
values of a drawn tree against the host's verifiers, the laws at its nodes, what reaches the host, bad input."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import otspec.profile._trees_device as TD  # noqa: E402
from otspec.decoding._sampling import Sampling  # noqa: E402
from otspec.models import MarkovModel  # noqa: E402
from otspec.profile import toy_pair  # noqa: E402
from otspec.profile._trees import _Scored, draw_and_score, position_values, resolve_trees, tree_rng  # noqa: E402
from otspec.testing import chi2_gof  # noqa: E402
from otspec.tree import TreeShape, enumerate_trees  # noqa: E402

#: Sampled families of every device rule, irregular shapes, a rank gap and a star (no target call: the root's law).
SAMPLED = ("iid:branching(3,2):specinfer,target-only", "iid:[[0],[1],[0,0],[0,1],[0,0,0]]:specinfer",
           "wor:[[0],[1],[0,0],[1,0],[1,1],[0,0,0]]:sequoia,target-only", "wor:[[0],[2],[0,0],[2,1]]:target-only",
           "wor:branching(3):sequoia,traversal")
PLAIN = Sampling(1.0, None, None, "ties")


def _softmax(W: np.ndarray) -> np.ndarray:
    e = np.exp(W - W.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _at(draft, target, ctxs, plan, sampling=PLAIN, seed=0, on_device=True):
    """One position's trees after the contexts ``ctxs`` (equal lengths), as the profile draws and scores them."""
    ids = torch.tensor(ctxs)
    ds, ts = draft.new_state(), target.new_state()
    logits = draft.logits(ds, ids)[:, -1]
    p, r = sampling.probs(logits).numpy(), sampling.own_law(logits).numpy()
    q = sampling.probs(target.logits(ts, ids))[:, -1].numpy()
    rngs = [tree_rng(seed, b) for b in range(len(ctxs))]
    got = draw_and_score(draft, ds, target, ts, ids[:, -1].numpy(), ids.shape[1], p, q, plan, sampling, rngs,
                         r_root=r, on_device=on_device)
    assert ds.length == ts.length == ids.shape[1]  # the states hold the contexts again
    return got


def _on_host(s: _Scored) -> _Scored:
    """The same drawn tree and laws, without the device's reach probabilities: the host's verifiers' route."""
    return _Scored(s.tree, s.inner, {v: np.array(s.p[v]) for v in s.inner.tolist()},
                   np.stack([s.q[i] for i in range(len(s.inner))]))


# --------------------------------------------------------------------------- values of a drawn tree
@pytest.mark.parametrize(("seed", "top_k"), [(0, None), (1, None), (2, 3)])
def test_values_of_a_device_drawn_tree_equal_the_host_verifiers(seed, top_k):
    # trees drawn on the device's stream for three prompts at once: every (family, verifier) row -- E[tau | T] and
    # every node's reach probability -- within 1e-12 relative of the host's verifiers on the same tree and laws;
    # under top-k truncation every drawn token has positive draft probability at its parent
    V = 6
    draft, target = toy_pair(V, seed=seed, closeness=0.7)
    plan = resolve_trees(SAMPLED)
    got = _at(draft, target, [[1, 3], [2, 2], [5, 0]], plan, Sampling(1.0, top_k, None, "ties"), seed=seed)
    for scored in got:
        for s in scored.values():
            assert all(s.p[int(s.tree.parents[c])][int(s.tree.tokens[c])] > 0 for c in range(1, s.tree.n + 1))
        dev = position_values(plan, scored, V)
        host = position_values(plan, {k: _on_host(s) for k, s in scored.items()}, V)
        assert dev["tree"].keys() == host["tree"].keys() == set(plan.names())
        assert {k for k, s in scored.items() if s.reach} == {f.label for f in plan.sampled}
        for name in host["tree"]:
            np.testing.assert_allclose(dev["tree"][name], host["tree"][name], rtol=1e-12, atol=0)
            np.testing.assert_allclose(dev["treenode"][name], host["treenode"][name], rtol=1e-12, atol=0)
        assert "wor:branching(3)/traversal" not in scored["wor:branching(3)"].reach  # no device rule: the host's


def test_the_laws_at_a_device_drawn_trees_nodes_are_the_models():
    # the draft's and the target's laws held at every internal node of a device-drawn tree are the bigram models'
    # laws after that node's token (numpy softmax of their tables: an independent route), so the draft calls were
    # fed the drawn tokens and the target scored the drawn tree
    V = 7
    draft, target = toy_pair(V, seed=4, closeness=0.6)
    Wp, Wq = _softmax(draft.fn.table), _softmax(target.fn.table)
    plan = resolve_trees(SAMPLED[:4])
    ctxs = [[1, 3, 0], [2, 2, 5]]
    for b, scored in enumerate(_at(draft, target, ctxs, plan, seed=7)):
        for s in scored.values():
            for i, v in enumerate(s.inner.tolist()):
                last = ctxs[b][-1] if v == 0 else int(s.tree.tokens[v])
                np.testing.assert_allclose(s.p[v], Wp[last], rtol=1e-12, atol=1e-300)
                np.testing.assert_allclose(s.q[i], Wq[last], rtol=1e-12, atol=1e-300)


def test_tiny_llama_trees_on_the_device_route():
    # a real model class (KV cache, tree attention): the device route's values equal the host verifiers' on the same
    # drawn trees, the drawn tokens are the models' vocabulary, and the draws are reproducible from the seed
    from tests.toy_lm import tiny_llama

    draft, target = tiny_llama(1), tiny_llama(2)
    plan = resolve_trees(SAMPLED[:3])
    ctxs = [[1, 5, 7], [3, 3, 0]]
    got = _at(draft, target, ctxs, plan, seed=3)
    again = _at(draft, target, ctxs, plan, seed=3)
    for scored, other in zip(got, again):
        dev = position_values(plan, scored, 12)
        host = position_values(plan, {k: _on_host(s) for k, s in scored.items()}, 12)
        for name in host["tree"]:
            np.testing.assert_allclose(dev["tree"][name], host["tree"][name], rtol=1e-12, atol=0)
            np.testing.assert_allclose(dev["treenode"][name], host["treenode"][name], rtol=1e-12, atol=0)
        for k, s in scored.items():
            assert ((s.tree.tokens[1:] >= 0) & (s.tree.tokens[1:] < 12)).all()
            np.testing.assert_array_equal(other[k].tree.tokens, s.tree.tokens)


# --------------------------------------------------------------------------- the draws' law
@pytest.mark.parametrize("process,paths", [("iid", [(0,), (1,), (0, 0)]), ("wor", [(0,), (2,), (0, 0), (0, 1)])])
def test_device_draw_law_matches_the_enumeration(process, paths):
    # 6,000 trees drawn on the device's stream (2,000 prompts of one context per call, every node of a depth of every
    # prompt in one batch) against enumerate_trees' exact law: Pearson chi-square (cells of expected count < 5
    # pooled), false-failure rate 1e-4 per process
    draft, target = toy_pair(3, seed=5)
    Md = MarkovModel(_softmax(draft.fn.table))
    shape, ctx = TreeShape(paths), (2,)
    exact = {tuple(T.tokens.tolist()): w for T, w in enumerate_trees(shape, Md, process=process, prefix=ctx)}
    plan = resolve_trees([f"{process}:{[list(p) for p in paths]}:target-only".replace(" ", "")])
    counts = dict.fromkeys(exact, 0)
    for seed in range(3):
        for scored in _at(draft, target, [list(ctx)] * 2000, plan, seed=seed):
            counts[tuple(scored[plan.families[0].label].tree.tokens.tolist())] += 1
    assert sum(counts.values()) == 6000  # every drawn tree is a tree of the enumeration
    obs = np.array([counts[k] for k in exact])
    law = np.array([exact[k] for k in exact])
    assert chi2_gof(obs, law / law.sum(), alpha_fail=1e-4).passed


# --------------------------------------------------------------------------- what reaches the host
def test_sampled_trees_on_the_device_read_the_host_once_and_move_no_law(monkeypatch):
    # families whose every verifier has a device rule: one read for the position (tokens, supports, reach
    # probabilities), no (., V) law moved to the host; a verifier without a device rule reads the laws (once)
    V = 40
    draft, target = toy_pair(V, seed=2)
    moved = []
    to_numpy = torch.Tensor.numpy

    def numpy(self, *args, **kw):
        moved.append(tuple(self.shape))
        return to_numpy(self, *args, **kw)

    for specs, laws_read in ((SAMPLED[:4], False), (SAMPLED[4:], True)):
        plan = resolve_trees(specs)
        ids = torch.tensor([[1, 3, 0], [2, 2, 5]])
        ds, ts = draft.new_state(), target.new_state()
        logits = draft.logits(ds, ids)[:, -1]
        p, q = PLAIN.probs(logits).numpy(), PLAIN.probs(target.logits(ts, ids))[:, -1].numpy()
        last = ids[:, -1].numpy()
        moved.clear()
        with monkeypatch.context() as m:
            m.setattr(torch.Tensor, "numpy", numpy)
            got = draw_and_score(draft, ds, target, ts, last, 3, p, q, plan, PLAIN,
                                 [tree_rng(0, 0), tree_rng(0, 1)], on_device=True)
            assert len(moved) == 1 and len(moved[0]) == 1 and moved[0][0] != V  # the one read of the position
            for scored in got:
                position_values(plan, scored, V)
        whole = [s for s in moved if s and s[-1] == V]
        assert bool(whole) == laws_read and len(whole) <= 2  # the draft's rows once, the target's once per family


# --------------------------------------------------------------------------- bad input
def test_a_wor_node_with_too_few_tokens_is_refused_alike_on_both_routes():
    # nucleus sampling leaving one token at the root, a without-replacement tree asking two children there: the host
    # route's error on the device route (after the position's one read)
    draft, target = toy_pair(5, seed=0, closeness=0.2)
    s = Sampling(0.3, None, 0.3, "ties")
    plan = resolve_trees(["wor:branching(2,1):sequoia"])
    for on_device in (False, True):
        with pytest.raises(ValueError, match=r"'wor:branching\(2,1\)' needs 2 distinct children at node 0 \(rank "
                                             r"path \(\)\), but the draft's law there has only 1 tokens"):
            _at(draft, target, [[4, 4]], plan, s, on_device=on_device)


@pytest.mark.parametrize("trees", [["iid:branching(2,2):specinfer"], ["topk:branching(2,2)"], ["eagle2:2,2,4"],
                                   ["topk:branching(2,2)", "iid:branching(2,2):specinfer"]])
@pytest.mark.parametrize("role", ["draft", "target"])
def test_a_bad_law_at_a_node_is_refused_alike_on_both_routes(role, trees):
    # the draft's or the target's logits NaN after every token but 0, the draft never drawing 0: the laws at the
    # depth-1 nodes are bad, formed unchecked on the device route, flagged in its one read and refused with the host
    # route's error (the deterministic families' target laws flagged in the read of their gathered probabilities,
    # alone or with the sampled trees' values)
    V = 5
    draft, target = toy_pair(V, seed=1)
    draft.fn.table[:, 0] = -np.inf
    (draft if role == "draft" else target).fn.table[1:] = np.nan
    plan = resolve_trees(trees)
    errors = []
    for on_device in (False, True):
        with pytest.raises(ValueError) as err:
            _at(draft, target, [[0, 0]], plan, on_device=on_device)
        errors.append(str(err.value))
    assert errors[0] == errors[1] and "finite" in errors[0]


def test_the_device_stream_is_seeded_by_the_prompts_tree_generators():
    # one integer drawn from each prompt's generator per position: the same seed gives the same generator states,
    # another seed others, each prompt its own, and every prompt's generator advances alike
    a = [tree_rng(0, b) for b in range(3)]
    g1 = TD.device_generator(a, "cpu")
    g2 = TD.device_generator([tree_rng(0, b) for b in range(3)], "cpu")
    g3 = TD.device_generator([tree_rng(1, b) for b in range(3)], "cpu")
    assert len(g1) == 3 and all(torch.equal(x.get_state(), y.get_state()) for x, y in zip(g1, g2))
    assert not any(torch.equal(x.get_state(), y.get_state()) for x, y in zip(g1, g3))
    assert not torch.equal(g1[0].get_state(), g1[1].get_state())
    fresh = [tree_rng(0, b) for b in range(3)]
    for r, f in zip(a, fresh):
        f.integers(2**63)
        assert r.integers(2**63) == f.integers(2**63)


def test_a_walk_with_the_bound_on_the_device_route_equals_the_host_route(tmp_path, monkeypatch):
    # the whole walk with the laws on the (stand-in) device, the sampled trees drawn from the host route's stream
    # and verified on the device, the bound on every lossless verifier reading their laws at the host (HostRows):
    # every row, the bound's included, within 1e-12 relative of the host route's
    pytest.importorskip("pyarrow")
    import otspec.profile._collect as C
    from otspec.profile import profile, read_table

    def rows(out):
        t = read_table(out).sort_by([(c, "ascending") for c in ("prompt", "pos", "kind", "name", "k", "j", "m")])
        return {c: t[c].to_pylist() for c in t.column_names}

    draft, target = toy_pair(6, seed=7, closeness=0.6)
    kw = dict(k_max=1, L_max=2, max_new_tokens=3, verifiers=["token"], families=["token"], subsample=1,
              progress=False, batch_size=2, bound_budget=5,
              trees=["iid:branching(3,2):specinfer,target-only", "wor:branching(2,2):sequoia,traversal"])
    prompts = [[0, 1], [3, 2], [1, 2]]
    profile(prompts, out=tmp_path / "host", draft=draft, target=target, **kw)
    monkeypatch.setattr(C, "analysis_device", lambda lm: torch.device("cpu"))
    monkeypatch.setattr(TD, "device_generator", lambda rngs, device: None)
    profile(prompts, out=tmp_path / "device", draft=draft, target=target, **kw)
    a, b = rows(tmp_path / "host"), rows(tmp_path / "device")
    keep = [i for i, k in enumerate(a["kind"]) if k not in ("time", "cost")]
    assert {"treebound", "treenode", "tree"} <= set(a["kind"])
    for c in a:
        if c != "value":
            assert [a[c][i] for i in keep] == [b[c][i] for i in keep]
    np.testing.assert_allclose([b["value"][i] for i in keep], [a["value"][i] for i in keep], rtol=1e-12, atol=0)


def test_the_memory_estimate_holds_the_sampled_trees_laws_on_the_device():
    # five float64 (V,) rows per internal node of every sampled tree of the batch (draft and target laws, their
    # forest copies, one pass's temporary) on top of the host route's estimate (two target laws per internal node
    # of the largest scored tree of the batch, three per node of the largest sampled tree)
    from otspec.profile._trees import tree_law_bytes

    V, B = 1000, 3
    plan = resolve_trees(["topk:branching(2,2)", "iid:branching(3,2):specinfer", "wor:branching(2,2,1):sequoia"])
    inner = (1 + 3) + (1 + 2 + 4)  # the internal nodes of the i.i.d. tree, then of the without-replacement one
    assert tree_law_bytes(plan, V, B) == 8 * V * (2 * B * 7 + 3 * (1 + 2 + 4 + 4) + 5 * B * inner)
    assert tree_law_bytes(resolve_trees(["topk:branching(2,2)"]), V, B) == 8 * V * 2 * B * 3


def test_a_prompts_device_drawn_trees_do_not_depend_on_the_batch():
    # each prompt draws from its own device generator, in the order of its own nodes: walked with two others or
    # alone, its sampled trees and their values are the same
    V = 6
    draft, target = toy_pair(V, seed=3)
    plan = resolve_trees(SAMPLED)
    ds, ts = draft.new_state(), target.new_state()
    ctxs = [[1, 3], [2, 2], [5, 0]]
    together = _at(draft, target, ctxs, plan, seed=4)
    for b, ctx in enumerate(ctxs):
        ids = torch.tensor([ctx])
        ds, ts = draft.new_state(), target.new_state()
        p = PLAIN.probs(draft.logits(ds, ids)[:, -1]).numpy()
        q = PLAIN.probs(target.logits(ts, ids))[:, -1].numpy()
        alone = draw_and_score(draft, ds, target, ts, [ctx[-1]], 2, p, q, plan, PLAIN, [tree_rng(4, b)],
                               on_device=True)[0]
        for label, s in alone.items():
            np.testing.assert_array_equal(together[b][label].tree.tokens, s.tree.tokens)
        a, t = position_values(plan, alone, V), position_values(plan, together[b], V)
        assert a["tree"] == t["tree"]


@pytest.mark.parametrize("trees", [["topk:branching(4)"], ["eagle2:4,1,4"], ["topk:branching(4)", "iid:branching(3):specinfer"],
                                   ["topk:branching(1,1,1)", "eagle2:2,3,5"]])
def test_the_roots_read_with_the_first_depth_give_the_host_routes_trees(monkeypatch, trees):
    # the roots' ranks are read with the first depth's (its draft tokens gathered from the roots' rankings on the
    # device) or alone when there is no first depth (stars): the deterministic families' rows equal the host route's
    # bit for bit, stars and depth-1 EAGLE-2 trees included
    import otspec.profile._collect as C
    from otspec.profile import ProfileSettings
    from tests.toy_lm import tiny_llama

    draft, target = tiny_llama(1, vocab=64), tiny_llama(2, vocab=64)
    s = ProfileSettings(k_max=2, L_max=2, max_new_tokens=3, subsample=0, verifiers=["token"], families=["token"],
                        trees=trees).for_vocabulary(64)
    rows = {}
    for route, dev in (("device", torch.device("cpu")), ("host", None)):
        monkeypatch.setattr(C, "analysis_device", lambda lm, dev=dev: dev)
        r = C.profile_prompt(draft, target, [3, 7, 1], None, s, 0)
        rows[route] = [(n, v) for k, n, v in zip(r["kind"], r["name"], r["value"])
                       if k == "tree" and not n.startswith("iid")]
    assert rows["device"] and rows["device"] == rows["host"]
