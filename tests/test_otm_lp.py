"""The OTM-k LPs: status reporting, the post-solve re-check, size refusal, the plan as a verifier."""

import numpy as np
import pytest

import otspec
import otspec.otm._highs as highs_mod


def test_result_fields():
    res = otspec.otm_lp([0.75, 0.25], [0.25, 0.75], 2)
    assert res.success and res.status == "optimal"
    assert res.n_variables == 2 + 2 * 1  # sets {0}, {1}, {0, 1}: 1 + 1 + 2 columns
    assert res.k == 2 and res.max_violation <= 1e-9
    assert "re-check passed" in res.message
    with pytest.raises(AttributeError):
        res.alpha = 0.0  # frozen


def test_set_weights_sum_to_one_and_match_inclusion_exclusion():
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(5))
    sets, w = otspec.otm.set_weights(p, 3)
    np.testing.assert_allclose(w.sum(), 1.0, atol=1e-15)
    for s, ws in zip(sets, w):
        # P(S = A) by inclusion-exclusion over subsets of A
        A = list(s)
        total = 0.0
        for r in range(len(A) + 1):
            from itertools import combinations

            for B in combinations(A, r):
                total += (-1) ** (len(A) - r) * p[list(B)].sum() ** 3
        np.testing.assert_allclose(ws, total, rtol=1e-10, atol=1e-15)


def test_failed_recheck_is_reported_not_returned(monkeypatch):
    real = highs_mod._run_highs

    def corrupt(*args):
        ok, name, x, obj = real(*args)
        x = x.copy()
        x[0] += 1e-3  # a "solution" that violates a marginal
        return ok, name, x, obj

    monkeypatch.setattr(highs_mod, "_run_highs", corrupt)
    res = otspec.otm_lp([0.5, 0.5], [0.25, 0.75], 2)
    assert not res.success and res.status == "check_failed"
    assert np.isnan(res.alpha) and res.verifier is None
    assert "violates feasibility" in res.message
    with pytest.raises(otspec.SolverError, match="check_failed"):
        otspec.otm_lp([0.5, 0.5], [0.25, 0.75], 2, raise_on_failure=True)
    with pytest.raises(otspec.SolverError):
        otspec.alpha_k([0.5, 0.5], [0.25, 0.75], 2, method="lp")


def test_solver_failure_status_is_reported(monkeypatch):
    def fail(*args):
        return False, "Infeasible", None, float("nan")

    monkeypatch.setattr(highs_mod, "_run_highs", fail)
    res = otspec.otm_lp([0.5, 0.5], [0.25, 0.75], 1)
    assert not res.success and res.status == "Infeasible"


def test_too_large_lps_are_refused_up_front():
    n = 60
    u = np.full(n, 1.0 / n)
    with pytest.raises(ValueError, match=r"multisets .* above the limit"):
        otspec.otm_lp(u, u, 8)
    v = np.full(10, 0.1)
    with pytest.raises(ValueError, match=r"n\*\*\(k\+1\) = 10\*\*6 = 1000000 variables"):
        otspec.otm_lp_tuples(v, v, 5)


def test_reduced_lp_size_target_n12_k4():
    rng = np.random.default_rng(1)
    p, q = rng.dirichlet(np.ones(12)), rng.dirichlet(np.ones(12))
    res = otspec.otm_lp(p, q, 4)
    assert res.success
    np.testing.assert_allclose(res.alpha, otspec.alpha_k(p, q, 4), atol=1e-9)


def test_plan_verifier_on_zero_probability_drafts_returns_q():
    res = otspec.otm_lp([1.0, 0.0], [0.5, 0.5], 2)
    np.testing.assert_array_equal(res.verifier.conditional([1, 1]), [0.5, 0.5])
    assert res.verifier.n_keys == 1


def test_tuple_plan_verifier_is_lossless():
    rng = np.random.default_rng(2)
    p, q = rng.dirichlet(np.ones(3)), rng.dirichlet(np.ones(3))
    res = otspec.otm_lp_tuples(p, q, 2)
    chk = otspec.check_lossless(res.verifier)
    assert chk.max_marginal_error <= 1e-9
    np.testing.assert_allclose(chk.acceptance, otspec.alpha_k(p, q, 2), atol=1e-9)


def test_plan_rows_are_proper_laws_when_every_column_is_full():
    # p == q gives alpha = 1: no unmatched column mass, while rounding can leave
    # a set with tiny positive leftover row mass; every conditional must still be a law
    import itertools

    p = np.array([1 - 2e-13, 1e-13, 1e-13])
    v = otspec.otm_lp(p, p, 3).verifier
    for x in itertools.product(range(3), repeat=3):
        c = v.conditional(x)
        assert np.all(np.isfinite(c)) and abs(c.sum() - 1) <= 1e-12


def test_plan_verifier_guards_an_underflowed_row():
    p = q = np.array([0.5, 0.5])
    rows = np.array([[0.5, 0.0], [0.0, 0.0]])  # second set: positive weight, row underflowed to 0
    v = otspec.OTMPlanVerifier(p, q, 1, [(0,), (1,)], rows, np.array([0.5, 1e-320]), 0.5, keyed_by_set=True)
    np.testing.assert_array_equal(v.conditional([1]), q)
    np.testing.assert_array_equal(v.conditional([0]), [1.0, 0.0])


def test_inputs_within_the_simplex_tolerance_are_solvable():
    # q sums to 1 + 1e-10 (accepted by validation): the tuple LP's equality
    # constraints would be infeasible without rescaling (found by hypothesis)
    p, q = [0.0, 0.0, 1.0], [0.0, 1.0, 1e-10]
    for solve in (otspec.otm_lp, otspec.otm_lp_tuples):
        res = solve(p, q, 1)
        assert res.success, res.message
        np.testing.assert_allclose(res.alpha, otspec.alpha_k(p, q, 1), rtol=0, atol=1e-9)
