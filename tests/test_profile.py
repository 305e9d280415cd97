"""otspec.profile: exact per-position quantities, storage, resumption, sharding, summaries, bad input."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("pyarrow")

import otspec  # noqa: E402
from otspec.decoding import CallableLM  # noqa: E402
from otspec.models import MarkovModel  # noqa: E402
from otspec.profile import ProfileSettings, load_prompts, profile, read_table, summarize, toy_pair  # noqa: E402
from otspec.profile._quantities import Builds, depth_quantities, expected_accepted  # noqa: E402

V = 3


def _markov(lm) -> MarkovModel:
    """The bigram CallableLM of toy_pair as an exact otspec.models.MarkovModel (order 1)."""
    W = lm.fn.table
    T = np.exp(W - W.max(axis=1, keepdims=True))
    return MarkovModel(T / T.sum(axis=1, keepdims=True), initial=[np.full(W.shape[0], 1.0 / W.shape[0])])


def _tree(pm: MarkovModel, qm: MarkovModel, ctx: tuple, X: np.ndarray):
    k, L = X.shape
    P = np.array([[pm.next_dist(ctx + tuple(X[r, :j])) for j in range(L)] for r in range(k)])
    Q = np.array([[qm.next_dist(ctx + tuple(X[r, :j])) for j in range(L + 1)] for r in range(k)])
    return P, Q


def _enumerated_tau(name, k, L, pm, qm, ctx):
    """E over every draft tree X ~ p^(k) of the profile's exact E[tau_L | X] (all L at once)."""
    total = np.zeros(L)
    for flat in itertools.product(range(V), repeat=k * L):
        X = np.array(flat).reshape(k, L)
        P, Q = _tree(pm, qm, ctx, X)
        w = np.prod([P[r, j, X[r, j]] for r in range(k) for j in range(L)])
        total += w * expected_accepted(name, k, Builds(X, P, Q, {}), L)["tau"]
    return total


@pytest.fixture(scope="module")
def pair():
    d, t = toy_pair(V, seed=3)
    return d, t, _markov(d), _markov(t)


@pytest.mark.parametrize("name,k", [("token", 1), ("kseq", 2), ("multiround", 2), ("optimal", 2), ("kseq", 1)])
def test_expected_tokens_equal_spectr_enumeration(pair, name, k):
    # independent route: otspec.spectr's exact recursion over (context, depth, surviving drafts)
    _, _, pm, qm = pair
    L = 2
    ctx = (1,)
    got = _enumerated_tau(name, k, L, pm, qm, ctx)
    for ell in (1, 2):
        want = otspec.spectr.block_efficiency(pm, qm, k, ell, verifier=name, prefix=ctx) - 1.0
        np.testing.assert_allclose(got[ell - 1], want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["block", "block-onestep"])
def test_block_expected_tokens_equal_block_enumeration(pair, name):
    _, _, pm, qm = pair
    L = 2
    got = _enumerated_tau(name, 1, L, pm, qm, ())
    for ell in (1, 2):
        want = otspec.block.expected_length(pm, qm, ell, name)
        np.testing.assert_allclose(got[ell - 1], want, rtol=0, atol=1e-12)


def test_depth_acceptance_matches_lp_and_builders(pair):
    _, _, pm, qm = pair
    rng = np.random.default_rng(0)
    X = rng.integers(0, V, size=(3, 2))
    P, Q = _tree(pm, qm, (0,), X)
    b = Builds(X, P, Q, {})
    opt = depth_quantities("optimal", (1, 2, 3), b, 2)
    ks = depth_quantities("kseq", (1, 2, 3), b, 2)
    mr = depth_quantities("multiround", (1, 2, 3), b, 2)
    for j in range(2):
        for k in (1, 2, 3):
            lp = otspec.otm_lp(P[0, j], Q[0, j], k).alpha  # the transport LP (HiGHS)
            np.testing.assert_allclose(opt[("acc", k)][j], lp, atol=1e-9)
            np.testing.assert_allclose(ks[("acc", k)][j], otspec.kseq(P[0, j], Q[0, j], k).acceptance(), atol=1e-12)
            want = otspec.multiround(P[0, j], Q[0, j], k).acceptance()
            np.testing.assert_allclose(mr[("acc", k)][j], want, atol=1e-12)


def test_lossy_gaps_are_exact(pair):
    _, _, pm, qm = pair
    X = np.array([[0, 1]])
    P, Q = _tree(pm, qm, (2,), X)
    out = depth_quantities("mentored", (1,), Builds(X, P, Q, {"mentored": {"D": 0.05}}), 2, lossless=False)
    for j in range(2):
        v = otspec.mentored_verifier(P[0, j], Q[0, j], 0.05)
        np.testing.assert_allclose(out[("acc", 1)][j], v.acceptance(), atol=1e-12)
        np.testing.assert_allclose(out[("tv", 1)][j], 0.5 * np.abs(v.output_law() - Q[0, j]).sum(), atol=1e-12)
        assert out[("kl", 1)][j] <= 0.05 + 1e-9


SMALL = dict(k_max=2, L_max=2, max_new_tokens=5, verifiers=["token", "kseq", "optimal"],
             families=["token", "kseq", "optimal", "block"], shard_size=2, subsample=1, progress=False)
PROMPTS = [[0, 1], [2], [1, 1, 0], [0], [2, 2]]


def _rows(out):
    t = read_table(out).sort_by([(c, "ascending") for c in ("prompt", "pos", "kind", "name", "k", "j", "m")])
    return {c: t[c].to_pylist() for c in t.column_names}


def test_rows_do_not_depend_on_sharding(tmp_path, pair):
    d, t, _, _ = pair
    profile(PROMPTS, out=tmp_path / "a", draft=d, target=t, **SMALL)
    profile(PROMPTS, out=tmp_path / "b", draft=d, target=t, **dict(SMALL, shard_size=1))
    assert _rows(tmp_path / "a") == _rows(tmp_path / "b")


def test_killed_run_resumes_to_the_same_tables(tmp_path, pair, monkeypatch):
    import otspec.profile._run as run_mod

    d, t, _, _ = pair
    full = profile(PROMPTS, out=tmp_path / "full", draft=d, target=t, **SMALL)
    assert full.shards_written == 3
    real = run_mod.write_shard
    calls = []

    def dying(out, s, cols):
        if calls:
            raise KeyboardInterrupt  # killed while the second shard is being written
        calls.append(s)
        real(out, s, cols)

    monkeypatch.setattr(run_mod, "write_shard", dying)
    with pytest.raises(KeyboardInterrupt):
        profile(PROMPTS, out=tmp_path / "cut", draft=d, target=t, **SMALL)
    assert sorted(p.name for p in (tmp_path / "cut").glob("shard-*")) == ["shard-00000.parquet"]
    monkeypatch.setattr(run_mod, "write_shard", real)
    again = profile(PROMPTS, out=tmp_path / "cut", draft=d, target=t, **SMALL)
    assert (again.shards_skipped, again.shards_written) == (1, 2)
    assert _rows(tmp_path / "cut") == _rows(tmp_path / "full")
    a, b = summarize(tmp_path / "cut"), summarize(tmp_path / "full")
    assert a.tokens_per_call == b.tokens_per_call and a.acceptance == b.acceptance


def test_summary_intervals_and_report(tmp_path, pair):
    pytest.importorskip("matplotlib")
    from otspec.profile import write_report

    d, t, _, _ = pair
    profile(PROMPTS * 2, out=tmp_path, draft=d, target=t, **SMALL)
    s = summarize(tmp_path, draft_cost=0.25)
    for e in list(s.tokens_per_call.values()) + list(s.acceptance.values()):
        assert e.lo <= e.value + 1e-12 and e.value <= e.hi + 1e-12
    # k = 1: every scheme is speculative sampling, the paired difference is exactly zero
    e = s.differences[(("optimal", 1, 2), ("token", 1, 2))]
    assert (e.value, e.lo, e.hi) == (0.0, 0.0, 0.0)
    # the optimum bounds k-Seq at every depth and k
    for (v, k, j), est in s.acceptance.items():
        if v == "kseq":
            assert est.value <= s.acceptance[("optimal", k, j)].value + 1e-12
    np.testing.assert_allclose(s.speedup[("token", 1, 2)].value, s.tokens_per_call[("token", 1, 2)].value / 1.5)
    path = write_report(tmp_path, draft_cost=0.25)
    text = path.read_text()
    assert "Tokens per target call" in text and (tmp_path / "speedup.png").is_file()


def test_cli_profile_and_report(tmp_path, capsys):
    from otspec.__main__ import main

    f = tmp_path / "p.jsonl"
    f.write_text('{"input_ids": [0, 1]}\n{"input_ids": [2]}\n')
    rc = main(["profile", "--draft", "toy:3", "--target", "toy:3", "--prompts", str(f), "--out", str(tmp_path / "r"),
               "--k-max", "2", "--L-max", "2", "--max-new-tokens", "3", "--verifiers", "token,optimal",
               "--families", "token", "--no-progress"])
    assert rc == 0
    assert main(["report", str(tmp_path / "r"), "--no-figures"]) == 0
    assert (tmp_path / "r" / "report.md").is_file()
    assert main(["profile", "--draft", "toy:3", "--target", "toy:3", "--prompts", str(f), "--out",
                 str(tmp_path / "r2"), "--verifiers", "optimall"]) == 2
    assert "did you mean 'optimal'" in capsys.readouterr().err


# --------------------------------------------------------------------------- bad input, before any forward pass
class _Counting:
    def __init__(self, V):
        self.calls = 0
        self.V = V

    def __call__(self, ids):
        self.calls += 1
        return torch.zeros(ids.shape + (self.V,))


@pytest.fixture
def counting():
    fd, ft = _Counting(4), _Counting(4)
    return fd, ft, CallableLM(fd, 4), CallableLM(ft, 4)


@pytest.mark.parametrize("kwargs,match", [
    (dict(verifiers=["kseqq"]), r"unknown verifier 'kseqq' \(did you mean 'kseq'\?\)"),
    (dict(families=["blok"]), r"unknown verifier 'blok' \(did you mean 'block'\?\)"),
    (dict(k_max=0), r"`k_max` must be"),
    (dict(L_max=0), r"`L_max` must be"),
    (dict(verifiers=["mentored"]), r"'mentored' needs options \['D'\]"),
    (dict(verifier_options={"kseq": {"bad": 1}}), r"accepts \['rho'\]"),
    (dict(context="teacher"), r"`context` must be one of"),
])
def test_bad_settings_raise_before_any_forward(tmp_path, counting, kwargs, match):
    fd, ft, d, t = counting
    with pytest.raises(ValueError, match=match):
        profile([[0]], out=tmp_path / "x", draft=d, target=t, **kwargs)
    assert fd.calls == ft.calls == 0 and not (tmp_path / "x").exists()


def test_bad_prompt_line_is_named(tmp_path, counting):
    fd, ft, d, t = counting
    f = tmp_path / "p.jsonl"
    f.write_text('{"input_ids": [0, 1]}\n\n{"input_ids": [0, 9]}\n')
    with pytest.raises(ValueError, match=r"p.jsonl, line 3 .*token ids in \[0, 4\), got 9"):
        profile(f, out=tmp_path / "x", draft=d, target=t)
    f.write_text('{"input_ids": [0, 1]}\n{"input_ids": [0, \n')
    with pytest.raises(ValueError, match=r"line 2 is not valid JSON"):
        profile(f, out=tmp_path / "x", draft=d, target=t)
    with pytest.raises(TypeError, match=r"pass `tokenizer="):
        load_prompts(["hello"], 4)
    with pytest.raises(ValueError, match=r"no reference text"):
        load_prompts([{"input_ids": [1]}], 4, context="reference")
    assert fd.calls == ft.calls == 0 and not (tmp_path / "x").exists()


def test_different_vocabularies_refused(tmp_path, counting):
    fd, _, d, _ = counting
    ft = _Counting(5)
    with pytest.raises(ValueError, match=r"share one vocabulary, got vocab_size 4 \(draft\) and 5 \(target\)"):
        profile([[0]], out=tmp_path / "x", draft=d, target=CallableLM(ft, 5))
    assert fd.calls == ft.calls == 0 and not (tmp_path / "x").exists()


def test_folder_with_other_settings_refused(tmp_path, pair):
    d, t, _, _ = pair
    small = dict(SMALL, max_new_tokens=2)
    profile([[0]], out=tmp_path, draft=d, target=t, **small)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    fd = _Counting(V)
    with pytest.raises(ValueError, match=r"holds a run with other settings \(k_max: 2 there, 3 here\)"):
        profile([[0]], out=tmp_path, draft=CallableLM(fd, V), target=t, **dict(small, k_max=3))
    with pytest.raises(ValueError, match=r"other prompts"):
        profile([[1]], out=tmp_path, draft=d, target=t, **small)
    assert fd.calls == 0 and {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_manifest_records_seeds_and_versions(tmp_path, pair):
    d, t, _, _ = pair
    profile(PROMPTS[:2], out=tmp_path, draft=d, target=t, **SMALL)
    man = json.loads((tmp_path / "manifest.json").read_text())
    kids = np.random.SeedSequence(0).spawn(2)
    assert man["seeds"]["per_prompt"] == [int(c.generate_state(1, np.uint64)[0]) for c in kids]
    assert man["packages"]["numpy"] == np.__version__
    assert man["models"]["target"]["vocab_size"] == V


def test_settings_doc_defaults():
    s = ProfileSettings(verifier_options={"mentored": {"D": 0.1}})
    assert "mentored" in s.verifiers and "lp" not in s.families and "mentored" in s.families
    assert s.ks("mentored") == (1,) and s.ks("kseq") == (1, 2, 3, 4)


def _two_workers(tmp_path, processes: bool):
    distributed = pytest.importorskip("distributed")
    import functools

    models = functools.partial(toy_pair, V, seed=3)  # picklable: each worker builds the pair once
    profile(PROMPTS, out=tmp_path / "local", models=models, **SMALL)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=processes,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        run = profile(PROMPTS, out=tmp_path / "dask", models=models, client=client, **SMALL)
    assert run.shards_written == 3
    assert _rows(tmp_path / "dask") == _rows(tmp_path / "local")


def test_distributed_two_workers_equal_in_process(tmp_path):
    _two_workers(tmp_path, processes=False)


@pytest.mark.slow
def test_distributed_two_worker_processes_equal_in_process(tmp_path):
    # two worker processes (about 30 s on 2 cores: each imports torch)
    _two_workers(tmp_path, processes=True)


def test_import_profile_imports_no_engine_and_no_matplotlib():
    import subprocess
    import sys

    code = ("import sys, otspec.profile; bad = [m for m in ('dask', 'distributed', 'ray', 'matplotlib') "
            "if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_renewal_estimator_recorded_and_exact_for_identical_models(tmp_path):
    # p = q: every draft is accepted, iterations emit L + 1 tokens, so a text of T tokens
    # takes ceil(T / (L + 1)) target calls; the per-position average gives L + 1
    d, t = toy_pair(V, seed=1, closeness=1.0)
    profile([[0], [1]], out=tmp_path, draft=d, target=t, k_max=2, L_max=3, max_new_tokens=10,
            verifiers=["token"], families=["token", "kseq"], renewal=["token", "kseq"], progress=False)
    s = summarize(tmp_path)
    for L in (1, 2, 3):
        np.testing.assert_allclose(s.renewal[("token", 1, L)].value, 10 / np.ceil(10 / (L + 1)), rtol=1e-12)
        np.testing.assert_allclose(s.renewal[("kseq", 2, L)].value, 10 / np.ceil(10 / (L + 1)), rtol=1e-12)
        np.testing.assert_allclose(s.tokens_per_call[("token", 1, L)].value, L + 1, rtol=1e-12)
        # m = L + 1 at every position: the Palm average is L + 1 whatever the starts, and the bias 0
        np.testing.assert_allclose(s.palm[("token", 1, L)].value, L + 1, rtol=1e-12)
        e = s.position_bias[("kseq", 2, L)]
        np.testing.assert_allclose([e.value, e.lo, e.hi], 0.0, atol=1e-12)


def test_costly_quantities_on_a_subsample_are_paired_on_it(tmp_path, pair):
    d, t, _, _ = pair
    profile(PROMPTS, out=tmp_path, draft=d, target=t, **dict(SMALL, subsample=3, max_new_tokens=6))
    tab = read_table(tmp_path)
    kseq_pos = {(p, q) for p, q, n, kind in zip(tab["prompt"].to_pylist(), tab["pos"].to_pylist(),
                                                   tab["name"].to_pylist(), tab["kind"].to_pylist())
                if n == "kseq" and kind == "tau"}
    assert kseq_pos == {(i, q) for i in range(len(PROMPTS)) for q in range(6) if (q + i) % 3 == 0}
    s = summarize(tmp_path)
    e = s.differences[(("kseq", 1, 2), ("token", 1, 2))]  # k = 1: the same verifier on the same positions
    np.testing.assert_allclose([e.value, e.lo, e.hi], 0.0, atol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("name,k", [("token", 1), ("kseq", 2)])
def test_renewal_prediction_agrees_with_real_decoding(tmp_path, name, k):
    # tokens per call of real decoding, T / E[iterations], against the profile's renewal estimate on
    # independent texts; |z| < 3 (false-failure rate 0.3 % per test for a correct estimator, seeds fixed)
    from otspec.decoding import speculative_decode

    d, t = toy_pair(4, seed=5, closeness=0.6)
    T, L, n = 12, 2, 300
    profile([[0]] * n, out=tmp_path, draft=d, target=t, k_max=k, L_max=L, max_new_tokens=T, verifiers=["token"],
            families=[name], renewal=[name], subsample=0, shard_size=100, progress=False)
    est = summarize(tmp_path).renewal[(name, k, L)]
    iters = np.array([speculative_decode([0], draft=d, target=t, verifier=name, k=k, L=L, max_new_tokens=T,
                                         rng=10_000 + i).iterations for i in range(n)], dtype=float)
    real = T / iters.mean()
    se_real = real * iters.std(ddof=1) / np.sqrt(n) / iters.mean()
    z = (est.value - real) / np.hypot(est.half_width / 1.96, se_real)
    assert abs(z) < 3, (est, real, se_real, z)


def test_every_public_name_resolves():
    import otspec.profile as P

    assert sorted(P.__all__) == sorted(set(P.__all__))
    for name in P.__all__:
        assert getattr(P, name) is not None


def test_greedy_profile(tmp_path, pair):
    # temperature 0: one-hot laws, every drawn draft is the draft's argmax, so every lossless i.i.d.
    # scheme accepts exactly when the argmaxes agree, whatever k; k distinct drafts are undefined (not recorded)
    d, t, _, _ = pair
    profile(PROMPTS, out=tmp_path, draft=d, target=t, **dict(SMALL, temperature=0.0, verifiers=["token", "optimal",
                                                                                              "greedy-drafts"]))
    s = summarize(tmp_path)
    for (f, _, L), e in s.tokens_per_call.items():
        if f != "block":
            np.testing.assert_allclose(e.value, s.tokens_per_call[("token", 1, L)].value, atol=1e-12)
    tab = read_table(tmp_path)
    acc = np.array([v for v, kind in zip(tab["value"].to_pylist(), tab["kind"].to_pylist()) if kind == "acc"])
    np.testing.assert_allclose(acc * (1 - acc), 0.0, atol=1e-12)
    assert ("greedy-drafts", 2, 1) not in s.acceptance and ("greedy-drafts", 1, 1) in s.acceptance


def _embed(A: np.ndarray, cols: np.ndarray, width: int) -> np.ndarray:
    out = np.zeros(A.shape[:-1] + (width,))
    out[..., cols] = A
    return out


def test_tokens_without_mass_change_no_quantity():
    # independent route for drop_null_columns: the same tree with tokens of zero mass everywhere inserted
    # between its tokens gives the same rows (every registered token verifier, every family) to 1e-12
    from otspec.multidraft import verifier_names
    from otspec.profile._collect import _Rows, position_rows

    rng = np.random.default_rng(5)
    k, L, n, width = 3, 2, 5, 13
    P = rng.dirichlet(np.full(n, 0.7), size=(k, L))
    Q = rng.dirichlet(np.full(n, 0.7), size=(k, L + 1))
    X = np.stack([[rng.choice(n, p=P[r, j]) for j in range(L)] for r in range(k)])
    X[1, 0] = X[0, 0]  # two drafts sharing a prefix: their nodes share laws, as in a real tree
    P[1, 1], Q[1, 1] = P[0, 1], Q[0, 1]
    Q[1, 0] = Q[0, 0]
    cols = np.sort(rng.choice(width, size=n, replace=False))
    names = [v for v in verifier_names(kind="token") if v not in ("without-replacement",)]
    s = ProfileSettings(k_max=k, L_max=L, verifiers=names, families=["token", "kseq", "optimal", "multiround",
                                                                    "block", "block-onestep"],
                        verifier_options={"mentored": {"D": 0.1}, "ensemble": {"w": 0.3}}, subsample=1)
    small, wide = _Rows(0), _Rows(0)
    position_rows(small, 0, X, P, Q, s, costly=True)
    position_rows(wide, 0, cols[X], _embed(P, cols, width), _embed(Q, cols, width), s, costly=True)
    assert small.cols["name"] == wide.cols["name"] and len(small.cols["value"]) > 50
    np.testing.assert_allclose(wide.cols["value"], small.cols["value"], rtol=0, atol=1e-12)


@pytest.mark.parametrize("scheme,k", [("token", 1), ("block-onestep", 1), ("kseq", 2), ("multiround", 2)])
def test_emission_tables_ignore_tokens_without_mass(scheme, k):
    from otspec.profile._renewal import emission_probs_along

    rng = np.random.default_rng(6)
    T, n, width = 6, 4, 11
    p, q = rng.dirichlet(np.ones(n), size=T), rng.dirichlet(np.ones(n), size=T)
    y = np.array([rng.choice(n, p=row) for row in q])
    cols = np.sort(rng.choice(width, size=n, replace=False))
    small = emission_probs_along(scheme, p, q, y, L=3, k=k)
    wide = emission_probs_along(scheme, _embed(p, cols, width), _embed(q, cols, width), cols[y], L=3, k=k)
    np.testing.assert_allclose(wide, small, rtol=0, atol=1e-12)


# --------------------------------------------------------------------------- fingerprints, limits, prompts (H6)
def _same_name_pair(d, t, draft_table=None):
    """The pair ``(d, t)`` rebuilt as new CallableLM objects under the same names (the draft with other tables)."""
    from otspec.profile._toy import BigramLogits

    table = d.fn.table.copy() if draft_table is None else draft_table
    return CallableLM(BigramLogits(table), V, name=d.name), CallableLM(BigramLogits(t.fn.table.copy()), V, name=t.name)


def test_killed_run_resumes_only_with_the_same_models(tmp_path, pair, monkeypatch):
    import otspec.profile._run as run_mod

    d, t, _, _ = pair
    small = dict(SMALL, max_new_tokens=2)
    profile(PROMPTS[:3], out=tmp_path / "full", draft=d, target=t, **small)
    real = run_mod.write_shard

    def dying(out, s, cols):
        real(out, s, cols)
        raise KeyboardInterrupt  # killed after its first shard

    monkeypatch.setattr(run_mod, "write_shard", dying)
    with pytest.raises(KeyboardInterrupt):
        profile(PROMPTS[:3], out=tmp_path / "cut", draft=d, target=t, **small)
    monkeypatch.setattr(run_mod, "write_shard", real)
    before = {p.name: p.read_bytes() for p in (tmp_path / "cut").iterdir()}
    assert sorted(before) == ["manifest.json", "shard-00000.parquet"]
    # other tables under the same name (and class, and vocabulary): refused, naming the model, nothing written
    other = d.fn.table + np.random.default_rng(0).standard_normal(d.fn.table.shape)
    d2, t2 = _same_name_pair(d, t, other)
    with pytest.raises(ValueError, match=r"holds a run with other models \(draft fingerprint: [0-9a-f]{12} there, "
                                         r"[0-9a-f]{12} here: another draft model, though named 'toy-draft-V3-s3"):
        profile(PROMPTS[:3], out=tmp_path / "cut", draft=d2, target=t2, **small)
    assert {p.name: p.read_bytes() for p in (tmp_path / "cut").iterdir()} == before
    # the same tables in new objects: resumes to the uninterrupted run's rows
    d3, t3 = _same_name_pair(d, t)
    again = profile(PROMPTS[:3], out=tmp_path / "cut", draft=d3, target=t3, **small)
    assert (again.shards_skipped, again.shards_written) == (1, 1)
    assert _rows(tmp_path / "cut") == _rows(tmp_path / "full")


def test_fingerprint_is_the_hash_of_the_probe_laws(pair):
    from otspec.profile._store import FINGERPRINT_DIGITS, _law_digest, fingerprint, probe_ids

    d, t, _, qm = pair
    fp = fingerprint(t)
    assert fp["probe"] == probe_ids(V) == [1, 0, 2, 1, 0, 2, 1, 0] and fp["weights_sha256"] is None
    # independent route: the exact bigram laws of the probe, rounded and hashed the same way
    laws = np.array([qm.next_dist((x,)) for x in fp["probe"]])
    assert fp["laws_sha256"] == _law_digest(laws)
    np.testing.assert_allclose(fp["top_probs"], np.sort(laws[-1])[::-1], rtol=10.0 ** -(FINGERPRINT_DIGITS - 1))
    assert fingerprint(_same_name_pair(d, t)[1]) == fp  # another object with the same tables


def test_fingerprints_do_not_depend_on_batching(tmp_path, pair):
    d, t, _, _ = pair
    opts = dict(k_max=2, L_max=1, max_new_tokens=1, verifiers=["token"], families=["token"], progress=False)
    profile([[0, 1], [2]], out=tmp_path / "a", draft=d, target=t, **opts)
    profile([[0, 1], [2]], out=tmp_path / "b", draft=d, target=t, batch_size=2, **opts)
    a, b = (json.loads((tmp_path / x / "manifest.json").read_text()) for x in "ab")
    assert a["models"] == b["models"] and a["models"]["draft"]["fingerprint"]["laws_sha256"]


def test_fingerprint_comparison_tolerates_float32_rounding_only():
    from otspec.profile._store import _same_fingerprint

    a = {"probe": [1, 0], "laws_sha256": "a" * 64, "top_ids": [2, 0, 1], "top_probs": [0.5, 0.3, 0.2],
         "weights_sha256": None}
    assert _same_fingerprint(a, dict(a))
    rounded = dict(a, laws_sha256="b" * 64, top_probs=[0.500001, 0.3, 0.199999])   # one digit moved
    assert _same_fingerprint(a, rounded)
    assert not _same_fingerprint(a, dict(rounded, top_probs=[0.51, 0.3, 0.19]))     # another model
    assert not _same_fingerprint(a, dict(rounded, top_ids=[0, 2, 1]))
    assert not _same_fingerprint(dict(a, weights_sha256="c" * 64), dict(a, weights_sha256="d" * 64))


@pytest.mark.slow
def test_fingerprint_of_a_transformer_hashes_its_weights():
    # about 6 s on 2 cores, most of it importing transformers' Llama
    transformers = pytest.importorskip("transformers")
    from otspec.decoding import HFCausalLM
    from otspec.profile._store import _same_fingerprint, fingerprint

    cfg = transformers.LlamaConfig(vocab_size=8, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1)

    def make():
        torch.manual_seed(0)
        return HFCausalLM(transformers.LlamaForCausalLM(cfg), name="tiny")

    a, b = make(), make()
    fa = fingerprint(a)
    assert fingerprint(b) == fa and len(fa["weights_sha256"]) == 64 and len(fa["top_ids"]) == 8
    with torch.no_grad():
        b.model.lm_head.weight[0, 0] += 1e-3
    fb = fingerprint(b)
    assert fb["weights_sha256"] != fa["weights_sha256"] and not _same_fingerprint(fa, fb)


@pytest.mark.slow
def test_fingerprint_is_stable_across_processes(pair):
    # a fresh interpreter (about 3 s: it imports torch) computes the same fingerprint
    import subprocess
    import sys

    from otspec.profile._store import fingerprint

    code = ("import json; from otspec.profile import toy_pair; from otspec.profile._store import fingerprint; "
            "print(json.dumps(fingerprint(toy_pair(3, seed=3)[1])))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == fingerprint(pair[1])


def test_a_model_failing_its_fingerprint_leaves_no_folder(tmp_path):
    def broken(ids):
        raise RuntimeError("broken model")

    _, t = toy_pair(4)
    with pytest.raises(RuntimeError, match="broken model"):
        profile([[0]], out=tmp_path / "x", draft=CallableLM(broken, 4), target=t, k_max=1, L_max=1)
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("kwargs,match", [
    (dict(k_max=10**12), r"`k_max` must be at most 256 \(MAX_K"),
    (dict(L_max=10**6), r"`L_max` must be at most 64 \(MAX_L"),
    (dict(k_max=128, L_max=16), r"`k_max` \* `L_max` = 128 \* 16 = 2048 draft tree nodes, above the limit "
                                r"MAX_TREE_NODES = 1024"),
    (dict(max_new_tokens=10**7), r"`max_new_tokens` must be at most 65536"),
    (dict(shard_size=10**7), r"`shard_size` must be at most 4096"),
    (dict(batch_size=10**4), r"`batch_size` \* `k_max` = 10000 \* 4 = 40000 rows per model call, above the limit "
                             r"MAX_CALL_ROWS = 4096"),
    (dict(max_new_tokens=65536, subsample=1), r"a shard would hold up to \d+ values \(1 prompts of up to \d+ values "
                                              r"each\), above the limit MAX_SHARD_VALUES"),
    (dict(verifiers=["without-replacement"], k_max=5), r"`verifiers`: 'without-replacement' draws k distinct "
                                                       r"drafts, so it needs k_max = 5 tokens"),
    (dict(families=["khisti"], k_max=3, top_p=0.9, verifier_options={}), None),
])
def test_limits_are_checked_before_any_model_call_and_any_write(tmp_path, counting, kwargs, match):
    fd, ft, d, t = counting
    if match is None:  # khisti's multisets at V = 4, k = 3 fit, with top_p too: it runs
        profile([[0]], out=tmp_path / "x", draft=d, target=t, max_new_tokens=1, verifiers=["token"],
                progress=False, **kwargs)
        return
    with pytest.raises(ValueError, match=match):
        profile([[0]], out=tmp_path / "x", draft=d, target=t, **kwargs)
    assert fd.calls == ft.calls == 0 and not (tmp_path / "x").exists()


def test_khisti_under_top_p_is_bounded_by_the_vocabulary():
    # the nucleus of a node is not known in advance: the bound is the vocabulary's (before: a run-time failure)
    s = ProfileSettings(top_p=0.9).for_vocabulary(49152)
    assert "khisti" not in s.verifiers and "pass top_k" in s.skipped["verifiers"]["khisti"]
    assert "optimal" in s.families  # its expected tokens' cost is bounded by the nucleus, as before
    with pytest.raises(ValueError, match=r"`verifiers`: 'khisti' enumerates"):
        ProfileSettings(top_p=0.9, verifiers=["khisti"]).for_vocabulary(49152)
    assert "khisti" in ProfileSettings(top_p=0.9, top_k=20).for_vocabulary(49152).verifiers


def test_manifest_positions_count_the_rows(tmp_path, pair):
    import pyarrow.compute as pc

    from otspec.profile._settings import values_per_prompt

    d, t, _, _ = pair
    opts = dict(k_max=2, L_max=2, max_new_tokens=7, stride=2, subsample=3, verifiers=["token", "kseq"],
                families=["token", "kseq", "block"], progress=False)
    profile(PROMPTS, out=tmp_path, draft=d, target=t, **opts)
    man = json.loads((tmp_path / "manifest.json").read_text())
    tab = read_table(tmp_path)

    def positions(name, kind):
        sel = tab.filter(pc.and_(pc.equal(tab["name"], name), pc.equal(tab["kind"], kind)))
        return set(zip(sel["prompt"].to_pylist(), sel["pos"].to_pylist()))

    pos = man["positions"]
    assert pos["every"] == ["token", "block"] and pos["subsample"] == ["kseq"] and pos["subsample_every"] == 3
    assert pos["acceptance"] == {"every": ["token"], "subsample": ["kseq"]}
    assert pos["profiled"] == len(positions("token", "tau")) == len(PROMPTS) * 4
    assert pos["subsampled"] == len(positions("kseq", "tau")) == len(positions("kseq", "acc"))
    assert positions("kseq", "tau") < positions("token", "tau")
    s = ProfileSettings(**{k: v for k, v in opts.items() if k != "progress"})
    per = read_table(tmp_path, timing=True).filter(pc.greater_equal(read_table(tmp_path, timing=True)["pos"], 0))
    counts = np.bincount(per["prompt"].to_numpy())
    assert counts.max() <= values_per_prompt(s, 7)  # the bound of MAX_SHARD_VALUES holds


def test_chat_template_is_one_user_message_with_the_generation_prompt():
    calls = []

    class Tok:
        chat_template = "{{ messages }}"

        def __call__(self, text, **kw):
            calls.append(("raw", text, kw))
            return {"input_ids": [1]}

        def apply_chat_template(self, messages, **kw):
            calls.append(("chat", messages, kw))
            return {"input_ids": [2, 3], "attention_mask": [1, 1]}

    got = load_prompts([{"prompt": "hi", "reference": "there"}], 5, tokenizer=Tok(), chat_template=True,
                       context="reference")
    assert got == [([2, 3], [1])]
    assert calls == [("chat", [{"role": "user", "content": "hi"}], {"add_generation_prompt": True, "tokenize": True}),
                     ("raw", "there", {"add_special_tokens": False})]
    assert load_prompts(["hi"], 5, tokenizer=Tok()) == [([1], None)]  # default: raw text

    class Plain:
        def __call__(self, text, **kw):
            return {"input_ids": [1]}

    with pytest.raises(ValueError, match=r"`chat_template=True` needs a tokenizer with a chat template"):
        load_prompts(["hi"], 5, tokenizer=Plain(), chat_template=True)
    with pytest.raises(TypeError, match=r"`chat_template` must be a bool, got str"):
        load_prompts(["hi"], 5, tokenizer=Tok(), chat_template="yes")


@pytest.mark.parametrize("V", [4097, 49_152, 128_256])
def test_khisti_at_one_draft_is_bounded_by_its_dense_plan(V):
    # at k = 1 the multisets are the V tokens, so the plan (sets x tokens) is V x V: 123 GiB at V = 128,256, which a
    # default profile with k_max = 1 once tried to allocate; now left out before any model call, refused when named
    s = ProfileSettings(k_max=1).for_vocabulary(V)
    assert "khisti" not in s.verifiers and "dense" in s.skipped["verifiers"]["khisti"]
    with pytest.raises(ValueError, match=r"`verifiers`: the selection plan of 'khisti' is a dense"):
        ProfileSettings(k_max=1, verifiers=["khisti"]).for_vocabulary(V)
    assert "khisti" in ProfileSettings(k_max=1, top_k=50).for_vocabulary(V).verifiers
    assert "khisti" in ProfileSettings(k_max=1).for_vocabulary(4096).verifiers  # 4096**2 entries: at the limit
