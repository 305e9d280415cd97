"""Every ``tol`` is checked by one helper, with one message.

``optimal_verifier`` and ``kseq_rho_star`` had inline copies of the ``tol`` check, with their own messages (and
``optimal_verifier`` refused a ``Fraction``); every public ``tol`` now goes through
``otspec._verifier.validate_tol``: TypeError "`tol` must be a real number" for non-numbers and booleans,
ValueError "`tol` must be finite and >= 0" (``> 0`` for the bisection of ``kseq_rho_star``). The tests marked
``regression`` fail at 9e81b77 (other messages, or a Fraction refused).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

import otspec
from otspec import multidraft as md
from otspec.models import MemorylessModel

P = [0.5, 0.25, 0.25]
Q = [0.25, 0.25, 0.5]


def regression(f):
    """Marks (for the reader) a test that fails at 9e81b77."""
    return f


# ------------------------------------------------------------------------------------------------------------
# tolerances: one check, one message
# ------------------------------------------------------------------------------------------------------------
M2, T2 = MemorylessModel([0.5, 0.5]), MemorylessModel([0.25, 0.75])

#: (id, call of tol, whether tol must be > 0)
TOLS = [
    ("optimal_verifier", lambda t: md.optimal_verifier(P, Q, 2, tol=t), False),
    ("optimal_verifier direct", lambda t: md.optimal_verifier(P, Q, 2, tol=t, method="direct"), False),
    ("kseq_rho_star", lambda t: md.kseq_rho_star(P, Q, 2, tol=t), True),
    ("khisti_acceptance_one", lambda t: md.khisti_acceptance_one(P, Q, tol=t), False),
    ("check_lossless", lambda t: otspec.check_lossless(otspec.kseq(P, Q, 2), tol=t), False),
    ("spectr.check_lossless", lambda t: otspec.spectr.check_lossless(M2, T2, 1, 1, tol=t), False),
    ("block.check_lossless", lambda t: otspec.block.check_lossless(M2, T2, 1, tol=t), False),
]
BAD_TOL_TYPES = [True, np.True_, "0", [1e-9]]
BAD_TOL_VALUES = [float("nan"), float("inf"), -1e-3, np.float64(-0.5)]


@regression
@pytest.mark.parametrize("value", BAD_TOL_VALUES, ids=repr)
@pytest.mark.parametrize("case", TOLS, ids=[c[0] for c in TOLS])
def test_bad_tol_values_one_message(case, value):
    _, call, positive = case
    with pytest.raises(ValueError, match=f"^`tol` must be finite and {'>' if positive else '>='} 0, got "):
        call(value)


@regression
@pytest.mark.parametrize("value", BAD_TOL_TYPES, ids=repr)
@pytest.mark.parametrize("case", TOLS, ids=[c[0] for c in TOLS])
def test_bad_tol_types_one_message(case, value):
    _, call, _ = case
    with pytest.raises(TypeError, match="^`tol` must be a real number"):
        call(value)


def test_zero_tol_of_the_bisection():
    """``kseq_rho_star``'s bisection needs ``tol > 0`` (it would never stop at 0); None is its exact route."""
    with pytest.raises(ValueError, match=r"^`tol` must be finite and > 0, got 0.0"):
        md.kseq_rho_star(P, Q, 2, tol=0)
    assert md.kseq_rho_star(P, Q, 2, tol=None) == md.kseq_rho_star(P, Q, 2)


@regression
def test_tol_of_any_real_kind_is_its_float():
    """Ints, NumPy floats and Fractions give the answer of the float they equal (``optimal_verifier`` refused a
    Fraction at 9e81b77); None keeps the construction's own bound."""
    want = md.optimal_verifier(P, Q, 3, tol=1e-9, method="direct")
    for t in (Fraction(1, 10**9), np.float64(1e-9), np.float32(1e-9).astype(np.float64)):
        got = md.optimal_verifier(P, Q, 3, tol=t, method="direct")
        assert (got.status, got.tol, got.acceptance()) == (want.status, float(t), want.acceptance())
    zero = md.optimal_verifier(P, Q, 3, tol=0)
    assert zero.tol == 0.0 and zero.acceptance() == md.optimal_verifier(P, Q, 3, tol=0.0).acceptance()
    assert md.optimal_verifier(P, Q, 3, tol=None).status == "optimal"
    assert md.kseq_rho_star(P, Q, 3, tol=Fraction(1, 1000)) == md.kseq_rho_star(P, Q, 3, tol=1e-3)
