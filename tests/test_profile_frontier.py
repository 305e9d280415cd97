"""The profile's deterministic tree families drafted on the laws' device with no read until the last depth: EAGLE-2's
frontier chosen there (the host's tie rule), the draft's cache rows selected by a device index, the static top-k
trees' deeper tokens taken from their rankings, and whole walks equal to the numpy route's."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

import otspec.profile._trees_device as TD  # noqa: E402
from otspec.decoding import as_model  # noqa: E402
from otspec.decoding._sampling import Sampling  # noqa: E402
from otspec.profile import toy_pair  # noqa: E402
from otspec.profile._trees import draw_and_score, position_values, resolve_trees, tree_rng  # noqa: E402
from otspec.tree import sample_tree  # noqa: E402

PLAIN = Sampling(1.0, None, None, "ties")
#: Few distinct probabilities and scores: ties within a node's children, across parents and across depths.
PROBS = st.sampled_from([1.0, 0.5, 0.25, 0.125, 0.0])
BASES = st.sampled_from([0.0, math.log(0.5), math.log(0.25), math.log(0.125), 2 * math.log(0.5)])


def _host_frontier(base: list, logs: list, k: int) -> tuple[list, list]:
    """The host route's rule (otspec.tree._process._eagle2_tree, _Eagle2Job.expand): proposal f k + r scores
    base[f] + logs[f k + r] (a Python float addition), the first k by (-score, index)."""
    s = [base[j // k] + logs[j] for j in range(k * k)]
    chosen = sorted(range(k * k), key=lambda j: (-s[j], j))[:k]
    return chosen, [s[j] for j in chosen]


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 4), st.integers(1, 3), st.data())
def test_the_device_frontier_is_the_hosts_ties_zeros_and_one_hot_rows_included(k, T, data):
    # each frontier node's ranked children (non-increasing, zeros and one-hot rows among them) and the frontier's
    # scores drawn from few values, so that scores tie within a node, across parents and with -inf: the device's k
    # proposals and their scores are the host's, bit for bit
    base = [sorted(data.draw(st.lists(BASES, min_size=k, max_size=k)), reverse=True) for _ in range(T)]
    rows = []
    for _ in range(T):
        tree = []
        for _ in range(k):
            if data.draw(st.booleans()):
                tree += [1.0] + [0.0] * (k - 1)  # a one-hot law's ranking
            else:
                tree += sorted(data.draw(st.lists(PROBS, min_size=k, max_size=k)), reverse=True)
        rows.append(tree)
    logs = torch.log(torch.tensor(rows, dtype=torch.float64))
    chosen, scores = TD.eagle2_frontier_t(torch.tensor(base, dtype=torch.float64), logs)
    assert chosen.shape == scores.shape == (T, k)
    for t in range(T):
        want, s = _host_frontier(base[t], logs[t].tolist(), k)
        assert chosen[t].tolist() == want
        assert scores[t].tolist() == s  # -inf == -inf


def test_the_device_frontier_breaks_ties_by_the_lower_proposal():
    # every score equal: the frontier is the first k proposals, in order; two parents with equal scores and equal
    # children: the first parent's children first
    k = 3
    chosen, _ = TD.eagle2_frontier_t(torch.zeros((1, k), dtype=torch.float64), torch.zeros((1, k * k),
                                                                                           dtype=torch.float64))
    assert chosen.tolist() == [[0, 1, 2]]
    base = torch.tensor([[-1.0, -1.0, -5.0]], dtype=torch.float64)
    logs = torch.log(torch.tensor([[0.5, 0.5, 0.0, 0.5, 0.5, 0.0, 1.0, 0.0, 0.0]], dtype=torch.float64))
    assert TD.eagle2_frontier_t(base, logs)[0].tolist() == [[0, 1, 3]]


# --------------------------------------------------------------------------- the draft's rows selected on the device
def _states(lm, prompts):
    state = lm.new_state(pad=[max(map(len, prompts)) - len(p) for p in prompts])
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    lm.logits(state, ids)
    lm.logits(state, torch.tensor([[1], [2], [3]][: len(prompts)]))
    return state


@pytest.mark.parametrize("model", ["llama", "callable"])
def test_rows_selected_by_a_device_index_are_the_hosts_select(model):
    # a padded batch of three prompts, rows kept by a device index (repeats, reordering), at the state's length (no
    # value read on the host) or cut to the contexts: the next call's logits equal those after the model's own
    # select with the same rows, bit for bit
    from tests.test_profile_host_reads import HostReads
    from tests.toy_lm import tiny_llama

    lm = tiny_llama(3, vocab=20) if model == "llama" else toy_pair(20, seed=2)[0]
    prompts = [[3, 4, 5], [6, 7], [8, 9, 10, 11]]
    rows = [2, 0, 0, 1, 2, 2]
    feed = torch.tensor([[1], [2], [3], [4], [5], [6]])
    for n in (5, 4):  # the state's length; the contexts' columns (the last call's token dropped)
        a, b = _states(lm, prompts), _states(lm, prompts)
        lm.select(a, rows, n)
        with HostReads() as mode:
            TD.select_rows(lm, b, torch.tensor(rows), n)
        assert not mode.reads or n < 5
        assert a.length == b.length == n
        assert torch.equal(lm.logits(a, feed), lm.logits(b, feed))


def test_rows_of_an_unknown_state_are_selected_by_the_models_select():
    class Plain:
        def __init__(self):
            self.calls = []

        def select(self, state, rows, length):
            self.calls.append((rows, length))

    lm = Plain()
    TD.select_rows(lm, object(), torch.tensor([1, 0, 1]), 5)
    assert lm.calls == [([1, 0, 1], 5)]


# --------------------------------------------------------------------------- the trees of a position
def _at(draft, target, ctxs, plan, sampling=PLAIN, on_device=True, tensor_root=False):
    ids = torch.tensor(ctxs)
    ds, ts = draft.new_state(), target.new_state()
    logits = draft.logits(ds, ids)[:, -1]
    p, r = sampling.probs(logits), sampling.own_law(logits)
    if not tensor_root:
        p, r = p.numpy(), r.numpy()
    q = sampling.probs(target.logits(ts, ids))[:, -1].numpy()
    rngs = [tree_rng(0, b) for b in range(len(ctxs))]
    got = draw_and_score(draft, ds, target, ts, ids[:, -1].numpy(), ids.shape[1], p, q, plan, sampling, rngs,
                         r_root=r, on_device=on_device)
    assert ds.length == ts.length == ids.shape[1]
    return got


def _tied_pair(V: int, seed: int):
    """A bigram pair whose draft logits take few values: ties within a law and across parents."""
    draft, target = toy_pair(V, seed=seed)
    r = np.random.default_rng(seed)
    draft.fn.table[:] = r.choice([0.0, 0.0, 1.0, -1.0, math.log(2.0)], size=draft.fn.table.shape)
    return draft, target


#: EAGLE-2 of two top_k (one frontier batch each) with static top-k trees and a sampled family; EAGLE-2 of one top_k
#: and three depths (one batch whose trees end at different depths).
PLANS = [["eagle2:4,3,8", "eagle2:3,2,5", "topk:branching(3,2,2)", "topk:[[0],[1],[0,0],[1,0],[0,0,1]]",
          "iid:branching(2,2):specinfer"],
         ["eagle2:4,2,6", "eagle2:2,2,3", "eagle2:3,2,4", "topk:branching(2,2)"]]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("tensor_root", [False, True])
@pytest.mark.parametrize("trees", PLANS)
def test_device_drafted_trees_equal_the_host_routes_with_ties(seed, tensor_root, trees):
    # laws with ties within a node and across parents (and so equal cumulative scores): the device route's EAGLE-2
    # and top-k trees (frontiers chosen on the device, the draft fed by device indices) and their values are the host
    # route's bit for bit, and EAGLE-2's tree is otspec.tree.sample_tree's on the same model
    V = 7
    draft, target = _tied_pair(V, seed)
    plan = resolve_trees(trees)
    ctxs = [[1, 3], [2, 2], [5, 0]]
    dev = _at(draft, target, ctxs, plan, tensor_root=tensor_root)
    host = _at(draft, target, ctxs, plan, on_device=False)
    for b, (d, h) in enumerate(zip(dev, host)):
        for label in [f.label for f in plan.eagle2] + ["universe"]:
            np.testing.assert_array_equal(d[label].tree.parents, h[label].tree.parents)
            np.testing.assert_array_equal(d[label].tree.tokens, h[label].tree.tokens)
        vd, vh = position_values(plan, d, V), position_values(plan, h, V)
        for f in plan.families:
            if f.deterministic:
                assert vd["tree"][f.label] == vh["tree"][f.label]
        np.testing.assert_array_equal(vd["treeq"], vh["treeq"])
        np.testing.assert_array_equal(vd["treep"], vh["treep"])
        for f in plan.eagle2:
            ref = sample_tree(f.shape, as_model(draft, context=ctxs[b], sampling=PLAIN), process="eagle2")
            np.testing.assert_array_equal(d[f.label].tree.tokens, ref.tokens)
            np.testing.assert_array_equal(d[f.label].tree.parents, ref.parents)


def test_a_deeper_eagle2_node_with_too_few_tokens_is_refused_alike_on_both_routes():
    # a frontier node at depth 1 whose law has one token of positive probability (its row of logits -inf but one):
    # the device route drafts on (its frontier's scores -inf there), then refuses it with the host route's error
    V = 6
    draft, target = toy_pair(V, seed=0)
    draft.fn.table[:, 2] = 5.0  # token 2 ranked first at every node: in every frontier
    draft.fn.table[2] = -np.inf
    draft.fn.table[2, 4] = 0.0
    plan = resolve_trees(["eagle2:3,2,4"])
    errors = []
    for on_device, tensor_root in ((False, False), (True, False), (True, True)):
        with pytest.raises(ValueError, match=r"needs top_k = 2 tokens of positive draft probability") as err:
            _at(draft, target, [[1, 3]], plan, on_device=on_device, tensor_root=tensor_root)
        errors.append(str(err.value))
    assert errors[0] == errors[1] == errors[2]


# --------------------------------------------------------------------------- whole walks
def _walk_rows(draft, target, route, subsample, B, temperature, trees):
    import otspec.profile._collect as C
    from otspec.profile import ProfileSettings

    V = draft.vocab_size
    s = ProfileSettings(k_max=2, L_max=2, max_new_tokens=4, subsample=subsample, verifiers=["token"],
                        families=["token"], trees=trees, temperature=temperature).for_vocabulary(V)
    prompts = [[3, 7, 1], [5, 2, 9, 4], [1, 1], [8, 3, 6]][:B]
    out = C.profile_prompt(draft, target, prompts[0], None, s, 0) if B == 1 else \
        C.profile_bucket(draft, target, prompts, [None] * B, s, list(range(B)))
    rows = []
    for r in ([out] if B == 1 else out):
        rows += [(k, n, m, j, v) for k, n, m, j, v in zip(r["kind"], r["name"], r["m"], r["j"], r["value"])
                 if k in ("tree", "treeq", "treep") and not n.startswith(("iid", "wor"))]
    return rows


WALK_TREES = ["topk:branching(4,2)", "eagle2:4,4,16", "topk:branching(8,4,2)", "iid:branching(4,2):specinfer",
              "wor:branching(4,2):sequoia"]


@pytest.mark.parametrize("B,subsample,temperature", [(1, 0, 1.0), (2, 1, 0.7)])
def test_whole_walks_on_the_device_route_equal_the_numpy_routes(monkeypatch, B, subsample, temperature):
    # the tiny Llama pair walked on the torch-CPU route (laws kept as tensors, every depth drafted on the device)
    # and on the numpy route: every row of the deterministic families (E[tau | T], the universe's Q and p) equal bit
    # for bit; prompts of unequal lengths (padded states) and a temperature (EAGLE-2 ranks by the draft's own law)
    _walks_on_both_routes_agree(monkeypatch, B, subsample, temperature)


def _walks_on_both_routes_agree(monkeypatch, B, subsample, temperature):
    import otspec.profile._collect as C
    from tests.toy_lm import tiny_llama

    draft, target = tiny_llama(1, vocab=64), tiny_llama(2, vocab=64)
    got = {}
    for route, dev in (("numpy", None), ("torch", torch.device("cpu"))):
        monkeypatch.setattr(C, "analysis_device", lambda lm, dev=dev: dev)
        got[route] = _walk_rows(draft, target, route, subsample, B, temperature, WALK_TREES)
    assert got["torch"] and got["torch"] == got["numpy"]


@pytest.mark.slow
@pytest.mark.parametrize("B", [1, 2, 4])
@pytest.mark.parametrize("subsample", [0, 1])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_whole_walks_on_the_device_route_equal_the_numpy_routes_every_batch(monkeypatch, B, subsample, temperature):
    _walks_on_both_routes_agree(monkeypatch, B, subsample, temperature)
