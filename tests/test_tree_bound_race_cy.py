"""The race's Taylor thresholds compiled, and the frontier's host rows taken once.

``otspec.tree._bound._race_thresholds`` (which degree of the race's Taylor series an entry of the tail needs) ran as a
dozen numpy operations per call (cumulative sums, powers, minima over ``(rows, ranks, N + 1)`` temporaries);
``_bound_kernels.race_thresholds`` does the same operations in one compiled loop. Independent routes: the numpy
operations themselves (the route without numba), bit for bit, NaN included; and the thresholds' meaning checked from
their definition with ``math.fsum``. ``_sampled`` now takes a frontier's host rows once (``_host_rows``) for the
route's choice and the expansion: counted.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from otspec.tree import TreeShape
from otspec.tree import _bound as B
from otspec.tree import _bound_kernels as K
from tests.test_tree_bound import HeldLaws


def _llm_row(V: int, rng) -> np.ndarray:
    z = rng.normal(0.0, rng.uniform(1.0, 6.0), V)
    p = np.exp(z - z.max())
    return p / p.sum()


def _numpy_thresholds(C, monkeypatch):
    monkeypatch.setattr(K, "RACE_JIT", False)
    try:
        return B._race_thresholds(C)
    finally:
        monkeypatch.undo()


def _coefficients(rng):
    """Random ``(m, ranks, N + 1)`` coefficients over 35 decades, zeros, negative and NaN entries."""
    m, nk, n1 = int(rng.integers(1, 6)), int(rng.integers(1, 4)), int(rng.integers(2, 50))
    C = rng.standard_normal((m, nk, n1)) * 10.0 ** rng.integers(-30, 5, (m, nk, n1))
    C[rng.random(C.shape) < 0.3] = 0.0
    if rng.random() < 0.2:
        C[int(rng.integers(m)), int(rng.integers(nk)), int(rng.integers(n1))] = np.nan
    return C


def test_race_thresholds_compiled_equal_numpy(monkeypatch):
    """The compiled thresholds against numpy's operations, bit for bit (NaN where numpy gives NaN): random
    coefficients (zeros, negative leading terms, NaN) and a real race's. A kernel that took the minimum over the ranks
    with NaN ignored, summed the tail upward (another rounding), or ran the running minimum from the bottom fails."""
    if not K.RACE_JIT:
        pytest.skip("numba is not installed")
    rng = np.random.default_rng(5)
    cases = [_coefficients(rng) for _ in range(150)]
    P = np.stack([_llm_row(3000, rng) for _ in range(4)])
    race = B._Race(P, [2, 3, 5], list(range(4)))
    assert race.ok.all()
    cases.append(race.C)
    for C in cases:
        got = B._race_thresholds(C)
        want = _numpy_thresholds(C, monkeypatch)
        np.testing.assert_array_equal(got, want)
        assert got.shape == (C.shape[0], C.shape[2])


def test_race_thresholds_mean_what_they_say():
    """Where the threshold is finite, every rank's terms above degree ``d`` at :math:`x = \\theta_d` sum to at most
    1e-17 of its :math:`C_0` (``math.fsum``, a rounding's margin); thresholds nondecreasing, the last infinite. A
    threshold taken from one rank alone (not the smallest over the ranks) fails the first."""
    rng = np.random.default_rng(9)
    for _ in range(60):
        m, nk, n1 = int(rng.integers(1, 4)), int(rng.integers(1, 4)), int(rng.integers(2, 30))
        C = np.abs(rng.standard_normal((m, nk, n1))) * 10.0 ** rng.integers(-12, 3, (m, nk, n1))
        th = B._race_thresholds(C)
        assert np.all(np.isinf(th[:, -1]))
        assert np.all(np.diff(th, axis=1) >= 0)
        for i in range(m):
            for d in range(n1 - 1):
                x = th[i, d]
                if not np.isfinite(x) or x > 1.0:
                    continue
                for k in range(nk):
                    rest = math.fsum(abs(C[i, k, n]) * x ** n for n in range(d + 1, n1))
                    assert rest <= 1e-17 * C[i, k, 0] * (1 + 1e-12)


def test_sampled_takes_the_host_rows_once_per_frontier(monkeypatch):
    """``_sampled`` reads each frontier's laws as host rows once (the route's choice and the expansion share them):
    one ``_host_rows`` call per model call, where it took two; the bound unchanged."""
    if not K.JIT:
        pytest.skip("numba is not installed")
    rng = np.random.default_rng(3)
    V = 400
    laws: dict = {}

    def pair():
        return _llm_row(V, rng), _llm_row(V, rng)

    shape = TreeShape.branching(4, 3)
    first = B._sampled(B._Slots(shape), "wor", HeldLaws(laws, pair), 24, 8).value
    n = {"calls": 0}
    orig = B._host_rows

    def counting(P, Q):
        n["calls"] += 1
        return orig(P, Q)

    monkeypatch.setattr(B, "_host_rows", counting)
    got = HeldLaws(laws, pair)
    value = B._sampled(B._Slots(shape), "wor", got, 24, 8).value
    assert n["calls"] == got.calls
    assert value == first
