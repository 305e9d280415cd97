"""EAGLE-2's dynamic trees on the decoder's device route (``speculative_decode(tree=Eagle2Params(...))``).

Independent routes:

* the tree: :class:`Eagle2TreeT`'s expansion and reranking on torch tensors, fed the model's laws level by
  level, against :func:`otspec.tree.sample_tree` with ``process="eagle2"`` (the host route's construction, node
  by node on numpy laws): exact equality of parents and tokens, on laws with ties (dyadic rows) included;
  :func:`ranked_rows_t` against :func:`otspec.tree._process._ranked`;
* the per-node laws of the device rules on the tree's layout (the law of the accepted node, each expanded
  node's residual) against the package's numpy verifiers' ``emission``, to 1e-12;
* the device sampler's (accepted node, emitted token) on one EAGLE-2 tree against that exact law by
  chi-square;
* the decoder: the first iteration's exact predictions equal on both routes (the same context, the same
  deterministic tree), the host reads per iteration counted at the dispatcher, the output law of the first
  two tokens against the target's exact law by chi-square (toy pair and tiny Llama pair), the refusals.

Each chi-square test fails spuriously with probability ALPHA_FAIL = 1e-4 (3 in this file: below 3e-4 by the
union bound); the seeds are fixed, so a run is reproducible.
"""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import otspec.decoding as D  # noqa: E402
import otspec.tree as T  # noqa: E402
from otspec.decoding._tree_device import (  # noqa: E402
    Eagle2TreeT,
    end_mass_t,
    node_rules_t,
    ranked_rows_t,
    residual_rows_t,
    verify_tree_t,
)
from otspec.models import MarkovModel, random_markov_model  # noqa: E402
from otspec.testing import chi2_gof  # noqa: E402
from otspec.tree._process import _ranked  # noqa: E402
from tests.test_decoding_device import _HostReads, _memoryless, _ScalarReads  # noqa: E402
from tests.test_tree_decoding_device import ALPHA_FAIL, RULES  # noqa: E402  (the static trees' rules and level)
from tests.toy_lm import tiny_llama  # noqa: E402

torch.set_num_threads(1)


def _dyadic_markov(V, rng):
    """A Markov model whose rows are counts / 2^j (exact in float64): ties among tokens and among path scores."""
    rows = []
    for _ in range(V):
        c = rng.choice([1, 1, 2, 4], size=V).astype(float)
        c[rng.random(V) < 0.2] = 0.0
        c[rng.integers(V)] += 1.0
        rows.append(c / c.sum())
    return MarkovModel(np.array(rows))


def _device_tree(params, model, prefix):
    """Eagle2TreeT fed ``model``'s own laws level by level, as the decoder feeds the draft's; None where an expanded
    node's law has fewer than ``top_k`` positive tokens (flagged on the device)."""
    b = Eagle2TreeT(params, "cpu")
    frontier = None
    for lv in range(params.depth):
        paths = [()] if lv == 0 else [tuple(r[:lv]) for r in b.path.index_select(0, frontier).tolist()]
        R = torch.from_numpy(np.stack([np.asarray(model.next_dist(tuple(prefix) + p), dtype=np.float64)
                                       for p in paths]))
        frontier, short = b.expand(lv, R, frontier)
        if short.any():
            return None
    return b, *b.tree()


def _params(rng, V):
    K = int(rng.integers(1, min(V, 3) + 1))
    depth = int(rng.integers(1, 5))
    most = K + (depth - 1) * K * K
    return T.Eagle2Params(depth=depth, top_k=K, total_tokens=int(rng.integers(2, most + 2)))


def test_ranked_rows_t_is_the_host_ranking():
    """The k most likely tokens, ties by lower id, as otspec.tree ranks them (ties and zeros included)."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        V = int(rng.integers(1, 12))
        k = int(rng.integers(1, V + 1))
        p = rng.choice([0.0, 0.125, 0.25, 0.5], size=(3, V))
        ids, vals = ranked_rows_t(torch.from_numpy(p), k)
        for row in range(3):
            want = _ranked(p[row], k)
            np.testing.assert_array_equal(ids[row].numpy(), want)
            np.testing.assert_array_equal(vals[row].numpy(), p[row][want])


def test_ranked_rows_t_both_routes_and_in_place():
    """Both routes of ranked_rows_t (passes of a row maximum for k <= RANK_BY_MAXIMA, two top-k passes above) give
    the host ranking on rows with many ties and zeros; in_place leaves the rows bit for bit as they were, NaN rows
    included."""
    from otspec.decoding._tree_device import RANK_BY_MAXIMA

    rng = np.random.default_rng(1)
    for k in range(1, RANK_BY_MAXIMA + 4):
        p = rng.choice([0.0, 2.0**-9, 2.0**-8, 2.0**-7], size=(4, 300))
        p[3] = np.nan
        R = torch.from_numpy(p.copy())
        before = R.clone()
        ids, vals = ranked_rows_t(R, k, in_place=True)
        assert torch.equal(R[:3], before[:3]) and torch.isnan(R[3]).all()
        for row in range(3):
            want = _ranked(p[row], k)
            np.testing.assert_array_equal(ids[row].numpy(), want)
            np.testing.assert_array_equal(vals[row].numpy(), p[row][want])
        assert ((ids[3] >= 0) & (ids[3] < 300)).all() and torch.isnan(vals[3]).all()


def test_device_tree_is_sample_trees_tree():
    """The device expansion and reranking give exactly otspec.tree's EAGLE-2 tree (parents and tokens), for
    random parameters and laws with and without ties."""
    rng = np.random.default_rng(1)
    for it in range(150):
        V = int(rng.integers(3, 9))
        model = _dyadic_markov(V, rng) if it % 2 else random_markov_model(V, rng=int(rng.integers(2**31)))
        params = _params(rng, V)
        prefix = tuple(int(x) for x in rng.integers(V, size=int(rng.integers(1, 3))))
        got = _device_tree(params, model, prefix)
        if got is None:  # a support too small for top_k children: the host route refuses it too
            with pytest.raises(ValueError, match="needs .* distinct children"):
                T.sample_tree(params, model, process="eagle2", prefix=prefix)
            continue
        _, parents, tokens, depth, _ = got
        want = T.sample_tree(params, model, process="eagle2", prefix=prefix)
        np.testing.assert_array_equal(parents.numpy(), want.parents, err_msg=str(params))
        np.testing.assert_array_equal(tokens.numpy(), want.tokens, err_msg=str(params))
        np.testing.assert_array_equal(depth.numpy(), want.depth)


def _layout_laws(b, lay, tree, P, Q):
    """The laws at the layout's rows: each kept expanded node's, the root's in the rows of nodes not kept (never
    read: such a row has no child)."""
    slot = lay.slot_node.numpy()
    rows = np.where(slot >= 0, slot, 0)
    return torch.from_numpy(P[rows]), torch.from_numpy(Q[rows])


@pytest.mark.parametrize("rule", list(RULES))
def test_node_laws_on_the_eagle2_layout_equal_the_numpy_emission(rule):
    """The law of the accepted node and every expanded node's residual (normalised) on the dynamic layout against
    the numpy verifier's emission on the same tree, to 1e-12 (the target equal to the draft now and then)."""
    rng = np.random.default_rng(zlib.crc32(rule.encode()))
    v = RULES[rule]
    for it in range(60):
        V = int(rng.integers(3, 8))
        d = _dyadic_markov(V, rng) if it % 3 == 0 else random_markov_model(V, rng=int(rng.integers(2**31)))
        t = d if it % 5 == 0 else random_markov_model(V, rng=int(rng.integers(2**31)))
        params = _params(rng, V)
        got = _device_tree(params, d, (0,))
        if got is None:
            continue
        b, parents, tokens, _, lay = got
        tree = T.sample_tree(params, d, process="eagle2", prefix=(0,))
        P, Q = T.tree_laws(tree, d, t, prefix=(0,))
        Pin, Qin = _layout_laws(b, lay, tree, P, Q)
        acc, alive, x, level, _ = node_rules_t(rule, lay, tokens, Pin, Qin)
        mass = end_mass_t(lay, acc, alive).numpy()
        E = v.emission(tree, P, Q)
        np.testing.assert_allclose(mass, E.sum(axis=1), rtol=0, atol=1e-12)
        with_kids = np.flatnonzero(lay.valid[:, 0].numpy())
        resid = residual_rows_t(rule, x, level, Pin, Qin, torch.from_numpy(with_kids)).numpy()
        for i, s in enumerate(with_kids.tolist()):
            node = int(lay.slot_node[s])
            if E[node].sum() > 1e-9:
                np.testing.assert_allclose(resid[i] / resid[i].sum(), E[node] / E[node].sum(), rtol=0, atol=1e-12)


def test_device_sampler_on_an_eagle2_tree_follows_the_emission_law():
    """(accepted node, emitted token) of verify_tree_t on an EAGLE-2 layout against the target-only rule's
    emission law (leaves and kept nodes without children draw their bonus token from their own q)."""
    V = 4
    d, t = random_markov_model(V, rng=3), random_markov_model(V, rng=4)
    params = T.Eagle2Params(depth=3, top_k=2, total_tokens=6)
    b, parents, tokens, _, lay = _device_tree(params, d, (1,))
    tree = T.sample_tree(params, d, process="eagle2", prefix=(1,))
    P, Q = T.tree_laws(tree, d, t, prefix=(1,))
    law = RULES["target-only"].emission(tree, P, Q).ravel()
    Pin, Qin = _layout_laws(b, lay, tree, P, Q)
    Qt = torch.from_numpy(Q)
    g = torch.Generator().manual_seed(6)
    counts = np.zeros(law.shape[0], dtype=np.int64)
    for _ in range(4000):
        a, y, mass = verify_tree_t("target-only", lay, tokens, Pin, Qin, lambda v: Qt.index_select(0, v), g)
        counts[int(a[0]) * V + int(y[0])] += 1
    np.testing.assert_allclose(mass.numpy(), law.reshape(-1, V).sum(1), rtol=0, atol=1e-12)
    gof = chi2_gof(counts, law, alpha_fail=ALPHA_FAIL)
    assert gof.outside_support == 0 and gof.passed, gof


# ----------------------------------------------------------------------------- the decoder
@pytest.mark.parametrize("models", ["memoryless", "tiny_llama"])
def test_first_iteration_predictions_equal_on_both_routes(models):
    """EAGLE-2's tree is a function of the context: the first iteration's exact predictions (the law of the
    accepted depth given the tree, the root's optimum) agree on both routes to 1e-12, for several parameters
    and prompts (a different tree would give different predictions)."""
    if models == "memoryless":
        target, draft, _, _ = _memoryless(30, seed=2)
    else:
        target, draft = tiny_llama(1, vocab=24), tiny_llama(2, vocab=24)
    for params, prompt in [(T.Eagle2Params(3, 2, 6), [3]), (T.Eagle2Params(4, 3, 12), [5, 1]),
                           (T.Eagle2Params(2, 4, 9), [7]), (T.Eagle2Params(1, 2, 3), [2, 2])]:
        runs = {e: D.speculative_decode(prompt, draft=draft, target=target, tree=params, max_new_tokens=4,
                                        rng=1, engine=e) for e in ("torch", "numpy")}
        a, b = runs["torch"], runs["numpy"]
        assert (a.engine, b.engine) == ("torch", "numpy")
        for name in ("predicted_accepted", "predicted_emitted", "alpha_first", "alpha_opt_first"):
            np.testing.assert_allclose(getattr(a, name)[0], getattr(b, name)[0], rtol=0, atol=1e-12, err_msg=name)
        np.testing.assert_allclose(a.predicted_reached[0], b.predicted_reached[0], rtol=0, atol=1e-12)


def test_eagle2_device_route_reads_the_host_once_per_iteration(monkeypatch):
    """One host read per iteration (after the verification: the outcome, the tree, the draft's cache rows and the
    flags; the target scores the tree from its parents and tokens on the device), one after the loop (the logged
    predictions), the seed before it, and no tensor turned into a number anywhere else (counted at the dispatcher);
    on a tiny Llama pair (tree attention) and on the row route. The host route reads far more (every level's
    laws). The route an accelerator runs (``read_on_host=False``; on the CPU the accepted node is read before its
    residual, tests/test_tree_decoding_lazy.py)."""
    from otspec.decoding._tree_device import TreeStepT

    monkeypatch.setattr(TreeStepT, "read_on_host", False)
    kw = dict(tree=T.Eagle2Params(3, 2, 6), max_new_tokens=30, rng=0)
    for target, draft in [_memoryless(40, seed=1)[:2], (tiny_llama(1, vocab=40), tiny_llama(2, vocab=40))]:
        with _HostReads() as mode, _ScalarReads() as scalars:
            res = D.speculative_decode([0], draft=draft, target=target, **kw, log_laws=False)
        assert res.engine == "torch"
        assert mode.reads.count("tolist") == res.iterations
        depths = len(set(res.draft_lengths[res.draft_lengths > 0].tolist()))  # one log read per depth drafted
        assert len(mode.reads) == res.iterations + 1 + depths, mode.reads
        assert scalars.reads == 1
        with _HostReads() as mode:
            host = D.speculative_decode([0], draft=draft, target=target, **kw, engine="numpy")
        assert host.engine == "numpy" and len(mode.reads) > 3 * host.iterations


def _counts(target, draft, prompt, m, runs, seed, **kw):
    cells, law = D.exact_prefix_law(target, prompt, m)
    index = {c: i for i, c in enumerate(cells)}
    counts = np.zeros(len(cells) + 1, dtype=np.int64)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(runs):
        res = D.speculative_decode(prompt, draft=draft, target=target, max_new_tokens=m, rng=gen, **kw)
        assert res.engine == "torch"
        counts[index.get(tuple(res.tokens[:m].tolist()), len(cells))] += 1
    return counts, np.append(law, 0.0)


# both under -m slow: EAGLE-2's whole decodes on the device route keep a default chi-square in
# tests/test_tree_decoding_last_iteration.py::test_joint_law_with_pruned_trees[eagle2:2,2,5-torch] (3 tokens, whole
# and pruned trees), and the depth-3 layout's verification its own in
# test_device_sampler_on_an_eagle2_tree_follows_the_emission_law above
@pytest.mark.parametrize("models", [pytest.param("memoryless", marks=pytest.mark.slow),
                                    pytest.param("tiny_llama", marks=pytest.mark.slow)])
def test_device_eagle2_decoding_is_lossless(models):
    """The first two decoded tokens against the target's exact law (plain target scoring) by chi-square."""
    if models == "memoryless":
        target, draft, _, _ = _memoryless(5, seed=3, noise=1.0)
        prompt, runs = [1, 2], 800
    else:
        target, draft = tiny_llama(3, vocab=5), tiny_llama(4, vocab=5)
        prompt, runs = [3, 1], 400
    counts, law = _counts(target, draft, prompt, 2, runs, 21, tree=T.Eagle2Params(3, 2, 6))
    g = chi2_gof(counts, law, alpha_fail=ALPHA_FAIL)
    assert g.outside_support == 0 and g.passed, g


def test_device_eagle2_refuses_bad_laws_after_the_one_read():
    """Non-finite draft logits, a draft law with fewer than top_k tokens of positive probability, non-finite target
    logits: the host route's ValueErrors (the model and the position; the node's token path), read with the
    outcome (the target's call on a tree from bad draft laws is harmless: its ids and structure are valid)."""
    n = 6
    table = torch.randn(n, n, generator=torch.Generator().manual_seed(0))

    def overflowing(ids):
        out = table[ids].clone()
        if ids.shape[1] >= 3:
            out[:, 2, 2] = float("inf")
        return out

    target = D.CallableLM(lambda ids: table[ids], n, name="fine")
    params = T.Eagle2Params(2, 2, 4)
    with pytest.raises(ValueError, match=r"the draft model 'overflowing' gave non-finite logits .* position 3"):
        D.speculative_decode([0, 1], draft=D.CallableLM(overflowing, n, name="overflowing"), target=target,
                             tree=params, max_new_tokens=6, rng=0, engine="torch")
    tp = torch.full((n, n), -math.inf)
    tp[:, 3] = 0.0  # the draft always says 3
    with pytest.raises(ValueError, match=r"process='eagle2' needs 2 distinct children at the node with token path "
                                         r"\(\), but the draft's law there has only 1 tokens"):
        D.speculative_decode([0], draft=D.CallableLM(lambda ids: tp[ids], n), target=target, tree=params,
                             max_new_tokens=6, rng=0, engine="torch")
    with pytest.raises(ValueError, match=r"the target model 'overflowing' gave non-finite logits .* position 3"):
        D.speculative_decode([0, 1], draft=target, target=D.CallableLM(overflowing, n, name="overflowing"),
                             tree=params, max_new_tokens=6, rng=0, engine="torch")


@pytest.mark.parametrize("kind", ["hf-sdpa", "hf-rows", "callable"])
def test_tree_logits_take_device_parents_without_a_host_read(kind, monkeypatch):
    """``tree_logits`` with the tree's parents and tokens as tensors (EAGLE-2's tree, chosen on the device): the
    logits and the state of the numpy parents (to float rounding on the row route, which scores every node's
    path as its own row), no host read inside the call; a parent outside ``[0, i)`` gives NaN rows at that node
    and below only; the refusals of what needs the structure on the host."""
    from tests.test_tree_decoding_device import _tiny_llama

    V = 11
    if kind == "callable":
        lm = _memoryless(V, seed=7)[0]
    else:
        lm = _tiny_llama(V, 0, "sdpa" if kind == "hf-sdpa" else "eager")
        if kind == "hf-rows":
            from otspec.decoding import _models

            monkeypatch.setattr(_models, "_tree_refusal", lambda model: "no 4-D mask (a stand-in)")
    fb = "rows" if kind != "hf-sdpa" else None
    tol = 1e-5 if kind == "hf-rows" else 0.0
    for parents, tokens in [([-1, 0, 0, 1, 1, 3], [-1, 4, 7, 2, 9, 5]), ([-1, 0, 1, 2, 3], [-1, 1, 2, 3, 4]),
                            ([-1, 0], [-1, 6])]:
        parents, tokens = np.array(parents), np.array(tokens)
        outs, states = [], []
        for as_tensor in (False, True):
            st = lm.new_state()
            lm.logits(st, torch.tensor([[0, 3]]))
            par = torch.from_numpy(parents.copy()) if as_tensor else parents
            with _HostReads() as mode:
                outs.append(lm.tree_logits(st, par, torch.from_numpy(tokens.copy()), pending=[1, 2], fallback=fb))
            assert mode.reads == [], mode.reads
            states.append(st)
        torch.testing.assert_close(outs[1], outs[0], rtol=0, atol=tol)
        assert states[0].length == states[1].length == 4
        nxt = [lm.logits(s, torch.tensor([[1]]))[:, -1] for s in states]
        torch.testing.assert_close(nxt[1], nxt[0], rtol=0, atol=tol)
    tokens = torch.tensor([-1, 4, 7, 2, 9, 5])
    for wrong in (5, 3, -1):  # node 3's parent: after it, itself, none
        st = lm.new_state()
        lm.logits(st, torch.tensor([[0, 3]]))
        got = lm.tree_logits(st, torch.tensor([-1, 0, 0, wrong, 1, 3]), tokens, pending=[1, 2], fallback=fb)
        assert torch.isnan(got).all(-1).tolist() == [False, False, False, True, False, True]
    par = torch.tensor([-1, 0, 0, 1, 1, 3])
    with pytest.raises(TypeError, match=r"`parents` as a tensor needs `tokens` as a tensor too"):
        lm.tree_logits(lm.new_state(), par, tokens.numpy(), pending=[1], fallback=fb)
    with pytest.raises(TypeError, match=r"`keep` needs the tree's structure on the host"):
        lm.tree_logits(lm.new_state(), par, tokens, pending=[1], keep=3, fallback=fb)
    with pytest.raises(TypeError, match=r"`parents` must hold ints, got dtype torch.float32"):
        lm.tree_logits(lm.new_state(), par.float(), tokens, pending=[1], fallback=fb)
    with pytest.raises(ValueError, match=r"`tokens` must have the shape of `parents` \(6,\), got \(5,\)"):
        lm.tree_logits(lm.new_state(), par, tokens[:5], pending=[1], fallback=fb)
    with pytest.raises(ValueError, match=r"`parents` as a tensor must have shape \(n\+1,\) \(one tree\) or \(B, n\+1\)"):
        lm.tree_logits(lm.new_state(), par[None, None], tokens[None, None], pending=[1], fallback=fb)
