"""Draft trees on the models' device (``speculative_decode(tree=..., engine="torch")``) against the numpy route.

Independent routes:

* the per-node laws of the device rules (:func:`node_rules_t`: the law of the accepted node and the
  residual of every node with children) against the package's numpy verifiers' ``emission``, to 1e-12,
  on random trees of every process, degenerate laws included;
* the device sampler's (accepted node, token) against that exact law by chi-square, fixed tree;
* the draws without replacement of ``"wor"`` children (both rules: the exponential race, the running sums
  recomputed after each draw) against the sequential law by chi-square, and their flags of small supports;
* the decoder: the host reads per iteration (one) counted at the dispatcher, the predictions of a top-k tree
  (one tree per context) equal on both routes, the engine refused before any model call where the tree
  has no device route. Losslessness of the decoded tokens for both routes is tested in
  tests/test_tree_decoding.py (``test_lossless_first_two_tokens_toy``, parametrised by engine).

Each chi-square test fails spuriously with probability ALPHA_FAIL = 1e-4 (5 in this file: below 5e-4 by
the union bound); the seeds are fixed, so a run is reproducible.
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
    TreeLayoutT,
    end_mass_t,
    node_rules_t,
    residual_rows_t,
    verify_tree_t,
)
from otspec.models import random_markov_model  # noqa: E402
from otspec.testing import chi2_gof  # noqa: E402
from tests.test_decoding_device import _HostReads, _memoryless, _Refuse, _ScalarReads  # noqa: E402

torch.set_num_threads(1)
ALPHA_FAIL = 1e-4
RULES = {"specinfer": T.SpecInferVerifier(), "sequoia": T.SequoiaVerifier(), "target-only": T.TargetOnlyVerifier()}
WIDE = T.TreeShape([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (2, 0)])
SMALL = T.TreeShape([(0,), (1,), (0, 0), (1, 0)])


def _device_laws(rule, tree, P, Q):
    lay = TreeLayoutT.of_tree(tree)
    Pin, Qin = torch.from_numpy(P[lay.inner_np]), torch.from_numpy(Q[lay.inner_np])
    acc, alive, x, level, _ = node_rules_t(rule, lay, torch.tensor(tree.tokens), Pin, Qin)
    resid = residual_rows_t(rule, x, level, Pin, Qin, torch.arange(len(lay.inner_np)))
    return lay, end_mass_t(lay, acc, alive).numpy(), resid.numpy()


@pytest.mark.parametrize("rule", list(RULES))
@pytest.mark.parametrize("process", ["iid", "wor", "topk"])
def test_node_laws_equal_the_numpy_emission(rule, process):
    """The law of the accepted node and every inner node's residual (normalised) against the numpy verifier's
    emission, to 1e-12: random trees of each process (repeated siblings under "iid" at V = 2 and 3), the
    target equal to the draft (no residual mass: the guarded residual) and one-hot laws (greedy)."""
    rng = np.random.default_rng(zlib.crc32(f"{rule}:{process}".encode()))
    v = RULES[rule]
    for it in range(40):
        V = int(rng.integers(2, 9))
        shape = WIDE if V >= 3 else SMALL
        d = random_markov_model(V, rng=int(rng.integers(2**31)))
        t = d if it % 5 == 0 else random_markov_model(V, rng=int(rng.integers(2**31)))
        tree = T.sample_tree(shape, d, process=process, rng=int(rng.integers(2**31)))
        P, Q = T.tree_laws(tree, d, t)
        if it % 7 == 1:  # one-hot laws (greedy decoding), ties among children included
            P, Q = np.eye(V)[P.argmax(1)], np.eye(V)[Q.argmax(1)]
        lay, mass, resid = _device_laws(rule, tree, P, Q)
        E = v.emission(tree, P, Q)
        np.testing.assert_allclose(mass, E.sum(axis=1), rtol=0, atol=1e-12)
        for i, node in enumerate(lay.inner_np.tolist()):
            if E[node].sum() > 1e-9:
                np.testing.assert_allclose(resid[i] / resid[i].sum(), E[node] / E[node].sum(), rtol=0, atol=1e-12)


@pytest.mark.parametrize("rule,process", [("specinfer", "iid"), ("sequoia", "wor"), ("target-only", "topk")])
def test_device_sampler_follows_the_emission_law(rule, process):
    """(accepted node, emitted token) of verify_tree_t on one fixed tree against the numpy emission law."""
    V = 4
    d, t = random_markov_model(V, rng=3), random_markov_model(V, rng=4)
    tree = T.sample_tree(WIDE, d, process=process, rng=5)
    P, Q = T.tree_laws(tree, d, t)
    law = RULES[rule].emission(tree, P, Q).ravel()
    lay = TreeLayoutT.of_tree(tree)
    toks, Pin, Qt = torch.tensor(tree.tokens), torch.from_numpy(P[lay.inner_np]), torch.from_numpy(Q)
    Qin = Qt[torch.from_numpy(lay.inner_np)]
    g = torch.Generator().manual_seed(6)
    counts = np.zeros(law.shape[0], dtype=np.int64)
    for _ in range(4000):
        a, y, mass = verify_tree_t(rule, lay, toks, Pin, Qin, lambda v: Qt.index_select(0, v), g)
        counts[int(a[0]) * V + int(y[0])] += 1
    np.testing.assert_allclose(mass.numpy(), law.reshape(-1, V).sum(1), rtol=0, atol=1e-12)
    gof = chi2_gof(counts, law, alpha_fail=ALPHA_FAIL)
    assert gof.outside_support == 0 and gof.passed, gof


@pytest.mark.parametrize("rule", ["cdf", "race"])
def test_wor_children_follow_the_sequential_law(rule):
    """The ordered draws without replacement of a "wor" node's children, P(x1, x2, x3) = prod p(x_r) / (1 - sum of
    the earlier), by chi-square, on a law with a zero-mass token (never drawn); the flags of rows with fewer
    positive tokens than the children they need, and no repeated token in a row."""
    from otspec.decoding._tree_device import _draws_wor

    p = np.array([0.4, 0.0, 0.3, 0.2, 0.1])
    V, m, N = p.shape[0], 3, 6000
    law = np.zeros((V, V, V))
    for a in range(V):
        for b in range(V):
            for c in range(V):
                if len({a, b, c}) == 3:
                    law[a, b, c] = p[a] * p[b] / (1 - p[a]) * p[c] / (1 - p[a] - p[b])
    g = torch.Generator().manual_seed(11)
    top, short = _draws_wor(torch.from_numpy(p).expand(N, V).contiguous(), m, torch.full((N,), m), g, rule=rule)
    assert not short.any()
    ids = top.numpy()
    counts = np.bincount(ids[:, 0] * V * V + ids[:, 1] * V + ids[:, 2], minlength=V**3)
    gof = chi2_gof(counts, law.ravel(), alpha_fail=ALPHA_FAIL)
    assert gof.outside_support == 0 and gof.passed, gof
    two = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0]] * 3, dtype=torch.float64)
    top, short = _draws_wor(two, 3, torch.tensor([2, 3, 1]), g, rule=rule)
    assert short.tolist() == [False, True, False]
    assert sorted(top[0, :2].tolist()) == [1, 3]


@pytest.mark.parametrize("process,verifier", [("topk", "target-only"), ("iid", "specinfer"), ("wor", "sequoia")])
def test_device_route_reads_the_host_once_per_iteration(process, verifier, monkeypatch):
    """One host read per iteration (after the target call: the accepted node and token, the tree's tokens and
    the flags; the target scores the tree from its tokens on the device), one after the loop (the logged
    predictions), the seed before it, and no tensor turned into a number anywhere else (counted at the
    dispatcher); the numpy route reads far more. The route an accelerator runs (``read_on_host=False``): on the
    CPU, where a read waits for nothing, the accepted node is read before its residual (tested equal below)."""
    from otspec.decoding._tree_device import TreeStepT

    monkeypatch.setattr(TreeStepT, "read_on_host", False)
    target, draft, _, _ = _memoryless(40, seed=1)
    kw = dict(draft=draft, target=target, tree=WIDE, process=process, verifier=verifier, max_new_tokens=30, rng=0)
    with _HostReads() as mode, _ScalarReads() as scalars:
        res = D.speculative_decode([0], **kw, log_laws=False)
    assert res.engine == "torch"
    assert mode.reads.count("tolist") == res.iterations
    # + the seed, + the log after the loop: one read for the iterations of each depth drafted (the last ones
    # draft fewer levels; plain decoding's step reads its token)
    depths = len(set(res.draft_lengths[res.draft_lengths > 0].tolist()))
    assert len(mode.reads) == res.iterations + 1 + depths, mode.reads
    assert scalars.reads == 1  # the seed
    with _HostReads() as mode:
        host = D.speculative_decode([0], **kw, engine="numpy")
    assert host.engine == "numpy" and len(mode.reads) > 3 * host.iterations


def test_topk_predictions_equal_on_both_routes():
    """A top-k tree is one tree per context: the first iteration's exact predictions agree on both routes to
    1e-12 (the same context and tree; only the device route's draws differ afterwards)."""
    target, draft, _, _ = _memoryless(30, seed=2)
    runs = {e: D.speculative_decode([3], draft=draft, target=target, tree=WIDE, process="topk", max_new_tokens=6,
                                    rng=1, engine=e) for e in ("torch", "numpy")}
    a, b = runs["torch"], runs["numpy"]
    assert (a.engine, b.engine) == ("torch", "numpy")
    for name in ("predicted_accepted", "predicted_emitted", "alpha_first", "alpha_opt_first"):
        np.testing.assert_allclose(getattr(a, name)[0], getattr(b, name)[0], rtol=0, atol=1e-12, err_msg=name)
    np.testing.assert_allclose(a.predicted_reached[0], b.predicted_reached[0], rtol=0, atol=1e-12)


def test_iid_alpha_opt_first_is_alpha_k_and_optional():
    """The optimum at the root (alpha_K, a sort) from the kept root laws in batches; skipped without log_laws."""
    import otspec

    target, draft, tq, tp = _memoryless(20, seed=4)
    res = D.speculative_decode([0], draft=draft, target=target, tree=WIDE, process="iid", max_new_tokens=25, rng=3)
    ctx = [0] + res.tokens.tolist()
    starts = np.concatenate([[0], np.cumsum(res.emitted)[:-1]])
    for i, s in enumerate(starts):
        p, q = torch.softmax(tp[ctx[s]], -1).numpy(), torch.softmax(tq[ctx[s]], -1).numpy()
        if res.draft_lengths[i] == 0:  # plain decoding's step: no draft, nothing verified
            assert np.isnan(res.alpha_opt_first[i]) and np.isnan(res.alpha_first[i])
            continue
        np.testing.assert_allclose(res.alpha_opt_first[i], otspec.alpha_k(p, q, 3), rtol=0, atol=1e-12)
    drafted = res.draft_lengths > 0  # plain decoding's step (one token left): alpha NaN, no depth reached
    np.testing.assert_allclose(res.predicted_reached[drafted, 0], res.alpha_first[drafted], rtol=0, atol=0)
    assert (res.predicted_reached[~drafted] == 0).all()
    quiet = D.speculative_decode([0], draft=draft, target=target, tree=WIDE, process="iid", max_new_tokens=25, rng=3,
                                 log_laws=False)
    np.testing.assert_array_equal(quiet.tokens, res.tokens)
    assert np.isnan(quiet.alpha_opt_first).all()


class _RefuseTree(_Refuse):
    def tree_logits(self, *a, **k):
        raise AssertionError("a model was called")


def test_tree_engine_bad_input_before_any_model_call():
    target, draft, _, _ = _memoryless(8)
    eagle = T.Eagle2Params(depth=2, top_k=2, total_tokens=4)
    for kw, match in [({"tree": SMALL, "process": "spechub", "engine": "torch"}, "`engine`='torch' runs draft trees"),
                      ({"tree": SMALL, "process": "iid", "verifier": "traversal", "allow_lossy": True,
                        "engine": "torch"}, "'traversal'"),
                      ({"tree": SMALL, "process": "iid", "engine": "gpu"}, "`engine`"),
                      ({"tree": SMALL, "process": "iid", "log_laws": 1}, "log_laws")]:
        with pytest.raises((ValueError, TypeError), match=match):
            D.speculative_decode([0], draft=_RefuseTree(draft), target=_RefuseTree(target), **kw)
    res = D.speculative_decode([0], draft=draft, target=target, tree=eagle, max_new_tokens=4, rng=0)
    assert res.engine == "torch"  # auto: EAGLE-2's dynamic trees run on the device route too


def test_bench_tree_rows_time_both_routes():
    """experiments/bench_decode_overhead.py: the tree texts split outside brackets, both routes timed with the
    target's tree call counted as a forward (a share outside the forwards in [0, 1))."""
    from tests.experiment import load_experiment

    bench = load_experiment("bench_decode_overhead")
    assert bench._split_trees("topk:branching(2,2), iid:[[0],[1],[0,0]]:specinfer") == [
        "topk:branching(2,2)", "iid:[[0],[1],[0,0]]:specinfer"]
    assert bench._split_trees("eagle2:3,2,6, eagle2:4, 4, 16:target-only,topk:chain(2)") == [
        "eagle2:3,2,6", "eagle2:4, 4, 16:target-only", "topk:chain(2)"]
    target, draft, _, _ = _memoryless(12, seed=5)
    res = bench.measure_trees((target, draft), ["topk:branching(2,2)"], [[1, 2, 3]], tokens=6, repeats=1)
    assert set(res) == {"otspec topk:branching(2,2), engine=numpy", "otspec topk:branching(2,2), engine=torch"}
    for ms, cpu_ms, it_ms, out, out_cpu in res.values():
        assert ms > 0 and cpu_ms > 0 and it_ms >= ms and 0.0 <= out < 1.0 and out_cpu < 1.0


def _tiny_llama(V, seed, attn):
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                                   initializer_range=0.2)
    torch.manual_seed(seed)
    return D.HFCausalLM(transformers.LlamaForCausalLM._from_config(cfg, attn_implementation=attn).eval())


@pytest.mark.parametrize("kind", ["hf-sdpa", "hf-rows", "callable"])
def test_tree_logits_take_device_tokens_without_a_host_read(kind, monkeypatch):
    """``tree_logits`` with the tokens as a tensor: the same logits and state as with a numpy array (one tree,
    a kept path, a batch of two trees with padding nodes), no host read inside the call; an id outside
    ``[0, V)`` at a draft node (not refusable without a read) gives NaN rows at that node and below only."""
    V = 11
    if kind == "callable":
        lm, _, _, _ = _memoryless(V, seed=7)
    else:
        lm = _tiny_llama(V, 0, "sdpa" if kind == "hf-sdpa" else "eager")
        if kind == "hf-rows":  # as a model refusing 4-D masks: the row route
            from otspec.decoding import _models

            monkeypatch.setattr(_models, "_tree_refusal", lambda model: "no 4-D mask (a stand-in)")
    fb = "rows" if kind != "hf-sdpa" else None
    parents = np.array([-1, 0, 0, 1, 1, 3])
    tokens = np.array([-1, 4, 7, 2, 9, 5])
    batch_p = np.array([parents, [-1, 0, 1, -1, -1, -1]])
    batch_t = np.array([tokens, [-1, 3, 8, -1, -1, -1]])
    for par, tok, pending, keep in [(parents, tokens, [1, 2], None), (parents, tokens, [6], 5),
                                    (batch_p, batch_t, [[1, 2], [3, 4]], None)]:
        states = []
        outs = []
        for as_tensor in (False, True):
            st = lm.new_state()
            lm.logits(st, torch.tensor([[0, 3]]))
            arg = torch.from_numpy(tok.copy()) if as_tensor else tok
            with _HostReads() as mode:
                outs.append(lm.tree_logits(st, par, arg, pending=pending, keep=keep, fallback=fb))
            if as_tensor and keep is None:
                assert mode.reads == [], mode.reads
            states.append(st)
        torch.testing.assert_close(outs[1], outs[0], rtol=0, atol=0, equal_nan=True)
        assert states[0].length == states[1].length
        nxt = [lm.logits(s, torch.tensor([[1]] * (2 if par.ndim == 2 else 1)))[:, -1] for s in states]
        torch.testing.assert_close(nxt[1], nxt[0], rtol=0, atol=0)
    for wrong in (V, -1):
        bad = torch.from_numpy(tokens.copy())
        bad[3] = wrong  # node 3 and its child 5
        st = lm.new_state()
        lm.logits(st, torch.tensor([[0, 3]]))
        got = lm.tree_logits(st, parents, bad, pending=[1, 2], fallback=fb)
        assert torch.isnan(got).all(-1).tolist() == [False, False, False, True, False, True]
    with pytest.raises(TypeError, match=r"`tokens` must hold ints, got dtype torch.float32"):
        lm.tree_logits(lm.new_state(), parents, torch.zeros(6), pending=[1])
    with pytest.raises(ValueError, match=r"`parents` must have shape \(5,\)"):
        lm.tree_logits(lm.new_state(), parents, torch.zeros(5, dtype=torch.long), pending=[1])


@pytest.mark.parametrize("role,bad_at", [("draft", 2), ("draft", 3), ("target", 2), ("target", 3)])
def test_device_tree_refuses_non_finite_logits_after_the_one_read(role, bad_at):
    """Non-finite logits after ``bad_at`` tokens (at the root with a prompt of 2, or at a node of depth 1): a
    ValueError naming the model and the position, read with the outcome after the target call (the draft's
    flags too: its token ids are valid whatever its laws, so the target's call on them is harmless)."""
    n = 6
    table = torch.randn(n, n, generator=torch.Generator().manual_seed(0))

    def fn(ids):
        out = table[ids].clone()
        if ids.shape[1] >= bad_at:
            out[:, bad_at - 1, 2] = float("inf")
        return out

    ok, broken = D.CallableLM(lambda ids: table[ids], n, name="fine"), D.CallableLM(fn, n, name="overflowing")
    pair = dict(target=broken, draft=ok) if role == "target" else dict(target=ok, draft=broken)
    for process, verifier in [("iid", "specinfer"), ("topk", "target-only")]:
        with pytest.raises(ValueError, match=rf"the {role} model 'overflowing' gave non-finite logits .* "
                                             rf"position {bad_at}"):
            D.speculative_decode([0, 1], **pair, tree=SMALL, process=process, verifier=verifier,
                                 max_new_tokens=10, rng=0, engine="torch")


def test_device_tree_refuses_a_support_too_small_for_distinct_children():
    """A draft law with one token of positive probability cannot give two distinct children ("wor", "topk"):
    the support error of the host route, naming the node's token path."""
    n = 5
    tq = torch.randn(n, n, generator=torch.Generator().manual_seed(1))
    tp = torch.full((n, n), -math.inf)
    tp[:, 3] = 0.0  # the draft always says 3
    pair = dict(target=D.CallableLM(lambda ids: tq[ids], n), draft=D.CallableLM(lambda ids: tp[ids], n))
    for process in ("wor", "topk"):
        with pytest.raises(ValueError, match=rf"process='{process}' needs 2 distinct children at the node with "
                                             r"token path \(\), but the draft's law there has only 1 tokens"):
            D.speculative_decode([0], **pair, tree=SMALL, process=process, max_new_tokens=6, rng=0, engine="torch")


# ----------------------------------------------------------------------------- blocks kept across iterations
def _fresh_blocks(monkeypatch):
    """Make every block of the device route a fresh tensor (the route before blocks were kept)."""
    import otspec.decoding._sampling as S
    import otspec.decoding._tree_device as TD

    real = S._block

    def fresh(work, name, shape, device, dtype=None):
        return real(None, name, shape, device, dtype)

    monkeypatch.setattr(TD, "_block", fresh)


@pytest.mark.parametrize("rule,process", [("specinfer", "iid"), ("sequoia", "wor"), ("target-only", "topk")])
def test_verify_with_reused_blocks_equals_fresh_blocks(rule, process):
    """verify_tree_t writing every pass over V into blocks kept across calls (``work``) gives the accepted node, the
    emitted token and the exact law bit for bit as with fresh blocks, call after call on other laws (nothing stale is
    read), and the blocks are the same memory from one call to the next."""
    rng = np.random.default_rng(zlib.crc32(f"reuse:{rule}".encode()))
    work: dict = {}
    ptrs = None
    V = 6  # the same shapes every call: the same blocks
    for it in range(30):
        d, t = random_markov_model(V, rng=int(rng.integers(2**31))), random_markov_model(V, rng=int(rng.integers(2**31)))
        if it % 6 == 0:
            t = d  # no residual mass: the guarded residuals
        tree = T.sample_tree(WIDE, d, process=process, rng=int(rng.integers(2**31)))
        P, Q = T.tree_laws(tree, d, t)
        lay = TreeLayoutT.of_tree(tree)
        toks, Pin, Qt = torch.tensor(tree.tokens), torch.from_numpy(P[lay.inner_np]), torch.from_numpy(Q)
        Qin = Qt[torch.from_numpy(lay.inner_np)]
        seed = int(rng.integers(2**31))
        got = verify_tree_t(rule, lay, toks, Pin, Qin, lambda v, Qt=Qt: Qt.index_select(0, v),
                            torch.Generator().manual_seed(seed), work=work)
        want = verify_tree_t(rule, lay, toks, Pin, Qin, lambda v, Qt=Qt: Qt.index_select(0, v),
                             torch.Generator().manual_seed(seed))
        for a, b in zip(got, want):
            assert torch.equal(a, b)
        if it == 0:
            ptrs = {k: v.data_ptr() for k, v in work.items() if isinstance(k, tuple) and len(k) == 3}
    assert ptrs and all(work[k].data_ptr() == p for k, p in ptrs.items())


@pytest.mark.parametrize("rule", list(RULES))
def test_residual_given_q_and_leaves_is_the_residual_and_q(rule):
    """residual_rows_t reading the target laws it is given (q_at's row) equals the one copying Q's rows bit for bit,
    and is q itself, bit for bit, at rows marked as leaves (``inner`` False): what verify_tree_t draws from."""
    rng = np.random.default_rng(zlib.crc32(f"resid:{rule}".encode()))
    for _ in range(20):
        V = int(rng.integers(2, 9))
        shape = WIDE if V >= 3 else SMALL
        d, t = random_markov_model(V, rng=int(rng.integers(2**31))), random_markov_model(V, rng=int(rng.integers(2**31)))
        tree = T.sample_tree(shape, d, process="iid" if rule != "sequoia" else "wor", rng=int(rng.integers(2**31)))
        P, Q = T.tree_laws(tree, d, t)
        lay = TreeLayoutT.of_tree(tree)
        Pin, Qin = torch.from_numpy(P[lay.inner_np]), torch.from_numpy(Q[lay.inner_np])
        _, _, x, level, _ = node_rules_t(rule, lay, torch.tensor(tree.tokens), Pin, Qin)
        rows = torch.arange(len(lay.inner_np))
        want = residual_rows_t(rule, x, level, Pin, Qin, rows)
        got = residual_rows_t(rule, x, level, Pin, Qin, rows, q=Qin.clone(), work={})
        assert torch.equal(got, want)
        leaf = torch.tensor([[bool(i % 2)] for i in range(len(rows))])
        mixed = residual_rows_t(rule, x, level, Pin, Qin, rows, q=Qin.clone(), inner=leaf)
        assert torch.equal(mixed[~leaf[:, 0]], Qin[~leaf[:, 0]]) and torch.equal(mixed[leaf[:, 0]], want[leaf[:, 0]])


def test_wor_draws_in_place_leave_the_laws_bit_for_bit():
    """The running-sum draws without replacement marking the caller's own block (``in_place``) draw what the copy
    route draws and leave the block bit for bit as it was, a degenerate row (one positive token for two draws)
    included."""
    from otspec.decoding._tree_device import _draws_wor

    g = torch.Generator().manual_seed(3)
    P = torch.rand((5, 40), dtype=torch.float64, generator=g) ** 3
    P[1, 3:] = 0.0
    P[2] = 0.0
    P[2, 7] = 1.0  # one positive token: flagged short, drawn twice
    P[4, ::2] = 0.0
    before = P.clone()
    need = torch.tensor([3, 3, 2, 1, 3])
    a = _draws_wor(P.clone(), 3, need, torch.Generator().manual_seed(9), rule="cdf")
    b = _draws_wor(P, 3, need, torch.Generator().manual_seed(9), rule="cdf", work={}, in_place=True)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert torch.equal(P, before)
    assert b[1].tolist() == [False, False, True, False, False]


@pytest.mark.parametrize("sampling", [D.Sampling(), D.Sampling(temperature=0.7, top_k=5), D.Sampling(top_p=0.8),
                                      D.Sampling(temperature=0.0), D.Sampling(top_p=0.8, top_p_rule="transformers")])
def test_target_laws_q_at_equals_the_rows_of_q_bit_for_bit(sampling):
    """The device route's target laws: Q at the nodes with children (logits read in place where those rows are
    consecutive, gathered into a kept block elsewhere) is Sampling.probs of those rows, and q_at(v) at a node with
    children is Q's row bit for bit (the residual is then formed from q_at's row), at a leaf Sampling.probs of its row;
    q_at's flag marks a bad row."""
    from otspec.decoding._tree_device import TreeStepT

    g = torch.Generator().manual_seed(0)
    logits = torch.randn((7, 300), generator=g) * 3
    logits[2, :5] = 9.0  # ties at the top
    plan = type("Plan", (), {"verifier": T.SpecInferVerifier(), "process": "iid", "shape": WIDE})()
    step = TreeStepT(plan, sampling, False, law_batch=4, clock=None)
    for rows in ([0, 1, 2], [1, 3, 4]):
        r = torch.tensor(rows)
        sl = slice(rows[0], rows[-1] + 1) if rows == list(range(rows[0], rows[-1] + 1)) else None
        for _ in range(2):  # the second time in the kept blocks
            Q, q_at, leaf = step._target_laws(logits, r, sl)
            want = sampling.probs(logits[r], check=False)
            assert torch.equal(Q, want)
            for i, v in enumerate(rows + [6]):
                row = q_at(torch.tensor([v]))
                ref = Q[i : i + 1] if v in rows else sampling.probs(logits[v : v + 1], check=False)
                assert torch.equal(row, ref)
    bad = logits.clone()
    bad[5, 0] = math.nan
    _, q_at, leaf = step._target_laws(bad, torch.tensor([0, 1, 2]), slice(0, 3))
    q_at(torch.tensor([5]))
    assert leaf[0].tolist() == [True]


def test_tree_decoding_with_kept_blocks_equals_fresh_blocks(monkeypatch):
    """Whole decodes of every tree family on a tiny Llama pair: the blocks kept across iterations (laws, levels,
    residuals, running sums, gathered logits) give the tokens and the logged predictions bit for bit as fresh blocks
    every iteration."""
    from tests.toy_lm import tiny_llama

    target, draft = tiny_llama(1, vocab=40), tiny_llama(2, vocab=40)
    trees = ["eagle2:3,2,6", "topk:branching(2,2)", "iid:branching(2,2):specinfer", "wor:branching(2,2):sequoia"]
    names = ("tokens", "predicted_accepted", "alpha_first", "alpha_opt_first")

    def run():
        return [D.speculative_decode([3, 1, 4], draft=draft, target=target, tree=tree, max_new_tokens=12, rng=s,
                                     engine="torch") for tree in trees for s in (0, 1)]

    kept = run()
    _fresh_blocks(monkeypatch)
    fresh = run()
    for a, b in zip(kept, fresh):
        for name in names:
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


@pytest.mark.parametrize("process", ["iid", "wor"])
def test_root_laws_copied_or_not_give_the_same_optimum(process, monkeypatch):
    """log_laws' root optimum: computed after each iteration from its own law blocks ("iid" on the CPU) or from
    copies in blocks of law_batch rows flushed when full and after the loop ("wor", and elsewhere), both forced here:
    the same values bit for bit, and the same tokens."""
    from otspec.decoding import _loop
    from otspec.decoding._tree_device import TreeStepT

    target, draft, _, _ = _memoryless(20, seed=4)
    kw = dict(draft=draft, target=target, tree=WIDE, process=process, max_new_tokens=25, rng=3, engine="torch")
    monkeypatch.setattr(TreeStepT, "copy_root_laws", False)
    at_once = D.speculative_decode([0], **kw)
    monkeypatch.setattr(TreeStepT, "copy_root_laws", True)
    monkeypatch.setattr(_loop, "LAW_BATCH", 4)  # a few full flushes, then the rest after the loop
    copied = D.speculative_decode([0], **kw)
    np.testing.assert_array_equal(copied.tokens, at_once.tokens)
    np.testing.assert_array_equal(copied.alpha_opt_first, at_once.alpha_opt_first)
    drafted = copied.draft_lengths > 0  # plain decoding's step (one token left) has none: NaN
    assert np.isfinite(copied.alpha_opt_first[drafted]).all() and len(copied.alpha_opt_first) == copied.iterations
    assert np.isnan(copied.alpha_opt_first[~drafted]).all()
