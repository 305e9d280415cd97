"""The batched ``alpha_k`` on a device: a few torch ops and one host read per call, the values of the host route.

A device array (CUDA) takes the vectorised array-API route (``otspec.otm._alpha._exact_batched``) after the batch
checks (``otspec._array.validate_batch_pair``). On a GPU each op costs a launch and each host read a full
synchronisation, so both are counted here on CPU tensors forced onto that route (the host view off, the
accelerator's chunk size on), with ``experiments/bench_profile_ops.py``'s counting modes: every aten op dispatched
and every host read (``tolist``, ``item``, ``bool``, ``int``, ``float``...). Its values are checked against the
per-row numpy route, and the one-read checks against the sequential checks (same values to the bit, same errors).
"""

from __future__ import annotations

import sys
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import otspec
import otspec._array as AR
import otspec.otm._alpha as A

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))
import bench_profile_ops as O  # noqa: E402
from _bench import llm_like  # noqa: E402

sys.path.remove(str(ROOT / "experiments"))

#: aten ops (views included) and host reads of one ``alpha_k(P, Q, 8)`` on the device route, any batch size up to
#: ``_DEVICE_CHUNK_ELEMENTS`` entries, measured: 49 and 1 (the checks: 2 x 8 reductions' ops, one stack and its
#: read; the closed form: 24 kernels for one even k, no read). Before (commit f745009): 421 ops and 18 host reads at
#: (48, 49152), every op and two reads again for each of its 5 chunks of 2**19 entries, and 8 reads in the checks.
OPS_K8, READS = 49, 1
#: The same for ``k = [1, 2, 8]`` (measured 64: 7 or 8 ops for k = 1 and 2, one stack).
OPS_K128 = 64


@pytest.fixture
def device_route(monkeypatch):
    """CPU tensors on the route of device arrays: no host view (the per-row numpy route), the accelerator's chunks."""
    monkeypatch.setattr(A, "_host_view", lambda P, Q, xp: None)
    monkeypatch.setattr(A, "_chunk_elements", lambda x: A._DEVICE_CHUNK_ELEMENTS)


def _batch(B, V, seed):
    rng = np.random.default_rng(seed)
    pairs = [llm_like(V, rng) for _ in range(3)]
    return (np.stack([pairs[i % 3][0] for i in range(B)]), np.stack([pairs[i % 3][1] for i in range(B)]))


def _counted(fn):
    c = O.Counts()
    aten, calls = O._modes(c)
    with aten, calls:
        out = fn()
    return out, c


def test_chunk_size_by_device():
    assert A._chunk_elements(np.zeros(3)) == A._CHUNK_ELEMENTS
    assert A._chunk_elements(torch.zeros(3)) == A._CHUNK_ELEMENTS
    # any device but the host (meta: no memory, as cuda would be) is one chunk up to the memory bound
    assert A._chunk_elements(torch.empty(3, device="meta")) == A._DEVICE_CHUNK_ELEMENTS > A._CHUNK_ELEMENTS


@pytest.mark.parametrize(("B", "V"), [(12, 49152)])
def test_ops_and_host_reads_of_a_batched_torch_call(device_route, B, V):
    """At a size that the host chunks (2 chunks of 2**19 entries): one chunk, the pinned counts. Fails on a
    chunked device route (every op per chunk), on a host read per check or per chunk (the split column read back)."""
    P, Q = _batch(B, V, 1)
    assert B * V > A._CHUNK_ELEMENTS
    Pt, Qt = torch.from_numpy(P), torch.from_numpy(Q)
    got, c = _counted(lambda: otspec.alpha_k(Pt, Qt, 8))
    assert (c.aten, c.reads) == (OPS_K8, READS), (c.aten, c.reads, c.ops)
    got3, c3 = _counted(lambda: otspec.alpha_k(Pt, Qt, [1, 2, 8]))
    assert (c3.aten, c3.reads) == (OPS_K128, READS), (c3.aten, c3.reads, c3.ops)
    want = otspec.alpha_k(P, Q, [1, 2, 8], workers=1)
    np.testing.assert_array_equal(got.numpy(), want[:, 2])
    np.testing.assert_allclose(got3.numpy(), want, rtol=0, atol=1e-12)


def _laws(rng, B, V, kind):
    if kind == "llm":
        return np.stack([llm_like(V, rng) for _ in range(B)], axis=1)
    if kind == "sparse":  # disjoint and shared zeros: q/p = +inf and nan in the sort
        X = rng.dirichlet(np.full(V, 0.2), size=(2, B))
        X[0, :, : V // 3] = 0.0
        X[1, :, V // 4 : V // 2] = 0.0
        return X / X.sum(axis=-1, keepdims=True)
    if kind == "ties":
        X = rng.integers(1, 4, size=(2, B, V)).astype(float)
        return X / X.sum(axis=-1, keepdims=True)
    if kind == "equal":
        X = rng.dirichlet(np.ones(V), size=B)
        return np.stack([X, X])
    X = np.zeros((2, B, V))  # one-hot
    X[0, np.arange(B), rng.integers(V, size=B)] = 1.0
    X[1, np.arange(B), rng.integers(V, size=B)] = 1.0
    return X


@pytest.mark.parametrize("kind", ["llm", "sparse", "ties", "equal", "one-hot"])
@pytest.mark.parametrize("V", [1, 2, 7, 3000])
def test_torch_cpu_device_route_equals_numpy(device_route, kind, V):
    """The device route on torch CPU tensors against the per-row numpy route, every k form (odd, even, a power of
    two, past the underflow of P**k, huge): within 1e-12. Fails on a wrong low/high split or a lost prefix."""
    rng = np.random.default_rng(V)
    P, Q = _laws(rng, 6, V, kind)
    ks = [1, 2, 3, 8, 33, 1100, 1101, 10**20]
    want = otspec.alpha_k(P, Q, ks, workers=1)
    got = otspec.alpha_k(torch.from_numpy(P), torch.from_numpy(Q), ks)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float64
    np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-12)
    # leading axes and float32 input (renormalised in float64 from the one-read checks' totals)
    got2 = otspec.alpha_k(torch.from_numpy(P).reshape(2, 3, V), torch.from_numpy(Q).reshape(2, 3, V), 8)
    np.testing.assert_allclose(got2.numpy().reshape(-1), want[:, 3], rtol=0, atol=1e-12)
    P32, Q32 = P.astype(np.float32), Q.astype(np.float32)
    got32 = otspec.alpha_k(torch.from_numpy(P32), torch.from_numpy(Q32), 8)
    want32 = otspec.alpha_k(P32, Q32, 8, workers=1)
    np.testing.assert_allclose(got32.numpy(), want32, rtol=0, atol=1e-12)


@pytest.mark.parametrize("conv", [np.asarray, torch.from_numpy], ids=["numpy", "torch"])
def test_host_chunks_give_the_one_chunk_values_to_the_bit(monkeypatch, conv):
    """Chunks of 3 rows (the host's cache-sized chunking, the last one short) against one chunk: the same bits."""
    P, Q = _laws(np.random.default_rng(2), 8, 500, "sparse")
    Pa, Qa = conv(P), conv(Q)
    xp = AR.namespace(Pa, Qa)
    monkeypatch.setattr(A, "_chunk_elements", lambda x: 3 * 500)
    chunked = np.asarray(A._exact_batched(Pa, Qa, [2, 7], xp))
    monkeypatch.setattr(A, "_chunk_elements", lambda x: A._DEVICE_CHUNK_ELEMENTS)
    whole = np.asarray(A._exact_batched(Pa, Qa, [2, 7], xp))
    np.testing.assert_array_equal(chunked, whole)
    np.testing.assert_allclose(whole, otspec.alpha_k(P, Q, [2, 7], workers=1), rtol=0, atol=1e-12)


def test_int_power_is_a_new_array_with_the_squares_values():
    x = np.random.default_rng(0).random(50)
    for k in range(1, 40):
        got = AR.int_power(x, k)
        assert got is not x and not np.shares_memory(got, x)
        want, base, e = np.ones(50), x.copy(), k   # the same squarings, multiplied in the same order
        first = True
        while e:
            if e & 1:
                want = base.copy() if first else want * base
                first = False
            e >>= 1
            if e:
                base = base * base
        np.testing.assert_array_equal(got, want)


#: Entries the checks treat apart: NaN, infinities, a negative, -0.0 and subnormals (flushed to +0.0), the smallest
#: normal double (kept), a huge one (a row total of inf), 0.
SPECIAL = [np.nan, np.inf, -np.inf, -1e-3, -0.0, 5e-324, 1e-310, 2.2250738585072014e-308, 1e308, 0.0]


def _outcome(p, q, **kw):
    try:
        P, Q, _ = AR.validate_batch_pair(p, q, **kw)
    except (ValueError, TypeError) as exc:
        return type(exc).__name__, str(exc)
    return np.asarray(P).copy(), np.asarray(Q).copy()


@settings(max_examples=150, deadline=None, derandomize=True)
@given(V=st.integers(1, 6), rows=st.integers(1, 3), seed=st.integers(0, 2**32 - 1),
       n_special=st.integers(0, 3), off=st.sampled_from([0.0, 1e-12, 1e-6, -1e-8]),
       dtype=st.sampled_from(["float64", "float32"]), normalize=st.booleans())
def test_one_read_checks_match_the_sequential_checks(V, rows, seed, n_special, off, dtype, normalize):
    """torch tensors through the one-read checks against the same tensors through the checks one by one (a read
    each, the route before): the same error and message, or the same float64 laws to the bit, the flushed -0.0 and
    subnormals included; and the same verdict and message as numpy arrays. Fails on one-read checks that miss a case
    (a -0.0 kept: its sign bit differs; a subnormal kept; a NaN, an infinity or a row off by 1e-6 passed)."""
    rng = np.random.default_rng(seed)
    X = rng.dirichlet(np.ones(V), size=(2, rows))
    for _ in range(n_special):
        X[rng.integers(2), rng.integers(rows), rng.integers(V)] = SPECIAL[rng.integers(len(SPECIAL))]
    X[0, 0] *= 1.0 + off
    with np.errstate(over="ignore"):  # 1e308 as float32: inf
        X = X.astype(dtype)
    p, q = torch.from_numpy(X[0]), torch.from_numpy(X[1])
    got = _outcome(p, q, normalize=normalize)
    with mock.patch.object(AR, "_usual_totals", lambda *a: None):
        want = _outcome(p, q, normalize=normalize)
    on_numpy = _outcome(X[0], X[1], normalize=normalize)
    if isinstance(want[0], str):
        assert got == want == on_numpy
    else:
        assert not isinstance(on_numpy[0], str), on_numpy
        for a, b in zip(got, want):
            assert a.dtype == b.dtype == np.float64
            np.testing.assert_array_equal(a, b)
            np.testing.assert_array_equal(np.signbit(a), np.signbit(b))


@pytest.mark.parametrize("conv", [np.array, torch.tensor], ids=["numpy", "torch"])
@pytest.mark.parametrize("row", [[5e-324], [1e-310, 0.0], [-0.0, 1e-310, 0.0]])
def test_normalize_refuses_a_row_of_subnormals(conv, row):
    """Its entries are flushed to 0 before its total is checked, as on the 1-D route: a positive total of
    subnormals let the row through, to be divided by 0 after the flush (NaN, and a RuntimeWarning on numpy)."""
    p = conv([row, [1.0 / len(row)] * len(row)])
    q = conv([[1.0 / len(row)] * len(row)] * 2)
    with pytest.raises(ValueError, match=r"`p` must have a positive total in every row to be normalized, got row "
                                         r"\(0,\) with total 0"):
        otspec.alpha_k(p, q, 2, normalize=True)
    with pytest.raises(ValueError, match="positive total"):
        otspec.alpha_k(row, [1.0 / len(row)] * len(row), 2, normalize=True)
