"""The priority-key verifier at huge k and on tiny masses: honest status, and sampler = conditional by construction."""

import numpy as np

import otspec
from otspec.testing import chi2_gof

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


def _flat_case():
    """A pair whose key layout puts a token of draft mass 2.5e-223 at a float64 point inside another token's interval."""
    p = np.array([2.88439436e-1, 1.74453921e-1, 5.69880039e-2, 2.46901857e-223, 1.57422818e-1, 2.39678524e-1,
                  8.30172973e-2])
    q = np.array([0.22229615, 0.48178994, 0.00476612, 0.05760798, 0.05230426, 0.00933756, 0.171898])
    v = otspec.optimal_verifier(p, q, 4, normalize=True)
    tok, top, ln = v.pieces
    lo = top - ln
    point = np.flatnonzero((lo >= top) & (ln > 0))
    assert v.method == "keys" and point.size
    s0, t = top[point[0]], int(tok[point[0]])
    assert np.any((tok != t) & (lo < s0) & (top > s0))  # the point lies inside another token's interval
    return v, t


def test_tiny_mass_sampler_is_its_conditional():
    """Tuples holding a token of mass 1e-300 (its key interval a float64 point): sample() follows conditional()."""
    v, t = _flat_case()
    rng = np.random.default_rng(0)
    for other in (6, 0):  # the token whose interval holds the point, and another
        x = (t, other, other, (other + 1) % v.n)
        law = v.conditional(x)
        assert abs(law.sum() - 1) <= 1e-12 and abs(v.selection_law(x).sum() - 1) <= 1e-12
        ys = np.array([v.sample(x, rng=rng) for _ in range(2000)])
        assert chi2_gof(np.bincount(ys, minlength=v.n), law, alpha_fail=1e-4).passed


def test_tiny_mass_output_law_and_acceptance_unaffected():
    v, _ = _flat_case()
    chk = otspec.check_lossless(v)
    assert chk.max_marginal_error <= 1e-12 and chk.acceptance_error <= 1e-12
