"""The priority-key verifier at huge k and on tiny masses: honest status, and sampler = conditional by construction."""

import numpy as np

import otspec

EPS = np.finfo(float).eps


def _llm_like(n, seed):
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 3, n)
    q = np.exp(logits - logits.max())
    p = np.exp(logits + rng.normal(0, 1, n) - logits.max())
    return p / p.sum(), q / q.sum()


def test_status_tolerance_does_not_grow_with_k():
    """k = 2 .. 10^6 on n = 2,000: one tol; "optimal" only within it; z sums to 1 within 4 n eps."""
    p, q = _llm_like(2000, 0)
    tols = set()
    for k in (2, 64, 10**4, 10**6):
        v = otspec.optimal_verifier(p, q, k)
        tols.add(v.tol)
        assert v.method == "keys"
        assert v.status in ("optimal", "rounding")
        assert (v.status == "optimal") == (v.gap <= v.tol)
        assert abs(v.gap - (v.alpha - v.acceptance())) <= 1e-15
        assert abs(v.z.sum() - 1) <= 4 * 2000 * EPS
        assert v.acceptance() <= 1.0
    assert tols == {max(1e-12, 4 * 2000 * EPS)}


def test_explicit_tol_is_kept():
    p, q = _llm_like(300, 1)
    v = otspec.optimal_verifier(p, q, 4, tol=1e-9)
    assert v.tol == 1e-9 and v.status == "optimal"
