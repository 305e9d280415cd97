"""otspec.profile with ``batch_size > 1``: batches of prompts, left-padded to one length, walked in lockstep
give the unbatched tables.

On exact models (CallableLM functions computed row by row: the bigram pair
of ``toy_pair``, and a pair whose logits depend on the position, the first
and the previous token, so that a padding or position error shows) each
prompt's rows must be *identical* to the one-prompt-at-a-time walk: same
per-prompt generator, same order of draws. The state API (a state of ``b``
rows extended to a multiple of ``b``, ``select`` of several rows, left-padded
states) is checked on CallableLM exactly and on a tiny float32 transformers
model against unbatched calls to 1e-5 relative (plus 1e-6 absolute: logits
of size about 0.1).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("pyarrow")

import pyarrow.compute as pc  # noqa: E402

from otspec.decoding import CallableLM, HFCausalLM  # noqa: E402
from otspec.profile import ProfileSettings, profile, read_table, toy_pair  # noqa: E402
from otspec.profile._shard import buckets  # noqa: E402

V = 3
SMALL = dict(k_max=2, L_max=2, max_new_tokens=5, verifiers=["token", "kseq", "optimal"],
             families=["token", "kseq", "optimal", "block"], shard_size=8, subsample=1, progress=False)
# lengths 2, 1, 2, 1, 2, 3, 2, 1, 2: buckets {2: 5 prompts, 1: 3, 3: 1 (a bucket of one)}
PROMPTS = [[0, 1], [2], [1, 1], [0], [2, 2], [1, 0, 2], [0, 2], [1], [2, 0]]


@pytest.fixture(scope="module")
def pair():
    return toy_pair(V, seed=3)


class ContextLogits:
    r"""``ids (B, T) -> logits (B, T, V)``, :math:`\ell_t = W[x_t] + C[x_{t-1}] + \sin(t + 1) D[x_0]`: depends on
    the position and on the first and previous tokens, computed row by row with element-wise float64 operations
    (exact whatever the batch), so that a padding seen by the model or a shifted position changes the logits."""

    def __init__(self, vocab: int, seed: int):
        g = np.random.default_rng(seed)
        self.W, self.C, self.D = (torch.as_tensor(g.standard_normal((vocab + (i == 1), vocab))) for i in range(3))
        self.vocab = vocab

    def __call__(self, ids):
        prev = torch.cat([torch.full_like(ids[:, :1], self.vocab), ids[:, :-1]], dim=1)
        pos = torch.sin(torch.arange(1, ids.shape[1] + 1, dtype=torch.float64))[None, :, None]
        return self.W[ids] + self.C[prev] + pos * self.D[ids[:, :1]]


@pytest.fixture(scope="module")
def ctx_pair():
    return (CallableLM(ContextLogits(V, 1), V, name="ctx-draft"), CallableLM(ContextLogits(V, 2), V, name="ctx-target"))


class _NoPad(CallableLM):
    """A LanguageModel without left padding (its ``new_state`` takes no ``pad``)."""

    def new_state(self):
        return super().new_state()


def _no_pad(lm):
    return _NoPad(lm.fn, lm.vocab_size, name=lm.name)


def _time_counts(out):
    """Per prompt, the counts of draft steps and target calls (the seconds differ between runs)."""
    t = read_table(out, timing=True)
    t = t.filter(pc.and_(pc.equal(t["kind"], "time"), pc.equal(t["j"], 2)))
    return t.select(["prompt", "name", "value"]).to_pylist()


def _same_tables(a, b):
    ta, tb = read_table(a), read_table(b)
    assert ta.num_rows > 0
    assert ta.equals(tb)  # same rows, same order, bit-identical values
    assert _time_counts(a) == _time_counts(b)


def test_batches_group_equal_path_lengths_in_order_of_first_appearance():
    s = ProfileSettings(batch_size=2, max_new_tokens=4)
    items = [(p, None) for p in PROMPTS]
    assert buckets(items, s) == [[0, 1], [2, 3], [4, 5], [6, 7], [8]]  # left padding: any prompt lengths
    assert buckets(items, s, pad=False) == [[0, 2], [4, 6], [8], [1, 3], [7], [5]]  # length buckets
    # with reference text the path length matters: min(max_new_tokens, len(reference))
    r = ProfileSettings(batch_size=3, max_new_tokens=4, context="reference")
    items = [([0, 1], [1] * 5), ([2, 2], [0] * 4), ([1, 0], [2] * 3), ([0, 0], [1] * 6), ([1], [1] * 9)]
    assert buckets(items, r) == [[0, 1, 3], [4], [2]]
    assert buckets(items, r, pad=False) == [[0, 1, 3], [2], [4]]


# the first two cases run by default (about 2 s each); the edge settings with `make test-slow`
@pytest.mark.parametrize("batch_size,opts", [
    (4, {}),                                              # 5 prompts of length 2 -> batches 4 + 1
    (2, dict(shard_size=3)),                              # buckets cut by shard boundaries
    pytest.param(16, dict(k_max=1, L_max=3, stride=2), marks=pytest.mark.slow),  # one batch per bucket; every other position
    pytest.param(3, dict(k_max=3, L_max=1, temperature=0.0), marks=pytest.mark.slow),  # L_max = 1: state never grows to B k rows
    pytest.param(2, dict(top_k=2, seed=7), marks=pytest.mark.slow),
])
def test_batched_tables_equal_unbatched(tmp_path, ctx_pair, batch_size, opts):
    d, t = ctx_pair  # prompts of lengths 1 to 3 in one batch: left-padded
    kw = dict(SMALL, **opts)
    profile(PROMPTS, out=tmp_path / "one", draft=d, target=t, **kw)
    run = profile(PROMPTS, out=tmp_path / "many", draft=d, target=t, batch_size=batch_size, **kw)
    assert run.settings.batch_size == batch_size
    _same_tables(tmp_path / "one", tmp_path / "many")
    # the manifest does not depend on how the run executed: every entry the same but the machine's load when each
    # run started (provenance, recorded, never compared)
    one, many = (json.loads((tmp_path / f / "manifest.json").read_text()) for f in ("one", "many"))
    assert one.pop("machine").keys() == many.pop("machine").keys() and one == many


def test_batched_reference_context_equals_unbatched(tmp_path, ctx_pair):
    d, t = ctx_pair
    # path lengths 5, 5, 5, 4, 4 (max_new_tokens = 5): batches [0, 1, 2] and [3, 4], prompts of lengths 2, 1, 2 and 1, 2
    refs = [[1, 2, 0, 1, 1, 2], [0, 0, 1, 2, 2], [2, 1, 0, 0, 2, 2, 1], [1, 1, 1, 0], [2, 0, 1, 1]]
    prompts = [{"input_ids": p, "reference_ids": r} for p, r in zip(PROMPTS, refs)]
    kw = dict(SMALL, context="reference")
    profile(prompts, out=tmp_path / "one", draft=d, target=t, **kw)
    profile(prompts, out=tmp_path / "many", draft=d, target=t, batch_size=3, **kw)
    _same_tables(tmp_path / "one", tmp_path / "many")


def test_killed_batched_run_resumes_to_the_unbatched_tables(tmp_path, pair):
    d, t = pair
    kw = dict(SMALL, shard_size=3)
    profile(PROMPTS, out=tmp_path / "full", draft=d, target=t, **kw)
    run = profile(PROMPTS, out=tmp_path / "cut", draft=d, target=t, batch_size=3, **kw)
    assert run.shards_written == 3
    for s in (1, 2):  # what a run killed during its second shard leaves: whole shards only (atomic writes)
        (tmp_path / "cut" / f"shard-0000{s}.parquet").unlink()
    # resumed with another batch size: how a run executes is not part of its identity
    again = profile(PROMPTS, out=tmp_path / "cut", draft=d, target=t, batch_size=2, **kw)
    assert (again.shards_skipped, again.shards_written) == (1, 2)
    _same_tables(tmp_path / "full", tmp_path / "cut")


def test_batched_distributed_equals_in_process(tmp_path):
    distributed = pytest.importorskip("distributed")
    import functools

    models = functools.partial(toy_pair, V, seed=3)
    kw = dict(SMALL, shard_size=4)
    profile(PROMPTS, out=tmp_path / "local", models=models, **kw)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        profile(PROMPTS, out=tmp_path / "dask", models=models, client=client, batch_size=4, **kw)
    _same_tables(tmp_path / "local", tmp_path / "dask")


def test_manifest_settings_leave_out_batch_size(tmp_path, pair):
    d, t = pair
    profile(PROMPTS[:2], out=tmp_path, draft=d, target=t, batch_size=2, **SMALL)
    man = json.loads((tmp_path / "manifest.json").read_text())
    assert "batch_size" not in man["settings"] and man["settings"]["shard_size"] == 8


class _Counting:
    def __init__(self):
        self.calls = 0

    def __call__(self, ids):
        self.calls += 1
        return torch.zeros(ids.shape + (4,))


@pytest.mark.parametrize("value,exc,match", [
    (0, ValueError, r"`batch_size` must be an integer >= 1, got 0"),
    (-3, ValueError, r"`batch_size` must be an integer >= 1, got -3"),
    (2.0, TypeError, r"`batch_size` must be an integer, got the float 2.0"),
    ("4", TypeError, r"`batch_size` must be an integer, got str"),
])
def test_bad_batch_size_raises_before_any_forward(tmp_path, value, exc, match):
    fd, ft = _Counting(), _Counting()
    with pytest.raises(exc, match=match):
        profile([[0]], out=tmp_path / "x", draft=CallableLM(fd, 4), target=CallableLM(ft, 4), batch_size=value)
    assert fd.calls == ft.calls == 0 and not (tmp_path / "x").exists()


def test_cli_batch_size(tmp_path, capsys):
    from otspec.__main__ import main

    f = tmp_path / "p.jsonl"
    f.write_text('{"input_ids": [0, 1]}\n{"input_ids": [2, 2]}\n{"input_ids": [1]}\n')
    args = ["profile", "--draft", "toy:3", "--target", "toy:3", "--prompts", str(f), "--k-max", "2", "--L-max", "2",
            "--max-new-tokens", "3", "--verifiers", "token,optimal", "--families", "token", "--no-progress"]
    assert main(args + ["--out", str(tmp_path / "one")]) == 0
    assert main(args + ["--out", str(tmp_path / "many"), "--batch-size", "2"]) == 0
    _same_tables(tmp_path / "one", tmp_path / "many")
    assert main(args + ["--out", str(tmp_path / "bad"), "--batch-size", "0"]) == 2
    assert "error: `--batch-size` must be an integer >= 1, got 0" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


# --------------------------------------------------------------------------- the generalised state API
def _repeat_then_select(lm, prompts, drafts, k, nxt):
    """Batched: ``B`` contexts, ``k`` continuations each, then one row per context kept and extended."""
    st = lm.new_state()
    a = lm.logits(st, prompts)                                  # (B, n, V)
    b = lm.logits(st, drafts)                                   # (B k, t, V): row r continues context r // k
    lm.select(st, np.arange(prompts.shape[0]) * k + 1, prompts.shape[1] + 1)
    c = lm.logits(st, nxt)                                      # (B, 1, V)
    return a, b, c


def _one_by_one(lm, prompts, drafts, k, nxt):
    out = [[], [], []]
    for r in range(prompts.shape[0]):
        st = lm.new_state()
        out[0].append(lm.logits(st, prompts[r:r + 1])[0])
        out[1].append(lm.logits(st, drafts[r * k:(r + 1) * k]))  # a batch-1 state broadcast to k rows
        lm.select(st, 1, prompts.shape[1] + 1)
        out[2].append(lm.logits(st, nxt[r:r + 1])[0])
    return torch.stack(out[0]), torch.cat(out[1]), torch.stack(out[2])


def _inputs(V_, B=3, k=2, n=4, t=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, V_, (B, n), generator=g), torch.randint(0, V_, (B * k, t), generator=g), k,
            torch.randint(0, V_, (B, 1), generator=g))


def test_callable_lm_rows_repeat_and_select_exactly():
    d, _ = toy_pair(5, seed=1)
    args = _inputs(5)
    for x, y in zip(_repeat_then_select(d, *args), _one_by_one(d, *args)):
        assert torch.equal(x, y)
    st = d.new_state()
    d.logits(st, torch.tensor([[0, 1], [2, 3]]))
    d.logits(st, torch.tensor([[4], [4], [4], [4]]))              # each of 2 rows repeated twice
    d.select(st, [3, 0], 3)                                     # kept in the order given
    assert st.ids.tolist() == [[2, 3, 4], [0, 1, 4]]


def _tiny_llama(seed, vocab=11):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(cfg).eval()


def test_hf_batched_rows_equal_unbatched_to_1e_5():
    lm = HFCausalLM(_tiny_llama(0))
    args = _inputs(11)
    for x, y in zip(_repeat_then_select(lm, *args), _one_by_one(lm, *args)):
        assert x.dtype == torch.float32
        np.testing.assert_allclose(x.numpy(), y.numpy(), rtol=0, atol=1e-5)
    # rows kept out of order and repeated, then truncated: the cache follows
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    st = lm.new_state()
    lm.logits(st, ids)
    lm.select(st, [1, 1, 0], 2)
    got = lm.logits(st, torch.tensor([[7], [8], [9]]))[:, 0]
    with torch.no_grad():
        want = lm.model(torch.tensor([[4, 5, 7], [4, 5, 8], [1, 2, 9]])).logits[:, -1]
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=0, atol=1e-5)
    assert (st.batch, st.length) == (3, 3)


@pytest.mark.parametrize("make", ["callable", "hf"])
def test_bad_rows_and_batches_raise(make):
    lm = toy_pair(5)[0] if make == "callable" else HFCausalLM(_tiny_llama(0, vocab=5))
    st = lm.new_state()
    lm.logits(st, torch.tensor([[0, 1], [2, 3]]))
    with pytest.raises(ValueError, match=r"a state of batch 2 cannot be extended with 3 rows \(a multiple of 2\)"):
        lm.logits(st, torch.zeros((3, 1), dtype=torch.long))
    with pytest.raises(ValueError, match=r"`row` must be a non-empty sequence of ints in \[0, 2\), got \[0, 2\]"):
        lm.select(st, [0, 2], 1)
    with pytest.raises(ValueError, match=r"`row` must be a non-empty sequence of ints in \[0, 2\), got \[\]"):
        lm.select(st, [], 1)
    with pytest.raises(ValueError, match=r"`row` must lie in \[0, 2\), got 2"):
        lm.select(st, 2, 1)
    with pytest.raises(TypeError, match=r"`row` must be an int or a sequence of ints, got float"):
        lm.select(st, 1.5, 1)


def test_hf_profile_batched_matches_unbatched(tmp_path):
    # float32 transformer kernels: batched logits agree to rounding, so the sampled paths coincide here and
    # every exact quantity agrees to float32 precision (1e-5 relative on laws of 11 tokens)
    d, t = HFCausalLM(_tiny_llama(1), name="d"), HFCausalLM(_tiny_llama(2), name="t")
    prompts = [[1, 2, 3], [4, 5, 6], [7], [8, 9, 10], [0]]
    kw = dict(SMALL, max_new_tokens=4)
    assert buckets([(p, None) for p in prompts], ProfileSettings(batch_size=3)) == [[0, 1, 2], [3, 4]]  # padded
    profile(prompts, out=tmp_path / "one", draft=d, target=t, **kw)
    profile(prompts, out=tmp_path / "many", draft=d, target=t, batch_size=3, **kw)
    a, b = read_table(tmp_path / "one"), read_table(tmp_path / "many")
    for c in ("prompt", "pos", "kind", "name", "k", "j", "m"):
        assert a[c].to_pylist() == b[c].to_pylist()
    np.testing.assert_allclose(b["value"].to_numpy(), a["value"].to_numpy(), rtol=1e-5, atol=1e-6)
    assert _time_counts(tmp_path / "one") == _time_counts(tmp_path / "many")


def test_models_without_padding_batch_by_length_buckets(tmp_path, ctx_pair):
    from otspec.profile._collect import profile_bucket

    d, t = ctx_pair
    kw = dict(SMALL, max_new_tokens=3)
    profile(PROMPTS, out=tmp_path / "one", draft=d, target=t, **kw)
    profile(PROMPTS, out=tmp_path / "many", draft=_no_pad(d), target=_no_pad(t), batch_size=4, **kw)
    _same_tables(tmp_path / "one", tmp_path / "many")
    s = ProfileSettings(k_max=2, L_max=2, max_new_tokens=3, context="reference")
    with pytest.raises(ValueError, match=r"lengths \[2, 1\] need left padding, which `target` \(_NoPad\) does not"):
        profile_bucket(d, _no_pad(t), [[0, 1], [2]], [[0] * 3, [1] * 3], s, [0, 1])
    with pytest.raises(ValueError, match=r"must share their path length, got path lengths \[2, 3\]"):
        profile_bucket(d, t, [[0], [2, 1]], [[0] * 5, [1] * 2], s, [0, 1])


# ----------------------------------------------------------------------------- left-padded states
PADDED = [[3, 1, 4, 1], [5, 9], [2, 6, 5]]  # lengths 4, 2, 3: padding 0, 2, 1


def _padded_walk(lm, V_):
    """Pairs (batched, alone) of logits along a walk of a left-padded state: the prompts, ``k = 2`` drafts of 2
    tokens per prompt, rows kept out of order and cut, a row cut inside its padding, one more token each."""
    g = torch.Generator().manual_seed(5)
    pad = [4 - len(p) for p in PADDED]
    ids = torch.tensor([[0] * a + p for a, p in zip(pad, PADDED)])
    drafts = torch.randint(0, V_, (6, 2), generator=g)
    nxt = torch.randint(0, V_, (3, 2), generator=g)
    st = lm.new_state(pad=pad)
    out = []
    got = lm.logits(st, ids)
    out += [(got[b, a:], lm.logits(lm.new_state(), torch.tensor([p]))[0]) for b, (a, p) in enumerate(zip(pad, PADDED))]
    got = lm.logits(st, drafts)                                   # rows 2b, 2b + 1 continue prompt b
    for r in range(6):
        alone = lm.new_state()
        lm.logits(alone, torch.tensor([PADDED[r // 2]]))
        out.append((got[r], lm.logits(alone, drafts[r:r + 1])[0]))
    keep = [5, 0, 2]                                              # prompt 2's second draft, prompt 0's first, ...
    lm.select(st, keep, 5)                                        # ... each with its first draft token
    got = lm.logits(st, nxt)
    for i, r in enumerate(keep):
        full = PADDED[r // 2] + [int(drafts[r, 0])] + nxt[i].tolist()
        out.append((got[i], lm.logits(lm.new_state(), torch.tensor([full]))[0, -2:]))
    lm.select(st, [2], 1)                                         # prompt 1 (padding 2) cut to 1 column: padding only
    got = lm.logits(st, nxt[:1])
    out.append((got[0], lm.logits(lm.new_state(), nxt[:1])[0]))
    return out, st


def test_callable_lm_padded_rows_equal_each_prompt_alone_exactly():
    lm = CallableLM(ContextLogits(11, 1), 11)
    pairs, st = _padded_walk(lm, 11)
    for got, want in pairs:
        assert torch.equal(got, want)
    assert st.pad.tolist() == [1]                                 # the kept padding column


def _tiny_gpt2(seed, vocab=11):
    """Absolute position embeddings (a Llama's rotary ones ignore a shift of every position of a row)."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(vocab_size=vocab, n_embd=16, n_layer=2, n_head=2, n_positions=64,
                                  initializer_range=0.2, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(seed)
    return transformers.GPT2LMHeadModel(cfg).eval()


@pytest.mark.parametrize("make", [_tiny_llama, _tiny_gpt2])
def test_hf_padded_rows_equal_each_prompt_alone_to_1e_5(make):
    lm = HFCausalLM(make(0))
    seen = []
    lm.model.register_forward_pre_hook(lambda m, a, kw: seen.append((kw.get("attention_mask"), kw.get("position_ids"),
                                                                    kw["input_ids"].shape)), with_kwargs=True)
    pairs, st = _padded_walk(lm, 11)
    for got, want in pairs:
        assert got.dtype == torch.float32
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    batched = [s for s in seen if s[0] is not None]               # every call on the padded state: mask + positions
    assert [tuple(m.shape) for m, _, _ in batched] == [(3, 4), (6, 6), (3, 7), (1, 3)]
    assert batched[0][0].tolist() == [[1, 1, 1, 1], [0, 0, 1, 1], [0, 1, 1, 1]]
    assert batched[0][1].tolist() == [[0, 1, 2, 3], [0, 0, 0, 1], [0, 0, 1, 2]]
    assert batched[2][1].tolist() == [[4, 5], [5, 6], [3, 4]]     # positions counted from each row's first token
    assert batched[3][1].tolist() == [[0, 1]]
    alone = [s for s in seen if s[0] is None]                     # the unpadded calls pass neither
    assert len(alone) == len(seen) - 4 and all(s[1] is None for s in alone)
    st = lm.new_state(pad=[0, 0])                                 # no row padded: the unpadded path, batch 2
    lm.logits(st, torch.tensor([[1, 2], [3, 4]]))
    assert seen[-1][0] is None and st.pad is None and st.batch == 2


@pytest.mark.parametrize("make", ["callable", "hf"])
def test_bad_padding_raises(make):
    lm = toy_pair(5)[0] if make == "callable" else HFCausalLM(_tiny_llama(0, vocab=5))
    for pad, exc, match in [
        ([-1, 0], ValueError, r"`pad` must be a non-empty sequence of ints >= 0 \(one per row\), got \[-1, 0\]"),
        ([], ValueError, r"`pad` must be a non-empty sequence of ints >= 0 \(one per row\), got \[\]"),
        ([1.0], ValueError, r"got \[1.0\]"),
        (3, TypeError, r"`pad` must be a sequence of ints \(one per row\), got int"),
        ("ab", TypeError, r"`pad` must be a sequence of ints \(one per row\), got str"),
    ]:
        with pytest.raises(exc, match=match):
            lm.new_state(pad=pad)
    st = lm.new_state(pad=[2, 0])
    with pytest.raises(ValueError, match=r"`input_ids` must reach past every row's padding: a state of 0 columns "
                                         r"padded by up to 2 tokens needs t > 2 new columns, got t = 2"):
        lm.logits(st, torch.zeros((2, 2), dtype=torch.long))
    with pytest.raises(ValueError, match=r"a state of batch 2 cannot be extended with 3 rows"):
        lm.logits(st, torch.zeros((3, 3), dtype=torch.long))
    assert st.pad.tolist() == [2, 0]                              # a refused call changes nothing
