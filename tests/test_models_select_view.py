"""``HFCausalLM.select`` by strided views: the cache a gather and a crop would leave, bit for bit, and no more ops.

Evenly spaced rows (one row, or ``r0, r0 + s, ...``) and the first columns of a transformers ``DynamicCache`` are
kept by one ``as_strided`` view per key and value tensor (:func:`otspec.decoding._models._view_cache`); any other
rows by the cache's own gather. Checked against the tensors indexed by hand and against the next call's logits.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.toy_lm import tiny_llama  # noqa: E402

V, B, T0 = 24, 6, 5

CASES = [([2], 5), ([2], 3), ([0, 2, 4], 4), ([1, 4], 5), ([5], 1), (list(range(B)), 2), ([0, 1, 2], 5),
         ([3, 1], 4), ([0, 0], 3), ([4, 2, 0], 5), ([1, 2, 4], 2)]


def _state(lm):
    st = lm.new_state()
    g = torch.Generator().manual_seed(3)
    lm.logits(st, torch.randint(0, V, (B, T0), generator=g))
    return st


def _kv(state):
    return [(layer.keys, layer.values) for layer in state.cache.layers]


@pytest.mark.parametrize("rows,length", CASES)
def test_select_keeps_the_rows_and_columns_a_gather_keeps(rows, length):
    lm = tiny_llama(4, vocab=V)
    st = _state(lm)
    before = [(k.clone(), v.clone()) for k, v in _kv(st)]
    ref = copy.deepcopy(st)
    lm.select(st, rows, length)
    assert (st.batch, st.length) == (len(rows), length)
    idx = torch.tensor(rows)
    for (k, v), (k0, v0) in zip(_kv(st), before):
        for got, full in ((k, k0), (v, v0)):
            want = full[idx][:, :, :length]
            assert got.shape == want.shape and got.dtype == want.dtype
            assert torch.equal(got, want)
    # the next call on the kept state gives the logits of the same rows fed to a state gathered and cropped
    ref.cache.batch_select_indices(idx)
    ref.cache.crop(length - T0)
    ref.batch, ref.length = len(rows), length
    nxt = torch.arange(len(rows) * 2).reshape(len(rows), 2) % V
    a, b = lm.logits(st, nxt), lm.logits(ref, nxt)
    assert torch.equal(a, b)
    assert st.length == ref.length == length + 2


@pytest.mark.parametrize("rows,length,views", [([2], 3, True), ([0, 2, 4], 4, True), ([3, 1], 4, False),
                                               ([0, 0], 3, False), (list(range(B)), T0, None),
                                               (list(range(B)), 3, "crop")])
def test_select_views_evenly_spaced_rows_in_one_op_a_tensor(rows, length, views):
    from torch.utils._python_dispatch import TorchDispatchMode

    lm = tiny_llama(4, vocab=V)
    st = _state(lm)
    ptrs = [k.untyped_storage().data_ptr() for k, _ in _kv(st)]
    ops = []

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ops.append(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    with Ops():
        lm.select(st, rows, length)
    n = 2 * len(st.cache.layers)
    if views is None:  # every row, every column: nothing to do
        assert ops == []
    elif views == "crop":  # every row, the first columns: the cache's own crop, one view a tensor
        assert ops == ["aten.slice"] * n, ops
    elif views:  # one strided view per tensor, sharing the storage (no copy)
        assert ops == ["aten.as_strided"] * n, ops
        assert [k.untyped_storage().data_ptr() for k, _ in _kv(st)] == ptrs
    else:  # a gather per tensor (and a crop)
        assert ops.count("aten.index") == n, ops
