"""One HiGHS linear-programming helper for every LP in otspec.

Every LP of the package (the reduced OTM-k LP, the block-level transport LP,
the per-position transport LPs of SpecTr's dynamic programme) is built as a
column-wise sparse matrix, solved by HiGHS through :mod:`highspy`, and its
claimed optimum re-checked (signs, row bounds, objective) within
:data:`LP_CHECK_TOL` before anything is returned. A failed solve or re-check is
reported (or raised as :class:`SolverError`), never returned silently; this
mirrors scipy's ``_linprog_util._check_result``.

Every HiGHS instance of the package comes from :func:`new_highs`, silent from
construction on: highspy prints its banner ("Running HiGHS ...") on standard
output when the first instance of a process installs its callbacks, before a
caller could switch the output off; :func:`new_highs` switches it off first.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np

__all__ = ["LP_CHECK_TOL", "LPSolution", "SolverError", "new_highs", "solve_lp"]

#: Feasibility tolerance of the post-solve re-check (signs, row bounds, objective).
LP_CHECK_TOL = 1e-9


class SolverError(RuntimeError):
    """An LP solve failed, or its solution failed the feasibility re-check."""


@dataclass(frozen=True, eq=False)
class LPSolution:
    """The outcome of :func:`solve_lp`.

    Attributes
    ----------
    success : bool
        HiGHS reported an optimum and the re-check passed.
    status : str
        ``"optimal"``, the HiGHS model status name, or ``"check_failed"``.
    message : str
        Human-readable detail (solver status, largest violation found).
    x : (n_cols,) ndarray of float64
        The solver's raw solution (empty on a solver failure).
    objective : float
        The objective ``cost @ x`` summed exactly (``nan`` on failure).
    max_violation : float
        Largest violation of signs, row bounds and the solver's own objective
        value (``nan`` when no solution came back).
    row_dual : (n_rows,) ndarray of float64
        HiGHS's row duals (empty on a solver failure), for callers that
        certify a bound by weak duality.
    """

    success: bool
    status: str
    message: str
    x: np.ndarray
    objective: float
    max_violation: float
    row_dual: np.ndarray = field(default_factory=lambda: np.empty(0))

    def raise_for_status(self, what: str) -> None:
        """Raise :class:`SolverError` naming ``what`` unless the solve succeeded."""
        if not self.success:
            raise SolverError(f"{what} failed ({self.status}): {self.message}")


def _silence(h) -> None:
    """No banner, no log: HiGHS's ``output_flag`` and ``log_to_console`` off."""
    h.setOptionValue("output_flag", False)
    h.setOptionValue("log_to_console", False)


@functools.cache
def _quiet_class():
    """A :class:`highspy.Highs` subclass switching the output off before the banner could be printed."""
    import highspy

    class QuietHighs(highspy.Highs):
        # highspy's constructor installs its callbacks through enableCallbacks(), and the first
        # installation of a process prints the banner unless output_flag is already off
        def enableCallbacks(self):
            _silence(self)
            super().enableCallbacks()

    return QuietHighs


def new_highs(*, tol: float = 1e-10, presolve: bool = True):
    """A silent :class:`highspy.Highs` (nothing printed, ever) with primal and dual feasibility tolerance ``tol``.

    The one constructor of HiGHS instances in otspec.
    """
    h = _quiet_class()()
    _silence(h)  # highspy versions whose constructor does not call enableCallbacks
    h.setOptionValue("primal_feasibility_tolerance", tol)
    h.setOptionValue("dual_feasibility_tolerance", tol)
    if not presolve:
        h.setOptionValue("presolve", "off")
    return h


def _run_highs(h, lp):
    """Pass the model to HiGHS and run it: ``(optimal, status name, x, objective)``."""
    import highspy

    h.passModel(lp)
    h.run()
    status = h.getModelStatus()
    name = h.modelStatusToString(status)
    if status != highspy.HighsModelStatus.kOptimal:
        return False, name, None, math.nan
    x = np.array(h.getSolution().col_value, dtype=np.float64)
    return True, name, x, float(h.getInfo().objective_function_value)


def solve_lp(
    cost,
    starts,
    index,
    values,
    row_lower,
    row_upper,
    *,
    col_upper=None,
    maximize: bool = True,
    presolve: bool = True,
    check_tol: float = LP_CHECK_TOL,
) -> LPSolution:
    r"""Solve a sparse LP with HiGHS, then re-check the claimed optimum.

    .. math::

        \max\ (\text{or} \min)\ c^\top x \quad\text{s.t.}\quad
        l \le A x \le u, \quad 0 \le x \le b.

    Parameters
    ----------
    cost : (n_cols,) array_like of float
        Objective coefficients :math:`c`.
    starts, index, values : array_like
        :math:`A` in compressed-column form (``starts`` of length
        ``n_cols + 1``; ``index`` the row of each entry).
    row_lower, row_upper : (n_rows,) array_like of float
        Row bounds (``-inf`` / ``inf`` allowed).
    col_upper : (n_cols,) array_like of float or None, keyword-only
        Column upper bounds; None: unbounded. Lower bounds are 0.
    maximize : bool, keyword-only
        Maximise (default) or minimise.
    presolve : bool, keyword-only
        HiGHS presolve (off where it has declared feasible instances with
        rounding-level entries infeasible).
    check_tol : float, keyword-only
        Re-check tolerance.

    Returns
    -------
    LPSolution
    """
    import highspy

    cost = np.ascontiguousarray(cost, dtype=np.float64)
    row_lower = np.ascontiguousarray(row_lower, dtype=np.float64)
    row_upper = np.ascontiguousarray(row_upper, dtype=np.float64)
    n_cols, n_rows = cost.shape[0], row_lower.shape[0]
    starts = np.ascontiguousarray(starts, dtype=np.int32)
    index = np.ascontiguousarray(index, dtype=np.int32)
    values = np.ascontiguousarray(values, dtype=np.float64)
    upper = np.full(n_cols, np.inf) if col_upper is None else np.ascontiguousarray(col_upper, dtype=np.float64)
    inf = highspy.kHighsInf
    h = new_highs(presolve=presolve)
    lp = highspy.HighsLp()
    lp.num_col_ = n_cols
    lp.num_row_ = n_rows
    lp.sense_ = highspy.ObjSense.kMaximize if maximize else highspy.ObjSense.kMinimize
    lp.col_cost_ = cost
    lp.col_lower_ = np.zeros(n_cols)
    lp.col_upper_ = np.where(np.isfinite(upper), upper, inf)
    lp.row_lower_ = np.where(np.isfinite(row_lower), row_lower, -inf)
    lp.row_upper_ = np.where(np.isfinite(row_upper), row_upper, inf)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.num_col_ = n_cols
    lp.a_matrix_.num_row_ = n_rows
    lp.a_matrix_.start_ = starts
    lp.a_matrix_.index_ = index
    lp.a_matrix_.value_ = values
    optimal, name, x, solver_obj = _run_highs(h, lp)
    if not optimal:
        return LPSolution(False, name, f"HiGHS model status: {name}", np.empty(0), math.nan, math.nan)
    objective = math.fsum(cost * x)
    # re-check the claimed optimum: signs, column and row bounds, objective
    col_of = np.repeat(np.arange(n_cols), np.diff(starts))
    ax = np.bincount(index, weights=values * x[col_of], minlength=n_rows)
    violation = max(
        float(-min(x.min(initial=0.0), 0.0)),
        float(np.max(x - upper, initial=0.0)),
        float(np.max(ax - row_upper, initial=0.0)),
        float(np.max(row_lower - ax, initial=0.0)),
        abs(objective - solver_obj),
    )
    row_dual = np.array(h.getSolution().row_dual, dtype=np.float64)
    if not violation <= check_tol:
        return LPSolution(
            False,
            "check_failed",
            f"solver reported optimal but the solution violates feasibility by {violation:.3e} "
            f"(tolerance {check_tol:g})",
            x,
            math.nan,
            violation,
        )
    return LPSolution(True, "optimal", f"HiGHS: {name}; re-check passed (max violation {violation:.1e})",
                      x, objective, violation, row_dual)
