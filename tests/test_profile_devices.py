"""otspec.profile at serving scale: per-run costs paid once, and the dask route with one worker per device."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("pyarrow")

from otspec.decoding._sampling import Sampling  # noqa: E402
from otspec.profile import profile, read_table, toy_pair  # noqa: E402
from otspec.profile._distributed import takes_device, worker_devices  # noqa: E402
from otspec.profile._trees import draw_and_score, position_values, ranked_rows, resolve_trees, tree_rng  # noqa: E402

V = 3
PROMPTS = [[0], [1, 2], [2, 0, 1], [1], [0, 0]]
SMALL = dict(k_max=2, L_max=2, max_new_tokens=3, shard_size=2, progress=False, verifiers=["token", "optimal"],
             families=["token"])
#: (device, worker address) of every pair the device-taking factory built in this process.
BUILT: list = []


def devices_pair(device=None):
    """A picklable factory taking ``device`` (None by default: the client's build): the toy pair, the build recorded."""
    from distributed import get_worker

    try:
        where = get_worker().address
    except ValueError:
        where = None
    BUILT.append((device, where))
    return toy_pair(V, seed=3)


def _rows(out):
    t = read_table(out).sort_by([(c, "ascending") for c in ("prompt", "pos", "kind", "name", "k", "j", "m")])
    return {c: t[c].to_pylist() for c in t.column_names}


# --------------------------------------------------------------------------- one worker per device
def test_worker_devices_one_gpu_per_worker_of_each_host():
    got = worker_devices([("tcp://h1:9", "h1", 2), ("tcp://h1:10", "h1", 2), ("tcp://h1:11", "h1", 2),
                          ("tcp://h2:5", "h2", 1), ("tcp://h2:6", "h2", 1), ("tcp://h3:1", "h3", 0)])
    # per host in address order: h1's workers on cuda:0, cuda:1, then around again; a dask-cuda worker sees one
    # GPU (its own, as cuda:0); a host without GPU runs on the CPU
    assert got == {"tcp://h1:10": "cuda:0", "tcp://h1:11": "cuda:1", "tcp://h1:9": "cuda:0",
                   "tcp://h2:5": "cuda:0", "tcp://h2:6": "cuda:0", "tcp://h3:1": "cpu"}
    assert worker_devices([]) == {}


def test_takes_device():
    import functools

    assert takes_device(devices_pair) and takes_device(lambda **kw: None)
    assert not takes_device(functools.partial(toy_pair, V, seed=3)) and not takes_device(len)


def test_two_local_workers_each_build_the_pair_once_on_their_device(tmp_path):
    distributed = pytest.importorskip("distributed")
    draft, target = toy_pair(V, seed=3)
    profile(PROMPTS, out=tmp_path / "local", draft=draft, target=target, **SMALL)
    BUILT.clear()
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        run = profile(PROMPTS, out=tmp_path / "dask", models=devices_pair, client=client, **SMALL)
        workers = set(client.scheduler_info()["workers"])
    assert run.shards_written == 3
    assert _rows(tmp_path / "dask") == _rows(tmp_path / "local")
    # the client's own build (the checks and fingerprints) with the factory's default, then at most one per worker,
    # each on the device it was given (no GPU here: the CPU), never twice on one worker
    assert BUILT[0] == (None, None)
    on_workers = BUILT[1:]
    assert on_workers and len(on_workers) == len(set(on_workers)) and {w for _, w in on_workers} <= workers
    assert {d for d, _ in on_workers} == {"cpu"}
    # resuming: nothing left to run, no worker asked for anything, the rows unchanged
    BUILT.clear()
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        again = profile(PROMPTS, out=tmp_path / "dask", models=devices_pair, client=client, **SMALL)
    assert again.shards_written == 0 and again.shards_skipped == 3 and BUILT == [(None, None)]
    assert _rows(tmp_path / "dask") == _rows(tmp_path / "local")


def test_a_factory_defined_in_a_script_is_held_by_its_cloudpickle():
    from otspec.profile._distributed import _factory_key

    def local(device=None):  # not importable by reference: pickle refuses it, dask ships it by cloudpickle
        return toy_pair(V, seed=3)

    assert _factory_key(local) == _factory_key(local) and _factory_key(devices_pair) != _factory_key(local)


# --------------------------------------------------------------------------- per-run costs paid once
def test_weights_digest_computed_once_per_loaded_model(monkeypatch):
    transformers = pytest.importorskip("transformers")
    from otspec.decoding import HFCausalLM
    from otspec.profile import _store

    cfg = transformers.LlamaConfig(vocab_size=8, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1)
    torch.manual_seed(0)
    lm = HFCausalLM(transformers.LlamaForCausalLM(cfg), name="tiny")
    calls = []
    hash_fn = _store._hash_state_dict
    monkeypatch.setattr(_store, "_hash_state_dict", lambda sd: calls.append(1) or hash_fn(sd))
    a = _store.fingerprint(lm)
    assert _store.fingerprint(lm) == a and len(calls) == 1           # the second run on the same model: no hashing
    with torch.no_grad():
        lm.model.lm_head.weight[0, 0] += 1e-3                          # an in-place write: hashed again, and differs
    b = _store.fingerprint(lm)
    assert len(calls) == 2 and b["weights_sha256"] != a["weights_sha256"]
    torch.manual_seed(0)
    other = HFCausalLM(transformers.LlamaForCausalLM(cfg), name="tiny")  # another object: its own digest
    assert _store.fingerprint(other)["weights_sha256"] == a["weights_sha256"] and len(calls) == 3


# --------------------------------------------------------------------------- the trees' laws on their device
TREES = ("topk:branching(2,2)", "topk:[[0],[2],[0,1]]", "eagle2:3,2,5", "iid:branching(2,2):specinfer,target-only",
         "wor:branching(3,1):sequoia,traversal,target-only")


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 3), st.integers(1, 12), st.integers(1, 12))
def test_ranked_rows_on_the_device_equal_the_host_ranking(seed, levels, n, K):
    # laws with many ties (a few distinct values, zeros among them): the device's top-k with the ties taken by lower
    # id, then a stable sort, gives the host's ranking, which is the first K of the full stable sort
    rng = np.random.default_rng(seed)
    V = 12
    p = rng.integers(0, levels + 1, size=(n, V)).astype(np.float64)
    p[:, 0] += 1.0
    p /= p.sum(axis=1, keepdims=True)
    K = min(K, V)
    ids_t, vals_t = ranked_rows(torch.from_numpy(p), K)
    ids_n, vals_n = ranked_rows(p, K)
    want = np.argsort(-p, axis=1, kind="stable")[:, :K]
    np.testing.assert_array_equal(ids_t.numpy(), want)
    np.testing.assert_array_equal(ids_n, want)
    np.testing.assert_array_equal(vals_t.numpy(), np.take_along_axis(p, want, axis=1))
    np.testing.assert_array_equal(vals_n, vals_t.numpy())


def _trees_at(draft, target, ctxs, plan, sampling, on_device):
    ids = torch.tensor(ctxs)
    ds, ts = draft.new_state(), target.new_state()
    logits = draft.logits(ds, ids)[:, -1]
    p, r = sampling.probs(logits).numpy(), sampling.own_law(logits).numpy()
    q = sampling.probs(target.logits(ts, ids))[:, -1].numpy()
    rngs = [tree_rng(0, b) for b in range(len(ctxs))]
    return draw_and_score(draft, ds, target, ts, ids[:, -1].numpy(), ids.shape[1], p, q, plan, sampling, rngs,
                          r_root=r, on_device=on_device)


@pytest.mark.parametrize("top_k", [None, 3])
def test_trees_ranked_on_the_device_equal_the_host_route(top_k, monkeypatch):
    # every tree family, two prompts walked together, with and without truncation (EAGLE-2 then ranks by the
    # draft's own law): the same trees, and every value within 1e-12 relative of the host route's (the sampled
    # trees drawn from the host route's stream, then scored and verified on the device)
    import otspec.profile._trees_device as TD

    monkeypatch.setattr(TD, "device_generator", lambda rngs, device: None)
    V = 7
    draft, target = toy_pair(V, seed=4, closeness=0.6)
    plan = resolve_trees(TREES, "branching(3,2)")
    s = Sampling(1.0, top_k, None, "ties")
    for ctxs in ([[1, 3, 0], [2, 2, 5]], [[6, 1], [0, 4]]):
        host = _trees_at(draft, target, ctxs, plan, s, on_device=False)
        dev = _trees_at(draft, target, ctxs, plan, s, on_device=True)
        for a, b in zip(host, dev):
            assert {k: v.tree.tokens.tolist() for k, v in a.items()} == {k: v.tree.tokens.tolist() for k, v in b.items()}
            va, vb = position_values(plan, a, V), position_values(plan, b, V)
            assert va["tree"].keys() == vb["tree"].keys()
            for name in va["tree"]:
                np.testing.assert_allclose(vb["tree"][name], va["tree"][name], rtol=1e-12, atol=0)
            for key in ("treeq", "treep"):
                np.testing.assert_allclose(vb[key], va[key], rtol=1e-12, atol=0)
            for name in va["treenode"]:
                np.testing.assert_allclose(vb["treenode"][name], va["treenode"][name], rtol=1e-12, atol=0)


def test_deterministic_trees_on_the_device_move_no_whole_law(monkeypatch):
    # the top-k and EAGLE-2 trees read (n, K) ranks and the target's probabilities of the drawn tokens: no (., V)
    # law reaches the host from the device route's depths and scoring; the host route moves every law
    V = 40
    draft, target = toy_pair(V, seed=2)
    plan = resolve_trees(["topk:branching(3,2)", "eagle2:3,2,5"], "branching(3,2)")
    s = Sampling(1.0, None, None, "ties")
    moved = []
    to_numpy = torch.Tensor.numpy

    def numpy(self, *args, **kw):
        moved.append(tuple(self.shape))
        return to_numpy(self, *args, **kw)

    ids = torch.tensor([[1, 3, 0], [2, 2, 5]])
    for on_device in (True, False):
        ds, ts = draft.new_state(), target.new_state()
        logits = draft.logits(ds, ids)[:, -1]
        p, q = s.probs(logits).numpy(), s.probs(target.logits(ts, ids))[:, -1].numpy()
        moved.clear()
        monkeypatch.setattr(torch.Tensor, "numpy", numpy)
        draw_and_score(draft, ds, target, ts, ids[:, -1].numpy(), 3, p, q, plan, s, [tree_rng(0, 0), tree_rng(0, 1)],
                       on_device=on_device)
        monkeypatch.setattr(torch.Tensor, "numpy", to_numpy)
        whole = [m for m in moved if m and m[-1] == V]
        assert (not whole) if on_device else whole


def test_the_walk_on_device_tensors_equals_the_host_route(tmp_path, monkeypatch):
    # the whole walk with the laws kept as torch tensors (the route of an accelerator, here on the CPU): every
    # quantity at every position (subsample=1) and every tree family, each row within 1e-12 relative of the
    # numpy route's (the sampled trees drawn from the host route's stream, then scored and verified on the device)
    import otspec.profile._collect as C
    import otspec.profile._trees_device as TD

    draft, target = toy_pair(6, seed=3)
    kw = dict(k_max=2, L_max=3, max_new_tokens=4, subsample=1, progress=False, trees=list(TREES), top_k=4)
    prompts = [[0, 1], [2], [3, 4, 5]]
    profile(prompts, out=tmp_path / "host", draft=draft, target=target, **kw)
    monkeypatch.setattr(C, "analysis_device", lambda lm: torch.device("cpu"))
    monkeypatch.setattr(TD, "device_generator", lambda rngs, device: None)
    profile(prompts, out=tmp_path / "device", draft=draft, target=target, **kw)
    a, b = _rows(tmp_path / "host"), _rows(tmp_path / "device")
    assert {c: v for c, v in a.items() if c != "value"} == {c: v for c, v in b.items() if c != "value"}
    assert {"tree", "treeq", "treep", "treenode", "acc", "tau"} <= set(a["kind"])
    np.testing.assert_allclose(b["value"], a["value"], rtol=1e-12, atol=0)


# --------------------------------------------------------------------------- the device's free memory
def test_laws_above_the_devices_free_memory_are_refused_before_the_run(tmp_path, monkeypatch):
    import otspec.profile._run as R
    from otspec.profile import ProfileSettings
    from otspec.profile._collect import check_device_memory, device_law_bytes

    s = ProfileSettings(k_max=4, L_max=4, batch_size=8, trees=["topk:branching(8,4,2)"]).for_vocabulary(128_256)
    parts = device_law_bytes(s, 128_256, [40] * 8)
    assert parts["blocks"] == 8 * 4 * 9 * 128_256 * 8 and parts["trees"] > 0
    # a subsampled position's blocks stay on the device until the next position's read: counted twice
    assert parts["held position"] == parts["blocks"]
    assert device_law_bytes(dataclasses.replace(s, subsample=0), 128_256, [40] * 8)["held position"] == 0
    need = sum(parts.values())
    check_device_memory(s, 128_256, [40] * 8, torch.device("cuda:0"), free=need)  # fits exactly
    check_device_memory(s, 128_256, [40] * 8, None, free=1)                        # the host: not checked here
    with pytest.raises(ValueError, match=r"GiB of laws at once on cuda:0 .*blocks 0\.28 GiB.*first call.*trees.*"
                                         r"held position 0\.28 GiB.*"
                                         r"above its free memory 0\.10 GiB: lower `batch_size`"):
        check_device_memory(s, 128_256, [40] * 8, torch.device("cuda:0"), free=int(0.1 * 2**30))
    # through profile: refused before any forward pass, nothing written
    draft, target = toy_pair(V, seed=3)
    calls = []
    monkeypatch.setattr(R, "analysis_device", lambda lm: torch.device("cuda:0"))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: calls.append(device) or (100, 2**34))
    with pytest.raises(ValueError, match=r"above its free memory 0\.00 GiB"):
        profile(PROMPTS, out=tmp_path / "run", draft=draft, target=target, **SMALL)
    assert calls and not (tmp_path / "run").exists()


def test_a_node_with_too_few_tokens_is_refused_alike_on_both_routes():
    # nucleus sampling leaving one token at a node of depth 1 of a top-k tree that needs two children there (the
    # root has more): the same error on the device route (ranked on the laws' device) as on the host's
    draft, target = toy_pair(5, seed=0, closeness=0.2)
    s = Sampling(0.5, None, 0.5, "ties")
    plan = resolve_trees(["topk:branching(2,2)"])
    for on_device in (False, True):
        with pytest.raises(ValueError, match=r"needs 2 distinct children at node 1 \(rank path \(0,\)\), but the "
                                             r"draft's law there has only 1 tokens"):
            _trees_at(draft, target, [[4, 4]], plan, s, on_device)


def test_prompts_walked_together_share_one_pass_of_the_batched_quantities(tmp_path, monkeypatch):
    # laws on the (stand-in) accelerator and three prompts in one batch: alpha_k, the maximal coupling, k-Seq and
    # the token and block E[tau | X] rows computed once per position for the three prompts, every row within
    # 1e-12 relative of the host route's (the same per-row arithmetic), the costly quantities on the subsample still
    # per prompt
    import otspec.profile._collect as C
    import otspec.profile._quantities as Qm

    draft, target = toy_pair(6, seed=3)
    kw = dict(k_max=2, L_max=3, max_new_tokens=4, subsample=2, progress=False, batch_size=3,
              verifiers=["token", "optimal", "kseq", "multiround"], families=["token", "block", "block-onestep",
                                                                              "kseq"])
    prompts = [[0, 1], [2, 5], [3, 4]]
    profile(prompts, out=tmp_path / "host", draft=draft, target=target, **kw)
    calls = []
    alpha = Qm.alpha_k
    monkeypatch.setattr(Qm, "alpha_k", lambda P, *a, **k: calls.append(tuple(P.shape)) or alpha(P, *a, **k))
    monkeypatch.setattr(C, "analysis_device", lambda lm: torch.device("cpu"))
    profile(prompts, out=tmp_path / "device", draft=draft, target=target, **kw)
    assert calls == [(3, 3, 6)] * 4  # one call per position, the three prompts' (L, V) laws stacked
    a, b = _rows(tmp_path / "host"), _rows(tmp_path / "device")
    assert {c: v for c, v in a.items() if c != "value"} == {c: v for c, v in b.items() if c != "value"}
    assert {"multiround", "block", "block-onestep", "optimal"} <= set(a["name"])
    np.testing.assert_allclose(b["value"], a["value"], rtol=1e-12, atol=0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_host_route_trees_are_otspec_trees_construction(seed):
    # the host route ranks each node once as it expands (no second construction at every position): its top-k
    # universe and EAGLE-2 trees are otspec.tree.sample_tree's on the same laws, with many exact ties (integer
    # logits: ties go to the lower id), and an EAGLE-2 node with too few tokens of mass is refused by name
    from otspec.models import MarkovModel
    from otspec.tree import sample_tree

    V = 6
    draft, target = toy_pair(V, seed=seed)
    draft.fn.table = np.round(draft.fn.table)  # exact ties in every row
    e = np.exp(draft.fn.table - draft.fn.table.max(axis=-1, keepdims=True))
    Md = MarkovModel(e / e.sum(axis=-1, keepdims=True))
    plan = resolve_trees(["topk:branching(2,2)", "eagle2:3,2,5", "eagle2:2,3,6"], "branching(3,2,2)")
    s = Sampling(1.0, None, None, "ties")
    for ctxs in ([[1, 3, 0], [2, 2, 5]], [[4], [5]]):
        for ctx, got in zip(ctxs, _trees_at(draft, target, ctxs, plan, s, on_device=False)):
            want = sample_tree(plan.universe, Md, process="topk", prefix=tuple(ctx))
            assert got["universe"].tree.tokens.tolist() == want.tokens.tolist()
            for f in plan.eagle2:
                want = sample_tree(f.shape, Md, process="eagle2", prefix=tuple(ctx))
                assert got[f.label].tree.parents.tolist() == want.parents.tolist()
                assert got[f.label].tree.tokens.tolist() == want.tokens.tolist()
    draft.fn.table[:, 2:] = -np.inf  # two tokens of mass at every node (the draft's own law too), EAGLE-2 asks 3
    with pytest.raises(ValueError, match=r"'eagle2:2,3,6' needs top_k = 3 tokens of positive draft probability at "
                                         r"the node \(\), got 2"):
        _trees_at(draft, target, [[1, 3, 0]], resolve_trees(["eagle2:2,3,6"]), s, on_device=False)


# --------------------------------------------------------------------------- the text's quantities on the device
def _text_laws(seed: int, T: int = 9, V: int = 11):
    # peaked laws with exact ties and zeros, one row where the draft equals the target (a level kept at once)
    rng = np.random.default_rng(seed)
    P = rng.integers(0, 4, size=(T, V)).astype(np.float64) * rng.choice([1.0, 1.0, 0.0], size=(T, V))
    P[:, 0] += 1.0
    P /= P.sum(axis=1, keepdims=True)
    Q = rng.dirichlet(np.full(V, 0.3), size=T)
    Q[2] = P[2]
    y = np.array([int(rng.choice(V, p=Q[t])) for t in range(T)])
    y[4] = int(np.flatnonzero(P[4] == 0)[0]) if (P[4] == 0).any() else y[4]  # a text token the draft never drafts
    return P, Q, y


@pytest.mark.parametrize("seed", range(4))
def test_text_quantities_in_the_laws_namespace_equal_the_host_route(seed):
    # the ranks of the text tokens, their probabilities, the i.i.d. levels along the text and the emission tables
    # of static top-k trees, of i.i.d. trees with SpecInfer's rule and of the token-only schemes: numpy (the host
    # route, the levels by otspec.tree's node scan) and torch CPU tensors (the device route, batched over the text)
    # agree to 1e-12 relative; the ranks exactly
    from otspec.profile._renewal import emission_tables
    from otspec.profile._trees import (
        iid_emission_along,
        iid_levels_along,
        text_probs,
        text_ranks,
        topk_emission_along,
    )
    from otspec.tree import TreeShape

    P, Q, y = _text_laws(seed)
    Pt, Qt = torch.from_numpy(P), torch.from_numpy(Q)
    np.testing.assert_array_equal(text_ranks(Pt, y), text_ranks(P, y))
    want = np.array([int(np.flatnonzero(np.argsort(-P[t], kind="stable") == y[t])[0]) if P[t, y[t]] > 0 else -1
                     for t in range(len(y))])
    np.testing.assert_array_equal(text_ranks(P, y), want)  # the position in the full stable sort
    np.testing.assert_array_equal(text_probs(Qt, y), Q[np.arange(len(y)), y])
    for a, b in zip(iid_levels_along(Pt, Qt, 3), iid_levels_along(P, Q, 3)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=0)
    for shape in (TreeShape.chains(2, 3), TreeShape([[0], [1], [0, 0], [0, 1], [1, 0]])):
        for along in (topk_emission_along, iid_emission_along):
            np.testing.assert_allclose(along(shape, Pt, Qt, y), along(shape, P, Q, y), rtol=1e-12, atol=0)
    for scheme, ks in (("token", [1]), ("block-onestep", [1]), ("kseq", [1, 2])):
        a, b = emission_tables(scheme, Pt, Qt, y, ks, [1, 3]), emission_tables(scheme, P, Q, y, ks, [1, 3])
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_allclose(a[key], b[key], rtol=1e-12, atol=0)


def test_renewal_tables_on_the_device_move_no_whole_law_and_equal_the_host_route(tmp_path, monkeypatch):
    # a walk with the laws on the (stand-in) accelerator, static top-k and i.i.d. SpecInfer trees along the text and
    # the token-only schemes' renewal tables: the draft's path laws stay on the device (no (T, V) law reaches the
    # host from the renewal hook), and every row equals the host route's within 1e-12 relative (the i.i.d. trees
    # drawn from the host route's stream)
    import otspec.profile._collect as C
    import otspec.profile._renewal_hook as H
    import otspec.profile._trees_device as TD

    V = 9
    draft, target = toy_pair(V, seed=5)
    kw = dict(k_max=2, L_max=2, max_new_tokens=6, subsample=0, progress=False, verifiers=["token"],
              families=["token", "block-onestep"], trees=["topk:branching(2,2)", "iid:branching(2,1):specinfer"])
    prompts = [[0, 1], [2]]
    profile(prompts, out=tmp_path / "host", draft=draft, target=target, **kw)
    monkeypatch.setattr(C, "analysis_device", lambda lm: torch.device("cpu"))
    monkeypatch.setattr(TD, "device_generator", lambda rngs, device: None)
    moved, calls = [], []
    emission_rows, to_numpy = H.emission_rows, torch.Tensor.numpy

    def numpy(self, *args, **kw):
        moved.append(tuple(self.shape))
        return to_numpy(self, *args, **kw)

    def counting(*args, **kwargs):  # every tensor moved to the host inside the renewal hook
        calls.append(1)
        with monkeypatch.context() as m:
            m.setattr(torch.Tensor, "numpy", numpy)
            return emission_rows(*args, **kwargs)

    import otspec.profile._shard as S

    monkeypatch.setattr(S, "emission_rows", counting)
    profile(prompts, out=tmp_path / "device", draft=draft, target=target, **kw)
    a, b = _rows(tmp_path / "host"), _rows(tmp_path / "device")
    assert {c: v for c, v in a.items() if c != "value"} == {c: v for c, v in b.items() if c != "value"}
    e_names = {n for k, n in zip(a["kind"], a["name"]) if k == "e"}
    assert {"token", "block-onestep"} <= e_names and len(e_names) >= 4  # the schemes' and the trees' tables
    np.testing.assert_allclose(b["value"], a["value"], rtol=1e-12, atol=0)
    assert calls and moved and not [m for m in moved if m and m[-1] == V]  # (T,) values only, no law


def test_bench_profile_device_text_routes_agree(capsys):
    # the benchmark's renewal text measurement on a small vocabulary: both routes timed, the same values
    from tests.experiment import load_experiment

    load_experiment("bench_profile_device").text_run(None, 4, 1, V=60)
    out = capsys.readouterr().out
    assert "torch CPU" in out and "MISS" not in out
