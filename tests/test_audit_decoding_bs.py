"""Audit of the decoders and the profile's entry points with other seeds, sizes and inputs than their own tests.

* The output law of :func:`otspec.decoding.speculative_decode` equals the target's: every registered lossless
  verifier the decoder accepts (chains: K and L; trees: each process and its lossless rules, on the device route
  and the host route), chi-square of the first tokens against the exact joint law by enumeration
  (:func:`otspec.decoding.exact_prefix_law`: plain target scoring, no verifier). Each test fails falsely with
  probability ``ALPHA_FAIL`` = 1e-4 (chi-square at that level; the default suite's 11 law tests together: under
  1.1e-3, the slow ones (58) under 5.8e-3).
* Seeds reproduce (same seed, same tokens) and no global random state is touched (torch's and numpy's).
* Inputs are not mutated.
* Bad input is refused before any model call, naming the parameter; the command line refuses before loading a
  model and writes nothing.
* The profile's values do not depend on its batch size (1, 2, 5).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import otspec.decoding as D  # noqa: E402
from otspec.decoding._verifiers import decoding_names  # noqa: E402
from otspec.testing import chi2_gof  # noqa: E402
from tests.test_tree_decoding import _counts  # noqa: E402
from tests.toy_lm import table_fn, toy_target_draft  # noqa: E402

torch.set_num_threads(1)
ALPHA_FAIL = 1e-4


def _lossless_names():
    from otspec._registry import get_verifier

    return [n for n in decoding_names() if get_verifier(n).lossless]


@pytest.fixture(scope="module")
def pair4():
    return toy_target_draft(4, seed=7)


@pytest.fixture(scope="module")
def pair3():
    return toy_target_draft(3, seed=11)


class _Counted:
    """A CallableLM whose function counts its calls (errors must come before any)."""

    def __init__(self, V: int, seed: int = 5):
        g = torch.Generator().manual_seed(seed)
        self.table = torch.randn(V, V, V, generator=g, dtype=torch.float64)
        self.calls = 0
        fn = table_fn(self.table)

        def counted(ids):
            self.calls += 1
            return fn(ids)

        self.lm = D.CallableLM(counted, V)


def _law_check(target, draft, prompt, m, runs, seed, **kw):
    """chi-square of the first ``m`` tokens of ``runs`` decodes against the target's exact law."""
    counts, law = _counts(target, draft, prompt, m, runs, seed, **kw)
    g = chi2_gof(counts, law, alpha_fail=ALPHA_FAIL)
    assert g.outside_support == 0, g
    return g


# --------------------------------------------------------------------------- chains: every lossless verifier
FAST_CHAINS = [("token", 1, 2), ("kseq", 2, 1), ("multiround", 3, 1), ("block", 1, 1),
               pytest.param("optimal", 2, 2, marks=pytest.mark.slow), pytest.param("block-onestep", 1, 2,
                                                                                  marks=pytest.mark.slow),
               pytest.param("khisti", 2, 1, marks=pytest.mark.slow)]


def _chain_grid():
    """Every lossless verifier the decoder accepts, at every K (1 for single-draft schemes) and L in (1, 2)."""
    return [pytest.param(n, K, L, marks=pytest.mark.slow, id=f"{n}-K{K}-L{L}")
            for n in _lossless_names()
            for K in ((1,) if n in ("token", "block", "block-onestep") else (1, 2, 3))
            for L in (1, 2)]


@pytest.mark.parametrize("verifier,K,L", FAST_CHAINS)
def test_chain_output_law_is_the_targets(pair4, verifier, K, L):
    """The first L + 1 tokens (a whole iteration, the bonus token included) at V = 4, seed 7."""
    target, draft = pair4
    g = _law_check(target, draft, [1, 2], L + 1, 500 if L + 1 == 2 else 1200, 20 + K, verifier=verifier, k=K, L=L)
    assert g.passed, (verifier, K, L, g)


@pytest.mark.parametrize("verifier,K,L", _chain_grid())
def test_chain_output_law_is_the_targets_every_k_and_L(pair3, verifier, K, L):
    target, draft = pair3
    g = _law_check(target, draft, [2], L + 1, 400 if L == 1 else 1000, 31 * K + L, verifier=verifier, k=K, L=L)
    assert g.passed, (verifier, K, L, g)


@pytest.mark.parametrize("kw", [dict(verifier="token", top_k=2), dict(verifier="kseq", k=2, top_p=0.7),
                                dict(verifier="token", temperature=0.6, engine="numpy")])
def test_chain_output_law_under_truncation_and_temperature(pair4, kw):
    target, draft = pair4
    assert _law_check(target, draft, [3], 2, 500, 77, L=1, **kw).passed


# --------------------------------------------------------------------------- trees
_SLOW = pytest.mark.slow
TREES = [("iid:[[0],[1],[0,0]]:specinfer", "auto"), pytest.param("iid:[[0],[1],[0,0]]:specinfer", "numpy", marks=_SLOW),
         ("wor:branching(2,1):sequoia", "auto"), pytest.param("wor:branching(2,1):sequoia", "numpy", marks=_SLOW),
         ("topk:[[0],[1],[0,0]]:target-only", "auto"), ("eagle2:2,2,3", "auto"),
         pytest.param("iid:branching(2,1):spectr-tree", "numpy", marks=_SLOW),
         pytest.param("iid:chains(2,2):gbv", "numpy", marks=_SLOW),
         pytest.param("wor:branching(2,1):traversal", "numpy", marks=_SLOW)]


@pytest.mark.parametrize("tree,engine", TREES)
def test_tree_output_law_is_the_targets(pair4, tree, engine):
    """Two tokens (depth-1 and depth-2 trees: a whole iteration, or its accepted path and the next) at V = 4."""
    target, draft = pair4
    kw = {} if engine == "auto" else {"engine": engine}
    g = _law_check(target, draft, [0, 3], 2, 500, 5, tree=tree, **kw)
    assert g.passed, (tree, engine, g)


@pytest.mark.slow
def test_spechub_tree_output_law_is_the_targets(pair3):
    target, draft = pair3
    g = _law_check(target, draft, [1], 2, 500, 9, tree=[(0,), (1,), (0, 0)], process="spechub")
    assert g.passed, g


# --------------------------------------------------------------------------- seeds and global state
CALLS = {
    "token (device route)": dict(verifier="token", L=3),
    "kseq (host route)": dict(verifier="kseq", k=2, L=2, engine="numpy"),
    "block": dict(verifier="block", L=2),
    "tree, device route": dict(tree="iid:branching(2,2):specinfer"),
    "tree, host route": dict(tree="wor:branching(2,1):traversal"),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_seeds_reproduce_and_no_global_random_state_is_touched(pair4, name):
    target, draft = pair4
    kw = CALLS[name]
    torch.manual_seed(123)
    np.random.seed(321)
    t_state, n_state = torch.random.get_rng_state(), np.random.get_state()
    runs = [D.speculative_decode([1, 2], draft=draft, target=target, max_new_tokens=12, rng=s, **kw).tokens
            for s in (4, 4, torch.Generator().manual_seed(9), torch.Generator().manual_seed(9))]
    np.testing.assert_array_equal(runs[0], runs[1])
    np.testing.assert_array_equal(runs[2], runs[3])
    g = torch.Generator().manual_seed(9)  # one generator, two runs: they differ from each other but replay
    a = D.speculative_decode([1, 2], draft=draft, target=target, max_new_tokens=12, rng=g, **kw).tokens
    b = D.speculative_decode([1, 2], draft=draft, target=target, max_new_tokens=12, rng=g, **kw).tokens
    np.testing.assert_array_equal(a, runs[2])
    g2 = torch.Generator().manual_seed(9)
    D.speculative_decode([1, 2], draft=draft, target=target, max_new_tokens=12, rng=g2, **kw)
    np.testing.assert_array_equal(D.speculative_decode([1, 2], draft=draft, target=target, max_new_tokens=12,
                                                       rng=g2, **kw).tokens, b)
    assert torch.equal(torch.random.get_rng_state(), t_state)
    n_after = np.random.get_state()
    assert n_after[0] == n_state[0] and np.array_equal(n_after[1], n_state[1]) and n_after[2:] == n_state[2:]


def test_autoregressive_seeds_reproduce_and_leave_global_state(pair4):
    target, _ = pair4
    t_state, n_state = torch.random.get_rng_state(), np.random.get_state()
    a = D.autoregressive_decode(target, [0], max_new_tokens=10, rng=3).tokens
    b = D.autoregressive_decode(target, [0], max_new_tokens=10, rng=3).tokens
    np.testing.assert_array_equal(a, b)
    assert torch.equal(torch.random.get_rng_state(), t_state)
    assert np.array_equal(np.random.get_state()[1], n_state[1])


@pytest.mark.slow
def test_autoregressive_output_law_is_the_targets(pair4):
    target, _ = pair4
    cells, law = D.exact_prefix_law(target, [2], 2)
    index = {c: i for i, c in enumerate(cells)}
    counts = np.zeros(len(cells), dtype=np.int64)
    gen = torch.Generator().manual_seed(17)
    for _ in range(600):
        counts[index[tuple(D.autoregressive_decode(target, [2], max_new_tokens=2, rng=gen).tokens.tolist())]] += 1
    assert chi2_gof(counts, law, alpha_fail=ALPHA_FAIL).passed


# --------------------------------------------------------------------------- inputs not mutated
def test_inputs_are_not_mutated(pair4):
    target, draft = pair4
    prompts = [[1, 2, 3], np.array([1, 2, 3]), torch.tensor([1, 2, 3]), torch.tensor([[1, 2, 3]])]
    opts = {"rho": 1.5}
    tree = [(0,), (1,), (0, 0)]
    for p in prompts:
        before = copy.deepcopy(p)
        D.speculative_decode(p, draft=draft, target=target, verifier="kseq", k=2, L=2, max_new_tokens=5, rng=0,
                             verifier_options=opts)
        D.speculative_decode(p, draft=draft, target=target, tree=tree, process="iid", max_new_tokens=5, rng=0)
        D.autoregressive_decode(target, p, max_new_tokens=3, rng=0)
        if isinstance(p, list):
            assert p == before
        else:
            assert (np.asarray(p) == np.asarray(before)).all() and np.asarray(p).shape == np.asarray(before).shape
    assert opts == {"rho": 1.5} and tree == [(0,), (1,), (0, 0)]


# --------------------------------------------------------------------------- bad input, before any model call
BAD = [
    (dict(k=0, verifier="kseq"), ValueError, "`k`"),
    (dict(k=-2, verifier="kseq"), ValueError, "`k`"),
    (dict(k=1.5, verifier="kseq"), (ValueError, TypeError), "`k`"),
    (dict(k=True, verifier="kseq"), (ValueError, TypeError), "`k`"),
    (dict(L=0), ValueError, "`L`"),
    (dict(L=2.0), (ValueError, TypeError), "`L`"),
    (dict(verifier="no-such-verifier"), ValueError, "no-such-verifier"),
    (dict(verifier="token", k=2), ValueError, "`k`"),
    (dict(max_new_tokens=0), ValueError, "`max_new_tokens`"),
    (dict(temperature=-1.0), ValueError, "`temperature`"),
    (dict(top_p=1.5), ValueError, "`top_p`"),
    (dict(engine="gpu"), ValueError, "`engine`"),
    (dict(eos_token_id=99), ValueError, "`eos_token_id`"),
    (dict(verifier="mentored"), ValueError, "D"),
    (dict(verifier="mentored", verifier_options={"D": -1.0}), ValueError, "`D`"),
    (dict(verifier="kseq", k=2, verifier_options={"rho": 0.5}), ValueError, "`rho`"),
    (dict(verifier="typical", verifier_options={"delta": "x"}), TypeError, "`delta`"),
    (dict(tree="iid:branching(2,2)", k=2), ValueError, "`k`"),
    (dict(tree="iid:branching(2,2)", L=2), ValueError, "`L`"),
    (dict(tree="nope:branching(2,2)"), ValueError, "process"),
    (dict(tree=[(0,), (1,)], process="nope"), ValueError, "`process`"),
    (dict(tree="topk:branching(40,30)"), ValueError, "1,?024"),
    (dict(tree="iid:branching(2,2):traversal"), ValueError, "allow_lossy"),
    (dict(process="iid"), ValueError, "`process`"),
    (dict(log_laws="yes"), TypeError, "`log_laws`"),
]


@pytest.mark.parametrize("kw,exc,match", BAD, ids=[str(b[0]) for b in BAD])
def test_bad_input_is_refused_before_any_model_call(kw, exc, match):
    t, d = _Counted(4, 1), _Counted(4, 2)
    with pytest.raises(exc, match=match):
        D.speculative_decode([1, 2], draft=d.lm, target=t.lm, **{"max_new_tokens": 4, "rng": 0, **kw})
    assert t.calls == 0 and d.calls == 0


@pytest.mark.parametrize("prompt,match", [([], "prompt"), ([4], "prompt"), ([-1], "prompt"), ("ab", "prompt"),
                                          ([[1], [2]], "prompt"), (None, "prompt")])
def test_bad_prompts_are_refused_before_any_model_call(prompt, match):
    t, d = _Counted(4, 1), _Counted(4, 2)
    with pytest.raises((ValueError, TypeError), match=match):
        D.speculative_decode(prompt, draft=d.lm, target=t.lm, max_new_tokens=4, rng=0)
    with pytest.raises((ValueError, TypeError), match=match):
        D.autoregressive_decode(t.lm, prompt, max_new_tokens=4, rng=0)
    assert t.calls == 0 and d.calls == 0


@pytest.mark.parametrize("rng", [np.random.default_rng(0), "seed", 1.5])
def test_a_bad_rng_is_refused_before_any_model_call(rng):
    t, d = _Counted(4, 1), _Counted(4, 2)
    with pytest.raises(TypeError, match="rng"):
        D.speculative_decode([1], draft=d.lm, target=t.lm, max_new_tokens=4, rng=rng)
    with pytest.raises(TypeError, match="rng"):
        D.autoregressive_decode(t.lm, [1], max_new_tokens=4, rng=rng)
    assert t.calls == 0 and d.calls == 0


def test_models_of_other_vocabularies_or_not_models_are_refused():
    t, d = _Counted(4, 1), _Counted(5, 2)
    with pytest.raises(ValueError, match="vocab"):
        D.speculative_decode([1], draft=d.lm, target=t.lm)
    with pytest.raises(TypeError, match="draft"):
        D.speculative_decode([1], draft=object(), target=t.lm)
    with pytest.raises(TypeError, match="target"):
        D.autoregressive_decode(object(), [1])
    assert t.calls == 0 and d.calls == 0


def test_as_model_bad_input_and_laws():
    t = _Counted(4, 1)
    with pytest.raises(TypeError, match="`lm`"):
        D.as_model(object())
    with pytest.raises(ValueError, match="context"):
        D.as_model(t.lm, context=[7])
    with pytest.raises(TypeError, match="`sampling`"):
        D.as_model(t.lm, sampling="greedy")
    m = D.as_model(t.lm)
    with pytest.raises(ValueError, match="context"):
        m.next_dist(())
    assert t.calls == 0
    m = D.as_model(t.lm, context=[1, 2])
    law = m.next_dist((3,))
    ref = torch.softmax(t.table[2, 3], -1).numpy()  # the table route: logits at the last position of (1, 2, 3)
    np.testing.assert_allclose(law, ref, rtol=0, atol=1e-15)
    assert law.dtype == np.float64 and abs(law.sum() - 1) < 1e-15


# --------------------------------------------------------------------------- the profile at batch sizes 1, 2, 5
@pytest.mark.slow
def test_profile_values_do_not_depend_on_the_batch_size(tmp_path):
    pa = pytest.importorskip("pyarrow")  # noqa: F841
    from otspec.profile import profile, read_table, toy_pair

    draft, target = toy_pair(5, seed=13)
    prompts = [[1, 2], [3], [0, 4, 1], [2, 2], [4]]
    tables = {}
    for B in (1, 2, 5):
        out = tmp_path / f"b{B}"
        profile(prompts, out=out, draft=draft, target=target, k_max=2, L_max=2, max_new_tokens=3, seed=4,
                batch_size=B, progress=False, families=["token", "block-onestep"], verifiers=["token", "kseq"],
                calibration_s=None)
        t = read_table(out).to_pandas()
        keep = [c for c in t.columns if "time" not in c and "seconds" not in c and c not in ("batch_size",)]
        tables[B] = t[keep].sort_values(["prompt", "position"] if "position" in keep else ["prompt"]) \
            .reset_index(drop=True)
    for B in (2, 5):
        a, b = tables[1], tables[B]
        assert list(a.columns) == list(b.columns)
        for c in a.columns:
            x, y = a[c].tolist(), b[c].tolist()
            assert len(x) == len(y), c
            for u, v in zip(x, y):
                if isinstance(u, float) or isinstance(v, float):
                    assert u == v or (np.isnan(u) and np.isnan(v)) or abs(u - v) <= 1e-12, (B, c, u, v)
                else:
                    assert np.array_equal(np.asarray(u), np.asarray(v)), (B, c)


# --------------------------------------------------------------------------- the command line
@pytest.fixture
def prompts_file(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"input_ids": [0, 1]}\n{"input_ids": [2]}\n')
    return f


# no_loading: the shared fixture of tests/conftest.py (any model loading fails the test; it returns the CLI module)


def _cli(cli, prompts, out, *extra):
    return cli.main(["profile", "--draft", "toy:3", "--target", "toy:3", "--prompts", str(prompts), "--out",
                     str(out), "--k-max", "2", "--L-max", "2", "--max-new-tokens", "3", "--no-progress", *extra])


@pytest.mark.parametrize("extra,match", [
    (["--draft-device", "meta"], r"`--draft-device` 'meta': toy models"),
    (["--draft-device", "cuda:7"], r"--draft-device"),
    (["--verifier-options", '{"mentored": {"D": -1}}'], r"`--verifier-options\['mentored'\]`: `D`"),
    (["--verifier-options", '{"kseq": {"rho": 0.5}}'], r"`--verifier-options\['kseq'\]`: `rho`"),
    (["--verifier-options", '{"typical": {"delta": "x"}}'], r"`--verifier-options\['typical'\]`"),
    (["--batch-size", "0"], r"`--batch-size`"),
    (["--k-max", "0"], r"`--k-max`"),
    (["--L-max", "65"], r"`--L-max`"),
    (["--verifiers", "nope"], r"`--verifiers`.*'nope'"),
    (["--trees", "iid:branching(40,30):specinfer"], r"`--trees\[0\]`.*1,024"),
    (["--device", "nope"], r"`--device`"),
])
def test_cli_refuses_before_loading_and_writes_nothing(tmp_path, prompts_file, no_loading, capsys, extra, match):
    import re

    out = tmp_path / "run"
    assert _cli(no_loading, prompts_file, out, *extra) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and re.search(match, err), err
    assert not out.exists()


def test_cli_refuses_an_empty_or_unwritable_out_before_loading(tmp_path, prompts_file, no_loading, capsys,
                                                               monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    for out in ("", "  "):
        assert _cli(no_loading, prompts_file, out) == 2
        assert "`--out` must name a folder" in capsys.readouterr().err
    afile = tmp_path / "afile"
    afile.write_text("")
    assert _cli(no_loading, prompts_file, afile / "sub" / "run") == 2
    assert "cannot be created" in capsys.readouterr().err and afile.read_text() == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(before + ["afile"])  # nothing written anywhere


def test_profile_api_refuses_an_unwritable_out_before_any_model_call(tmp_path):
    from otspec.profile import profile

    t, d = _Counted(4, 1), _Counted(4, 2)
    afile = tmp_path / "afile"
    afile.write_text("")
    for out, exc, match in ((afile / "x", ValueError, "cannot be created"), ("", ValueError, "must name a folder"),
                            (None, TypeError, "`out`")):
        with pytest.raises(exc, match=match):
            profile([[1, 2]], out=out, draft=d.lm, target=t.lm, k_max=1, L_max=1, max_new_tokens=2, progress=False)
    assert t.calls == 0 and d.calls == 0


def test_profile_settings_refuse_option_values_no_law_takes():
    from otspec.profile import ProfileSettings

    with pytest.raises(ValueError, match=r"`verifier_options\['mentored'\]`: `D` must be a non-negative"):
        ProfileSettings(verifier_options={"mentored": {"D": -0.5}})
    with pytest.raises(TypeError, match=r"`verifier_options\['ensemble'\]`: `w`"):
        ProfileSettings(verifier_options={"ensemble": {"w": "half"}})
    s = ProfileSettings(verifier_options={"mentored": {"D": 0.2}, "kseq": {"rho": 1.5}})  # values a law takes
    assert s.verifier_options == {"kseq": {"rho": 1.5}, "mentored": {"D": 0.2}}


# --------------------------------------------------------------------------- transformers' own assisted generation
def _hf_lm(seed: int, V: int = 6, scale: float = 6.0):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                                   bos_token_id=None, eos_token_id=None, pad_token_id=0)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model


@pytest.mark.parametrize("t_seed,d_seed,prompt,L", [(3, 11, [1, 4], 2), (13, 17, [5, 2, 3], 4), (21, 22, [0], 1),
                                                     (34, 84, [4, 4], 3)])
def test_greedy_decoders_equal_transformers_assisted_generation(t_seed, d_seed, prompt, L):
    """Other tiny random pairs than tests/test_transformers_clients.py's: transformers' plain and assisted greedy
    ``generate`` (``assistant_model=``, ``num_assistant_tokens=L``) against otspec's greedy chains and trees, token
    for token; with the torch global random state untouched by otspec."""
    target, draft = _hf_lm(t_seed), _hf_lm(d_seed)
    n = 16
    ids = torch.tensor([prompt])
    draft.generation_config.num_assistant_tokens = L
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    kw = dict(do_sample=False, max_new_tokens=n, pad_token_id=0, attention_mask=torch.ones_like(ids))
    with torch.no_grad():
        plain = target.generate(ids, **kw)[0, len(prompt):].tolist()
        assisted = target.generate(ids, assistant_model=draft, **kw)[0, len(prompt):].tolist()
    assert assisted == plain
    t, d = D.HFCausalLM(target), D.HFCausalLM(draft)
    state = torch.random.get_rng_state()
    assert D.autoregressive_decode(t, prompt, max_new_tokens=n, temperature=0, rng=1).tokens.tolist() == plain
    # seeds (3, 11) and (21, 22): every draft accepted; (13, 17): none; (34, 84): some (a scan of seeds)
    for kw in (dict(verifier="token", L=L), dict(verifier="multiround", k=2, L=L), dict(verifier="block", L=L),
               dict(verifier="block-onestep", L=L), dict(verifier="kseq", k=3, L=L, engine="numpy"),
               dict(tree="topk:branching(2,2):target-only"), dict(tree="eagle2:2,2,4")):
        res = D.speculative_decode(prompt, draft=d, target=t, max_new_tokens=n, temperature=0, rng=5, **kw)
        assert res.tokens.tolist() == plain, kw
    assert torch.equal(torch.random.get_rng_state(), state)


# --------------------------------------------------------------------------- the dask route
@pytest.mark.parametrize("client", [object(), "tcp://127.0.0.1:8786"])
def test_profile_refuses_a_client_that_is_not_one_before_building_models_or_writing(tmp_path, client):
    pytest.importorskip("pyarrow")
    from otspec.profile import profile, toy_pair

    built = []

    def models(device="cpu"):
        built.append(device)
        return toy_pair(4, seed=0)

    out = tmp_path / "run"
    for factory in (models, lambda: models()):
        with pytest.raises(TypeError, match="`client` must be a dask.distributed.Client"):
            profile([[0, 1]], out=out, models=factory, client=client, k_max=1, L_max=1, max_new_tokens=2,
                    progress=False)
    assert built == [] and not out.exists()
