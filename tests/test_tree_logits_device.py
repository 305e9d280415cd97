"""``tree_logits`` with a batch of trees whose structure is a tensor: ``parents`` of shape ``(B, n + 1)`` (each row its
own tree, padded), the attention mask and positions built on the device with no host read, the logits those of the
same parents as an array, bit for bit on the same call."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from otspec.decoding import _models  # noqa: E402
from tests.test_decoding_device import _HostReads  # noqa: E402
from tests.test_tree_decoding_device import _tiny_llama  # noqa: E402
from tests.toy_lm import toy_target_draft  # noqa: E402

V = 11


def _forest(seed: int, B: int, n_max: int = 7):
    """``B`` random trees of different sizes padded to the largest: ``(B, m)`` parents and tokens (padding -1)."""
    r = np.random.default_rng(seed)
    sizes = r.integers(1, n_max + 1, size=B)
    m = int(sizes.max()) + 1
    parents = np.full((B, m), -1, dtype=np.int64)
    tokens = np.full((B, m), -1, dtype=np.int64)
    for b, n in enumerate(sizes.tolist()):
        for i in range(1, n + 1):
            parents[b, i] = int(r.integers(0, i))
            tokens[b, i] = int(r.integers(0, V))
    return parents, tokens


def _model(kind: str, monkeypatch):
    if kind == "callable":
        return toy_target_draft(V, seed=3)[0]  # second order: a node's logits read its parent's token too
    lm = _tiny_llama(V, 0, "sdpa" if kind == "hf-sdpa" else "eager")
    if kind == "hf-rows":
        monkeypatch.setattr(_models, "_tree_refusal", lambda model: "no 4-D mask (a stand-in)")
    return lm


def _contexts(lm, B: int, per_tree: bool):
    """A state holding one context (shared by the ``B`` trees) or ``B`` left-padded contexts of unequal lengths,
    and the pending tokens."""
    if not per_tree:
        st_ = lm.new_state()
        lm.logits(st_, torch.tensor([[0, 3]]))
        return st_, [1, 2]
    prompts = [[1 + b % 5, 3, 2, 7][: 2 + b % 3] for b in range(B)]
    width = max(map(len, prompts))
    st_ = lm.new_state(pad=[width - len(p) for p in prompts])
    lm.logits(st_, torch.tensor([[0] * (width - len(p)) + p for p in prompts]))
    return st_, np.array([[4 + b % 3] for b in range(B)])


@pytest.mark.parametrize("kind", ["hf-sdpa", "hf-eager", "hf-rows", "callable"])
@pytest.mark.parametrize("B", [1, 2, 4])
@pytest.mark.parametrize("per_tree", [False, True])
def test_device_parents_of_a_batch_of_trees_give_the_arrays_logits(kind, B, per_tree, monkeypatch):
    # trees of different shapes padded to the largest, one context or left-padded contexts of their own: the logits
    # of the tensor parents are the array parents' bit for bit (the same 4-D call; exact on the row route of a model
    # computing its rows alone, to float rounding on a transformer's row route, whose rows differ in length), the
    # padding nodes NaN alike, no host read inside the call, and the states alike afterwards
    lm = _model(kind, monkeypatch)
    tol = 1e-5 if kind == "hf-rows" else 0.0
    fb = None if kind in ("hf-sdpa", "hf-eager") else "rows"
    for seed in range(3):
        parents, tokens = _forest(seed, B)
        outs, states, reads = [], [], []
        for as_tensor in (False, True):
            st_, pending = _contexts(lm, B, per_tree)
            par = torch.from_numpy(parents.copy()) if as_tensor else parents
            with _HostReads() as mode:
                outs.append(lm.tree_logits(st_, par, torch.from_numpy(tokens.copy()), pending=pending, fallback=fb))
            reads.append(mode.reads)
            states.append(st_)
        # no read of the trees: only a padded state's own (its padding checked against the call, as for any call)
        assert reads[1] == reads[0] and (per_tree or not reads[1]), reads
        assert outs[1].shape == (B, parents.shape[1], V)
        assert torch.equal(torch.isnan(outs[1]).all(-1), torch.from_numpy((parents == -1) & (np.arange(
            parents.shape[1]) > 0)))
        torch.testing.assert_close(outs[1], outs[0], rtol=0, atol=tol, equal_nan=True)
        if tol == 0:
            assert torch.equal(torch.nan_to_num(outs[1]), torch.nan_to_num(outs[0]))
        assert states[0].length == states[1].length
        feed = torch.tensor([[5]] * B)  # the state holds B rows after a call on B trees
        torch.testing.assert_close(lm.logits(states[1], feed), lm.logits(states[0], feed), rtol=0, atol=tol)


@pytest.mark.parametrize("kind", ["hf-sdpa", "callable"])
def test_one_tensor_structure_shared_by_a_batch_of_tokens(kind, monkeypatch):
    # 1-D tensor parents with (B, n + 1) tokens: each row scored on the shared structure, as the array route does
    lm = _model(kind, monkeypatch)
    fb = None if kind == "hf-sdpa" else "rows"
    parents = np.array([-1, 0, 0, 1, 3])
    tokens = np.array([[-1, 4, 7, 2, 9], [-1, 1, 1, 5, 0], [-1, 10, 3, 3, 6]])
    outs = []
    for par in (parents, torch.from_numpy(parents.copy())):
        st_, pending = _contexts(lm, 3, False)
        outs.append(lm.tree_logits(st_, par, torch.from_numpy(tokens.copy()), pending=pending, fallback=fb))
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("kind", ["hf-sdpa", "hf-rows", "callable"])
def test_a_bad_parent_in_one_tree_of_a_batch_makes_its_node_and_descendants_nan(kind, monkeypatch):
    # tree 1's node 3 with its parent after it, itself, beyond the tree, or a padding node (node 2, whose other child
    # 6 is lost too): NaN there and at its descendants only; tree 0 untouched, equal to its logits alone
    lm = _model(kind, monkeypatch)
    fb = None if kind == "hf-sdpa" else "rows"
    tokens = torch.tensor([[-1, 4, 7, 2, 9, 5, -1], [-1, 4, 7, 2, 9, 5, 3]])
    base = [-1, 0, 0, 1, 1, 3, -1]
    alone = lm.tree_logits(_contexts(lm, 1, False)[0], torch.tensor(base), tokens[0], pending=[1, 2], fallback=fb)
    F, T = False, True
    cases = [([-1, 0, 0, 5, 1, 3, 2], [F, F, F, T, F, T, F]), ([-1, 0, 0, 3, 1, 3, 2], [F, F, F, T, F, T, F]),
             ([-1, 0, 0, 9, 1, 3, 2], [F, F, F, T, F, T, F]), ([-1, 0, -1, 2, 1, 3, 2], [F, F, T, T, F, T, T])]
    for row1, want in cases:
        st_, _ = _contexts(lm, 2, False)
        got = lm.tree_logits(st_, torch.tensor([base, row1]), tokens, pending=[1, 2], fallback=fb)
        nan = torch.isnan(got).all(-1).tolist()
        assert nan == [[F] * 6 + [T], want], (row1, nan)
        if kind != "hf-rows":
            assert torch.equal(torch.nan_to_num(got[0]), torch.nan_to_num(alone))


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from([1, 2, 4]), st.integers(1, 40))
def test_the_device_ancestors_and_depths_are_the_host_tables(seed, B, n_max):
    # pointer jumping on the device against the host's node-by-node tables (deep chains included: n_max up to 40)
    parents, tokens = _forest(seed, B, n_max)
    if seed % 3 == 0:  # chains: the deepest trees
        m = parents.shape[1]
        parents[0, 1:] = np.arange(m - 1)
        tokens[0, 1:] = 1
    host = _models._tree_batch(parents, tokens, [1], None, V)
    anc, depth, lost = _models._ancestors_on_device(torch.from_numpy(parents))
    assert torch.equal(anc, torch.from_numpy(host.anc))
    assert torch.equal(depth, torch.from_numpy(host.depth))
    assert torch.equal(lost, torch.from_numpy(~host.real))


def test_tensor_parents_are_refused_alike():
    lm = toy_target_draft(V, seed=3)[0]
    par, tok = torch.tensor([[-1, 0, 1], [-1, 0, 0]]), torch.tensor([[-1, 2, 3], [-1, 4, 5]])
    with pytest.raises(ValueError, match=r"`tokens` must have the shape of `parents` \(2, 3\), got \(3,\)"):
        lm.tree_logits(lm.new_state(), par, tok[0], pending=[1], fallback="rows")
    with pytest.raises(ValueError, match=r"`parents` as a tensor must have shape \(n\+1,\) \(one tree\) or \(B, n\+1\)"):
        lm.tree_logits(lm.new_state(), par[None], tok[None], pending=[1], fallback="rows")
    with pytest.raises(ValueError, match=r"`pending` must have shape \(t,\) or \(2, t\)"):
        lm.tree_logits(lm.new_state(), par, tok, pending=[[1], [2], [3]], fallback="rows")
    with pytest.raises(TypeError, match=r"`keep` needs the tree's structure on the host"):
        lm.tree_logits(lm.new_state(), par, tok, pending=[1], keep=[1, 1], fallback="rows")
    with pytest.raises(ValueError, match=r"above MAX_TREE_CELLS"):
        big = torch.full((70, 1001), -1)
        lm.tree_logits(lm.new_state(), big, big, pending=[1], fallback="rows")
