"""Shared sampler checks for the test suite (chi-square against exact laws)."""

from __future__ import annotations

import numpy as np

from otspec.testing import chi2_gof


def assert_end_to_end_sampler(v, N: int, seed: int, alpha_fail: float) -> None:
    """Draw drafts and outputs with ``v``: the output law is q and the hit rate is ``v.acceptance()``.

    Two chi-square tests, each with false-failure rate ``alpha_fail``.
    """
    gen = np.random.default_rng(seed)
    ys = np.empty(N, dtype=np.int64)
    hit = 0
    for i in range(N):
        x = v.sample_drafts(rng=gen)
        ys[i] = v.sample(x, rng=gen)
        hit += ys[i] in x
    assert chi2_gof(np.bincount(ys, minlength=v.n), v.q, alpha_fail=alpha_fail).passed
    a = v.acceptance()
    assert chi2_gof(np.array([hit, N - hit]), np.array([a, 1 - a]), alpha_fail=alpha_fail).passed
