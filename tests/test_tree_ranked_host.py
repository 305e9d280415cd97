"""The CPU's one-pass ranking of a decoder's laws (``ranked_rows_host``) against the device route's
(``ranked_rows_t``) and the host rule of ``otspec.tree`` (``_ranked``): the same ids and values, bit for bit."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from otspec._jit import HAVE_NUMBA  # noqa: E402
from otspec.decoding import _tree_device as TD  # noqa: E402
from otspec.tree._process import _ranked  # noqa: E402


@st.composite
def _rows(draw):
    V = draw(st.integers(1, 3000))
    B = draw(st.integers(1, 4))
    k = draw(st.integers(1, min(V, 9)))
    kind = draw(st.sampled_from(["llm", "grid", "one-hot", "flat", "rising", "few"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if kind == "llm":
        R = np.exp(3 * rng.standard_normal((B, V)))
    elif kind == "grid":  # ties everywhere, zeros included
        R = rng.integers(0, 4, (B, V)).astype(np.float64)
    elif kind == "one-hot":
        R = np.zeros((B, V))
        R[np.arange(B), rng.integers(0, V, B)] = 1.0
    elif kind == "flat":
        R = np.ones((B, V))
    elif kind == "rising":  # every block raises the k-th value
        R = np.tile(np.arange(V, dtype=np.float64), (B, 1))
    else:  # fewer than k positive entries
        R = np.zeros((B, V))
        R[:, : max(k - 1, 0)] = rng.random((B, max(k - 1, 0)))
    R = R / np.maximum(R.sum(1, keepdims=True), 1e-300)
    return torch.from_numpy(np.ascontiguousarray(R)), k


@pytest.mark.skipif(not HAVE_NUMBA, reason="the one-pass ranking is compiled by numba (the fast extra)")
@settings(max_examples=150, deadline=None)
@given(_rows())
def test_one_pass_ranking_equals_the_device_route_and_the_host_rule(case):
    R, k = case
    ids, vals = TD.ranked_rows_host(R, k)
    want_ids, want_vals = TD.ranked_rows_t(R, k)
    assert torch.equal(ids, want_ids) and torch.equal(vals, want_vals)
    for b in range(R.shape[0]):
        assert ids[b].tolist() == [int(i) for i in _ranked(R[b].numpy(), k)]
    assert torch.equal(vals, R.gather(1, ids))  # the values are the entries themselves


@pytest.mark.skipif(not HAVE_NUMBA, reason="the one-pass ranking is compiled by numba (the fast extra)")
def test_one_pass_ranking_leaves_rows_with_a_nan_to_the_device_route():
    R = torch.tensor([[0.1, 0.5, 0.4, 0.0], [math.nan] * 4, [0.2, math.nan, 0.3, 0.5]], dtype=torch.float64)
    for k in (1, 2, 3):
        ids, vals = TD.ranked_rows_host(R, k)
        want_ids, want_vals = TD.ranked_rows_t(R, k)
        assert torch.equal(ids, want_ids) and torch.equal(vals.isnan(), want_vals.isnan())
        assert torch.equal(vals[~vals.isnan()], want_vals[~want_vals.isnan()])
    assert not TD._top_k_rows(R[2:].numpy(), 2, np.empty((1, 2), np.int64), np.empty((1, 2)))
