"""The tree verifiers' node rules and the tree families' ranking on the device route, batched: the same values bit for
bit as the loops they replace, in a bounded number of torch ops.

Independent routes:

* :func:`otspec.decoding._tree_device.node_rules_t` (every sibling's test, acceptance and running product at once,
  one pass over ``V`` per sibling rank) against the loop over siblings it replaces (:func:`_sibling_loop`, kept here
  verbatim as the reference): every output equal bit for bit, signed zeros included, on random trees with repeated
  tokens, sparse and tied laws, the target equal to the draft, draft rows of mass below 1, and EAGLE-2 layouts with
  rows of no child;
* :func:`otspec.decoding._tree_device.ranked_rows_t` (both routes, every ``k``) against a stable sort of the row on
  the host (ties by lower id), on rows with ties and zeros;
* the aten ops one call issues (a :class:`~torch.utils._python_dispatch.TorchDispatchMode`,
  ``experiments/bench_profile_ops.py``): the rules of the walk's i.i.d. family (a ``branching(4, 2)`` tree) and the
  rankings of its ranked families.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

import otspec.decoding._tree_device as TD  # noqa: E402
from otspec.decoding._tree_device import Eagle2LayoutT, TreeLayoutT, node_rules_t, ranked_rows_t  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))
import bench_profile_ops as O  # noqa: E402

sys.path.remove(str(ROOT / "experiments"))


def _sibling_loop(rule, lay, tokens, P_inner, Q_inner):
    """The node rules by a loop over sibling ranks, one child of every node per step (the route before batching)."""
    I, m = lay.kids.shape
    dev, dt = Q_inner.device, Q_inner.dtype
    x = tokens.index_select(0, lay.kids0.flatten()).reshape(I, m)
    x = torch.where(lay.valid, x, x[:, :1])
    dup = ((x[:, :, None] == x[:, None, :]) & lay.earlier & lay.valid[:, None, :]).any(-1) & lay.valid
    qx = torch.gather(Q_inner, 1, x)
    t = torch.zeros(I, dtype=dt, device=dev)
    px_raw = torch.gather(P_inner, 1, x)
    S = torch.ones(I, dtype=dt, device=dev)
    wor = rule == "sequoia"
    total = P_inner.sum(-1) if wor else None
    removed = torch.zeros(I, dtype=dt, device=dev)
    end_ell = torch.ones(I, dtype=dt, device=dev)
    w = torch.ones(I, dtype=dt, device=dev)
    acc_k = torch.zeros((I, m), dtype=dt, device=dev)
    px_all = torch.ones((I, m), dtype=dt, device=dev)
    tx_all = torch.zeros((I, m), dtype=dt, device=dev)
    for j in range(m):
        on = lay.valid[:, j]
        tx = (qx[:, j] - t * px_raw[:, j]).clamp(min=0.0) / S
        left = total - removed if wor else None
        if wor:
            px = torch.where(dup[:, j] | ~(left > 0), 0.0, px_raw[:, j] / torch.where(left > 0, left, 1.0))
        else:
            px = px_raw[:, j]
        a = torch.where(px > 0, torch.clamp(tx / torch.where(px > 0, px, 1.0), max=1.0), (tx > 0).to(dt))
        a = torch.where(on, a, 0.0)
        acc_k[:, j] = w * a
        w = w * (1.0 - a)
        px_all[:, j], tx_all[:, j] = torch.where(on, px, 1.0), torch.where(on, tx, 0.0)
        ell = left if wor else torch.ones_like(t)
        end_ell = torch.where(lay.last[:, j], ell, end_ell)
        if j < m - 1:
            on_j = on & ~lay.last[:, j]
            t_new = t + S / torch.where(ell > 0, ell, 1.0)
            S_new = torch.addcmul(Q_inner, P_inner, -t_new[:, None]).clamp_(min=0.0).sum(-1)
            move = on_j & (ell > 0) & (S_new > 0)
            t, S = torch.where(move, t_new, t), torch.where(move, S_new, S)
            if wor:
                removed = torch.where(on_j & ~dup[:, j], removed + px_raw[:, j], removed)
    acc = torch.ones(lay.n_out, dtype=dt, device=dev).index_copy(
        0, lay.kid_nodes, acc_k.flatten().index_select(0, lay.kid_cells))[: lay.n1]
    alive = torch.ones(lay.n_out, dtype=dt, device=dev).index_copy(0, lay.inner, w)[: lay.n1]
    return acc, alive, x, (t, S, end_ell), ("ratio", px_all, tx_all)


def _bits_equal(a, b) -> bool:
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_bits_equal(u, v) for u, v in zip(a, b))
    if not isinstance(a, torch.Tensor):
        return a == b
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if not a.is_floating_point():
        return torch.equal(a, b)
    same = (a == b) | (a.isnan() & b.isnan())
    return bool(same.all()) and torch.equal(torch.signbit(a), torch.signbit(b))


def _law(rng, V, mode):
    if mode == "ties":
        w = rng.integers(0, 3, size=V).astype(float)
    elif mode == "one-token":
        w = np.zeros(V)
    else:
        w = rng.gamma(0.5, size=V) * ((rng.random(V) < 0.5) if mode == "sparse" else 1.0)
    w[rng.integers(V)] += 1.0
    return w / w.sum()


@st.composite
def _trees(draw):
    """A random tree (any parents, small V: repeated tokens among siblings), its laws at the nodes with children."""
    V = draw(st.integers(1, 7))
    n = draw(st.integers(1, 14))
    seed = draw(st.integers(0, 2**31 - 1))
    mode = draw(st.sampled_from(["dense", "sparse", "ties", "one-token", "equal", "short"]))
    rng = np.random.default_rng(seed)
    parents = [-1] + [int(rng.integers(0, c)) for c in range(1, n + 1)]
    depth = [0] * (n + 1)
    for c in range(1, n + 1):
        depth[c] = depth[parents[c]] + 1
    inner = sorted(set(parents[1:]))
    P = np.stack([_law(rng, V, "dense" if mode in ("equal", "short") else mode) for _ in inner])
    Q = P.copy() if mode == "equal" else np.stack([_law(rng, V, mode if mode != "short" else "dense") for _ in inner])
    if mode == "short":  # draft rows of mass below 1 (Sequoia's "what is left" from the row's own total)
        P = P * rng.uniform(0.3, 1.0, size=(len(inner), 1))
    lay = TreeLayoutT(parents, depth, inner, "cpu")
    tokens = torch.from_numpy(np.concatenate([[0], rng.integers(V, size=n)]))
    return lay, tokens, torch.from_numpy(P), torch.from_numpy(Q)


@pytest.mark.parametrize("rule", ["specinfer", "sequoia"])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=_trees())
def test_batched_node_rules_equal_the_sibling_loop_bit_for_bit(rule, case):
    lay, tokens, P, Q = case
    want = _sibling_loop(rule, lay, tokens, P, Q)
    got = node_rules_t(rule, lay, tokens, P, Q)
    assert _bits_equal(got, want)
    again = node_rules_t(rule, lay, tokens, P, Q, work={})  # the level's pass written into a kept block
    assert _bits_equal(again, want)


@pytest.mark.parametrize("rule", ["specinfer", "sequoia"])
def test_batched_node_rules_on_eagle2_rows_without_children(rule):
    """An EAGLE-2 layout's slots kept without children and slots not kept (rows of no child, their scatters to the
    dump entry): the same outputs bit for bit as the loop, the level of a childless row included."""
    parents = torch.tensor([-1, 0, 0, 1, 1, 3])
    depth = torch.tensor([0, 1, 1, 2, 2, 3])
    slot_node = torch.tensor([0, 1, 2, -1, 3, -1, -1])
    kids = torch.tensor([[1, 2], [3, 4], [-1, -1], [-1, -1], [5, -1], [-1, -1], [-1, -1]])
    lay = Eagle2LayoutT(parents, depth, slot_node, kids, 3)
    rng = np.random.default_rng(3)
    for mode in ("dense", "ties", "sparse"):
        P = torch.from_numpy(np.stack([_law(rng, 5, mode) for _ in range(7)]))
        Q = torch.from_numpy(np.stack([_law(rng, 5, mode) for _ in range(7)]))
        tokens = torch.tensor([0, 1, 1, 2, 2, 4])
        assert _bits_equal(node_rules_t(rule, lay, tokens, P, Q), _sibling_loop(rule, lay, tokens, P, Q))


@pytest.mark.parametrize("by_maxima", [True, False])
@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), V=st.integers(1, 40), rows=st.integers(1, 4))
def test_ranked_rows_both_routes_are_the_stable_sort(by_maxima, seed, V, rows):
    """Every k on both routes (the passes of a row maximum forced for every k, or the keyed top-k for every k): the
    ids of a stable sort by decreasing value (ties by lower id) and their values, on rows with ties and zeros."""
    rng = np.random.default_rng(seed)
    R = rng.choice([0.0, 2.0**-9, 2.0**-8, 2.0**-7, 0.3], size=(rows, V))
    for k in range(1, V + 1):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(TD, "RANK_BY_MAXIMA", V if by_maxima else 0)
            ids, vals = ranked_rows_t(torch.from_numpy(R), k)
        want = np.argsort(-R, axis=1, kind="stable")[:, :k]
        np.testing.assert_array_equal(ids.numpy(), want)
        np.testing.assert_array_equal(vals.numpy(), np.take_along_axis(R, want, 1))


def _ops(fn) -> int:
    c = O.Counts()
    with O.counting(c):
        fn()
    return c.aten


def test_node_rules_and_ranking_ops_per_call():
    """aten ops of one call (measured 83 SpecInfer, 113 Sequoia on the i.i.d. family's branching(4, 2) tree; 19 a
    top-8, 10 a top-4; the loops over siblings issued 240 and 293, the ranking 31 and 26)."""
    parents = [-1, 0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    depth = [0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2]
    lay = TreeLayoutT(parents, depth, [0, 1, 2, 3, 4], "cpu")
    g = torch.Generator().manual_seed(0)
    P = torch.rand((5, 64), generator=g, dtype=torch.float64)
    Q = torch.rand((5, 64), generator=g, dtype=torch.float64)
    P, Q = P / P.sum(1, keepdim=True), Q / Q.sum(1, keepdim=True)
    tokens = torch.randint(0, 64, (13,), generator=g)
    assert _ops(lambda: node_rules_t("specinfer", lay, tokens, P, Q)) <= 90
    assert _ops(lambda: node_rules_t("sequoia", lay, tokens, P, Q)) <= 120
    R = torch.rand((12, 64), generator=g, dtype=torch.float64)
    assert _ops(lambda: ranked_rows_t(R[:1], 8)) <= 20
    assert _ops(lambda: ranked_rows_t(R, 4)) <= 11
