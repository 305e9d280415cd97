"""otspec.profile at serving scale: per-run costs paid once, and the dask route with one worker per device."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("pyarrow")

from otspec.profile import profile, read_table, toy_pair  # noqa: E402
from otspec.profile._distributed import takes_device, worker_devices  # noqa: E402

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
