"""Every public entry point of otspec.testing takes any array-like a user holds, and leaves it as it was.

Kinds: a plain float64 array (the reference), a numpy view of a torch tensor (does not own its memory:
numpy refuses to make it writeable again once read-only), torch tensors (with and without grad), memory
maps (writeable and read-only), a read-only array, a strided view, a list, float32. Each call must give
the result of the plain float64 array (the laws are dyadic, so float32 holds them exactly) and leave the
caller's object unchanged: values, dtype, and the flags (writeable, owndata, contiguity).
"""

from __future__ import annotations

from dataclasses import astuple

import numpy as np
import pytest

from otspec.models import MemorylessModel
from otspec.testing import (
    StepError,
    check_block_sampler,
    check_sampler,
    chi2_gof,
    detectable_tv,
    processed_law,
    sample_size,
    seed_for,
)

torch = pytest.importorskip("torch")

P = np.array([0.5, 0.25, 0.125, 0.125])  # dyadic: exact in float32
Q = np.array([0.125, 0.25, 0.5, 0.125])
COUNTS = np.array([130, 240, 510, 120])


def _memmap(x, tmp_path, mode):
    path = tmp_path / f"{mode}-{len(list(tmp_path.iterdir()))}.dat"  # one file per array
    m = np.memmap(path, dtype=x.dtype, mode="w+", shape=x.shape)
    m[:] = x
    m.flush()
    return m if mode == "w+" else np.memmap(path, dtype=x.dtype, mode="r", shape=x.shape)


def _readonly(x):
    a = x.copy()
    a.flags.writeable = False
    return a


def _strided(x):
    big = np.zeros(2 * x.size, dtype=x.dtype)
    big[::2] = x
    return big[::2]


KINDS = {
    "float64": lambda x, tmp: x.copy(),
    "torch-view": lambda x, tmp: torch.tensor(x).numpy(),
    "tensor": lambda x, tmp: torch.tensor(x),
    "tensor-grad": lambda x, tmp: torch.tensor(x, requires_grad=x.dtype.kind == "f"),
    "memmap": lambda x, tmp: _memmap(x, tmp, "w+"),
    "memmap-readonly": lambda x, tmp: _memmap(x, tmp, "r"),
    "readonly": lambda x, tmp: _readonly(x),
    "strided": lambda x, tmp: _strided(x),
    "list": lambda x, tmp: x.tolist(),
    "float32": lambda x, tmp: x.astype(np.float32 if x.dtype.kind == "f" else np.int32),
}


def _state(x):
    """What the caller can see of ``x``: its type, values, dtype and flags."""
    if isinstance(x, np.ndarray):
        f = x.flags
        return (type(x), x.dtype, x.shape, x.strides, x.tolist(), f.writeable, f.owndata, f.c_contiguous,
                x.base is None)
    if isinstance(x, torch.Tensor):
        return (type(x), x.dtype, tuple(x.shape), x.tolist(), x.requires_grad, x.is_contiguous(), x.grad is None)
    return type(x), list(x)


@pytest.fixture(params=list(KINDS))
def kind(request, tmp_path):
    return lambda x: KINDS[request.param](x, tmp_path)


def _exact_step(drafts, rng):
    """Speculative sampling for one draft (Leviathan et al., arXiv:2211.17192, Algorithm 1), batched."""
    x = drafts[:, 0]
    accept = rng.random(x.shape[0]) * P[x] < Q[x]
    res = np.maximum(Q - P, 0.0) / np.maximum(Q - P, 0.0).sum()
    return np.where(accept, x, rng.choice(4, size=x.shape[0], p=res))


def _same_check(a, b):
    assert (a.passed, a.pvalue, a.statistic, a.n_samples, a.worst_cells) == (
        b.passed, b.pvalue, b.statistic, b.n_samples, b.worst_cells)
    np.testing.assert_array_equal(a.law, b.law)
    np.testing.assert_array_equal(a.target_law, b.target_law)


def test_check_sampler_takes_every_kind_and_leaves_it_unchanged(kind):
    p, q = kind(P), kind(Q)
    before = _state(p), _state(q)
    res = check_sampler(_exact_step, p, q, batched=True, n_samples=2000, boundary_coins=True, rng=0)
    assert (_state(p), _state(q)) == before
    _same_check(res, check_sampler(_exact_step, P, Q, batched=True, n_samples=2000, boundary_coins=True, rng=0))
    assert res.passed


def test_check_sampler_without_replacement_and_one_at_a_time(kind):
    p, q = kind(P), kind(Q)
    before = _state(p), _state(q)

    def first(drafts, rng):  # outputs the first draft: its law is p, so the check against p passes
        return drafts[0]

    res = check_sampler(first, p, p, k=2, replacement=False, n_samples=500, rng=1)
    assert (_state(p), _state(q)) == before
    _same_check(res, check_sampler(first, P, P, k=2, replacement=False, n_samples=500, rng=1))


def test_the_statistics_take_every_kind(kind):
    q, counts, logits = kind(Q), kind(COUNTS), kind(np.log(Q))
    before = _state(q), _state(counts), _state(logits)
    assert astuple(chi2_gof(counts, q)) == astuple(chi2_gof(COUNTS, Q))
    assert sample_size(0.05, q) == sample_size(0.05, Q)
    assert detectable_tv(1000, q) == detectable_tv(1000, Q)
    law = processed_law(logits, temperature=0.7, top_k=3, top_p=0.9)
    ref = processed_law(np.log(Q).astype(np.float32).astype(np.float64)
                        if isinstance(logits, np.ndarray) and logits.dtype == np.float32 else np.log(Q),
                        temperature=0.7, top_k=3, top_p=0.9)
    np.testing.assert_array_equal(law, ref)
    assert (_state(q), _state(counts), _state(logits)) == before


def test_seed_for_takes_every_kind(kind):
    q = kind(Q)
    before = _state(q)
    float32 = isinstance(q, np.ndarray) and q.dtype == np.float32
    # arrays hash by dtype and bytes: float32 input is its own example, every float64 holder the same one
    assert seed_for(q, 2) == seed_for(Q.astype(np.float32) if float32 else Q, 2)
    assert _state(q) == before


def test_check_block_sampler_takes_models_of_every_kind(kind):
    p, q = kind(P), kind(Q)
    before = _state(p), _state(q)
    draft, target = MemorylessModel(p), MemorylessModel(q)
    ref_draft, ref_target = MemorylessModel(P), MemorylessModel(Q)

    def target_only(block, rng):  # rejects the draft at once and samples the target: exact
        return (int(rng.choice(4, p=Q)),)

    res = check_block_sampler(target_only, draft, target, 1, n_samples=600, rng=0)
    _same_check(res, check_block_sampler(target_only, ref_draft, ref_target, 1, n_samples=600, rng=0))
    assert (_state(p), _state(q)) == before


def test_a_step_that_writes_to_a_view_of_a_tensor_is_caught_and_undone():
    t = torch.tensor(Q)
    q = t.numpy()  # shares t's memory, does not own it

    def vandal(drafts, rng):
        q[3] = 0.0
        return drafts[0]

    with pytest.raises(StepError, match=r"`step` modified `q` during the check \(written back"):
        check_sampler(vandal, P, q, n_samples=500, rng=0)
    assert q.flags.writeable and not q.flags.owndata and t.tolist() == Q.tolist()

    def on_the_tensor(drafts, rng):
        t[0] = 0.5
        return drafts[0]

    with pytest.raises(StepError, match="`step` modified `q`"):
        check_sampler(on_the_tensor, P, t, n_samples=500, rng=0)
    assert t.tolist() == Q.tolist()
