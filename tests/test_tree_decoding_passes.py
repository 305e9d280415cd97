"""The tree decoders' shortened passes over the vocabulary against the straightforward computations, bit for bit.

* the draws without replacement on the CPU continue each row's running sums from the last drawn token
  (``_cumsum_after``) instead of summing the whole row again: the same sums, the same draws, the same flags, the
  laws left as they were, against the draw-by-draw computation (a full ``torch.cumsum`` per draw) on rows with
  zeros, ties, one-hot rows, rows of no mass and laws from ``-inf`` logits, with the draws read on the host
  (``_draws_wor_host``) and not;
* the steps' blocks handed on from one decode to the next on the CPU (``_BlockPool``): the pool's rules, and decodes
  with pooled blocks equal to decodes with fresh ones.

(The node rules in Python floats and the residual's branch from the running sums of its draw are held against the
route without host reads in tests/test_tree_decoding_lazy.py.)
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from otspec.decoding._tree_device import _cumsum_after, _draws_wor  # noqa: E402

torch.set_num_threads(1)


def _draws_wor_full(P, most: int, need, gen):
    """The draw-by-draw "cdf" rule: a full running sum of the row per draw, the drawn tokens set to 0 in a copy."""
    B, V = P.shape
    W = P.clone()
    top = torch.empty((B, most), dtype=torch.long)
    tots = torch.empty((B, most), dtype=P.dtype)
    for r in range(most):
        c = torch.cumsum(W, dim=-1)
        tot = c[:, -1:].contiguous()
        u = torch.rand((B, 1), dtype=torch.float64, generator=gen) * tot
        i = torch.searchsorted(c, u, right=True)
        last = torch.searchsorted(c, tot, right=False)
        pick = torch.where(i < V, i, last).clamp_(max=V - 1)
        top[:, r : r + 1], tots[:, r : r + 1] = pick, tot
        W.scatter_(1, pick, 0.0)
    short = ((tots == 0) & (torch.arange(most) < need[:, None])).any(-1)
    return top, short


@st.composite
def _rows(draw):
    """Non-negative float64 rows: dense, sparse (exact zeros), tied values, one-hot, no mass at all, or the softmax of
    logits with ``-inf`` entries."""
    B = draw(st.integers(1, 4))
    V = draw(st.integers(1, 40))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    mode = draw(st.sampled_from(["dense", "sparse", "ties", "one-hot", "zero", "-inf logits"]))
    if mode == "dense":
        P = rng.gamma(0.3, size=(B, V))
    elif mode == "sparse":
        P = np.where(rng.random((B, V)) < 0.4, rng.gamma(0.5, size=(B, V)), 0.0)
    elif mode == "ties":
        P = rng.integers(0, 3, size=(B, V)) / 7.0
    elif mode == "one-hot":
        P = np.zeros((B, V))
        P[np.arange(B), rng.integers(V, size=B)] = 1.0
    elif mode == "zero":
        P = np.zeros((B, V))
    else:
        logits = np.where(rng.random((B, V)) < 0.5, -np.inf, rng.normal(size=(B, V)) * 4)
        logits[:, 0] = 0.0
        P = torch.softmax(torch.from_numpy(logits), -1).numpy()
    if draw(st.booleans()):
        P = P / np.maximum(P.sum(1, keepdims=True), 1e-300)
    most = draw(st.integers(1, 5))
    need = rng.integers(1, most + 1, size=B)
    return torch.from_numpy(np.ascontiguousarray(P)), most, torch.from_numpy(need), draw(st.integers(0, 2**31 - 1))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=_rows(), in_place=st.booleans(), work=st.booleans(), host=st.booleans())
def test_draws_without_replacement_continuing_the_sums_equal_the_full_sums(case, in_place, work, host):
    """The draws, their flags and the laws after the draws, bit for bit as with a full running sum per draw (the picks
    read on the host, the sums continued, and not)."""
    P, most, need, seed = case
    before = P.clone()
    want = _draws_wor_full(P, most, need, torch.Generator().manual_seed(seed))
    got = _draws_wor(P, most, need, torch.Generator().manual_seed(seed), rule="cdf", in_place=in_place, host=host,
                     work={} if work else None)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert torch.equal(P, before)


@settings(max_examples=200, deadline=None)
@given(case=_rows(), data=st.data())
def test_running_sums_after_a_pick_equal_the_full_running_sums(case, data):
    """_cumsum_after: the running sums with the picked tokens set to 0, bit for bit as a full torch.cumsum."""
    P, _, _, _ = case
    B, V = P.shape
    picks = [data.draw(st.integers(0, V - 1)) for _ in range(B)]
    W = P.clone()
    c = torch.cumsum(W, -1)
    _cumsum_after(W, c, picks)
    Z = P.clone()
    Z[torch.arange(B), torch.tensor(picks)] = 0.0
    assert torch.equal(W, Z)
    assert torch.equal(c, torch.cumsum(Z, -1))


@pytest.mark.parametrize("V", [1_000, 128_256])
def test_running_sums_after_a_pick_at_a_real_vocabulary(V):
    """The same at a model's vocabulary size (rows of a softmax, picks at the ends and inside)."""
    g = torch.Generator().manual_seed(V)
    P = torch.softmax(torch.randn(4, V, generator=g, dtype=torch.float64) * 5, -1)
    picks = [0, V - 1, V // 3, int(torch.argmax(P[3]))]
    W = P.clone()
    c = torch.cumsum(W, -1)
    _cumsum_after(W, c, picks)
    P[torch.arange(4), torch.tensor(picks)] = 0.0
    assert torch.equal(c, torch.cumsum(P, -1))


def test_block_pool_hands_the_blocks_on_and_the_decodes_stay_the_same(monkeypatch):
    """A decode's blocks are handed to the next decode (the same memory), a pooled dict is given back once, by its
    taker only, a dict with a tensor off the CPU is dropped; decodes with pooled blocks equal decodes with fresh ones,
    bit for bit (the tokens and every logged prediction), whatever the decode before left in them."""
    import otspec.decoding as D
    from otspec.decoding import _tree_device as TD
    from tests.toy_lm import tiny_llama

    pool = TD._BlockPool(keep=1)
    work, lease = pool.take()
    work[("x",)] = torch.zeros(3)
    pool.give(work, object())  # not its taker: kept out
    assert pool.free == []
    pool.give(work, lease)
    assert pool.free == [work] and "lease" not in work
    pool.give(work, lease)  # given back once only
    assert pool.free == [work]
    again, lease2 = pool.take()
    assert again is work and pool.free == []
    again[("y",)] = torch.empty(2, device="meta")
    pool.give(again, lease2)  # a tensor off the CPU: dropped
    assert pool.free == []

    target, draft = tiny_llama(1, vocab=60), tiny_llama(2, vocab=60)
    names = ("tokens", "accepted", "predicted_accepted", "predicted_emitted", "predicted_reached", "alpha_first",
             "alpha_opt_first")

    def runs():
        out = []
        for tree in ("wor:branching(2,2):sequoia", "iid:branching(2,2):specinfer", "eagle2:3,2,6", "topk:branching(2,2)",
                     "wor:branching(3,1,1)"):
            for seed in (0, 1):
                r = D.speculative_decode([3, 1, 4], draft=draft, target=target, tree=tree, max_new_tokens=10,
                                         rng=seed, engine="torch", top_p=0.9 if seed else 1.0)
                out.append([np.asarray(getattr(r, n)) for n in names])
        return out

    monkeypatch.setattr(TD, "_POOL", TD._BlockPool(keep=0))  # fresh blocks every decode
    fresh = runs()
    monkeypatch.setattr(TD, "_POOL", TD._BlockPool(keep=1))
    pooled = runs()
    assert len(TD._POOL.free) == 1
    for a, b in zip(fresh, pooled):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
