"""Booleans are refused where numbers are read.

``np.asarray([True, 5])`` is the integer array ``[1, 5]`` and ``np.asarray([0.5, False])`` the float array
``[0.5, 0.0]``, so a dtype check alone let a bool through as a count, a law entry, a token id or a draft length.
The rows marked ``regression`` were accepted (or refused as something else) at 9e81b77: ``chi2_gof`` read
``counts=[True, 50]`` as ``[1, 50]`` and a bool counts array raised ValueError; every law (``chi2_gof``,
``sample_size``, ``check_sampler``, ``alpha_k``, ...) read ``[1.0, False]`` as ``[1.0, 0.0]``; a verifier's
``conditional([True, 0])`` read token 1; ``expected_tokens(0.5, [True, 3])`` read gamma 1; ``tree_from_sglang``
read ``True`` as sibling 1.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import otspec
from otspec import testing
from otspec._validation import bool_entry
from otspec.models import MemorylessModel

P = [0.5, 0.25, 0.25]
Q = [0.25, 0.25, 0.5]


def regression(f):
    """Marks (for the reader) a test that fails at 9e81b77."""
    return f


def _first(p, q, drafts, rng):
    return drafts[0]


# ------------------------------------------------------------------------------------------------------------
# booleans
# ------------------------------------------------------------------------------------------------------------
#: (id, call, parameter named): each call holds one bool where the parameter wants numbers
BOOL_ENTRIES = [
    ("chi2_gof counts list", lambda: testing.chi2_gof([True, 50], [0.5, 0.5]), "counts"),
    ("chi2_gof counts np.True_", lambda: testing.chi2_gof([50, np.True_], [0.5, 0.5]), "counts"),
    ("chi2_gof counts tuple", lambda: testing.chi2_gof((49, False, 51), [1 / 3] * 3), "counts"),
    ("chi2_gof counts bool array", lambda: testing.chi2_gof(np.array([True, True]), [0.5, 0.5]), "counts"),
    ("chi2_gof law", lambda: testing.chi2_gof([50, 0], [1.0, False]), "law"),
    ("sample_size law", lambda: testing.sample_size(0.1, [1.0, False]), "law"),
    ("detectable_tv law", lambda: testing.detectable_tv(100, [True, 0.0]), "law"),
    ("check_sampler q", lambda: testing.check_sampler(_first, [0.5, 0.5], [1.0, False], n_samples=10, rng=0), "q"),
    ("check_sampler p", lambda: testing.check_sampler(_first, [0.5, np.False_, 0.5], Q, n_samples=10, rng=0), "p"),
    ("alpha_k p", lambda: otspec.alpha_k([1.0, False], [0.5, 0.5], 2), "p"),
    ("MemorylessModel dist", lambda: MemorylessModel([False, 1.0]), "dist"),
    ("conditional drafts", lambda: otspec.kseq(P, Q, 2).conditional([True, 0]), "drafts"),
    ("expected_tokens gamma", lambda: otspec.speculative.expected_tokens(0.5, [True, 3]), "gamma"),
    ("tree_from_sglang sibling", lambda: testing.tree_from_sglang([0, 5, 7, 2], [1, 3, -1, -1], [-1, 2, -1, True]),
     "retrive_next_sibling"),
]


@regression
@pytest.mark.parametrize("case", BOOL_ENTRIES, ids=[c[0] for c in BOOL_ENTRIES])
def test_bool_entries_are_refused_naming_the_parameter(case):
    _, call, name = case
    with pytest.raises(TypeError, match=f"`{name}`") as exc:
        call()
    assert "bool" in str(exc.value)


#: scalar arguments of otspec.testing that take no bool (these were refused at 9e81b77 too: kept)
BOOL_SCALARS = [
    ("chi2_gof alpha_fail", lambda v: testing.chi2_gof([50, 50], [0.5, 0.5], alpha_fail=v), "alpha_fail"),
    ("chi2_gof min_expected", lambda v: testing.chi2_gof([50, 50], [0.5, 0.5], min_expected=v), "min_expected"),
    ("sample_size tv", lambda v: testing.sample_size(v, 2), "tv"),
    ("sample_size power", lambda v: testing.sample_size(0.1, 2, power=v), "power"),
    ("sample_size alpha_fail", lambda v: testing.sample_size(0.1, 2, alpha_fail=v), "alpha_fail"),
    ("sample_size law", lambda v: testing.sample_size(0.1, v), "law"),
    ("detectable_tv n_samples", lambda v: testing.detectable_tv(v, 2), "n_samples"),
    ("check_sampler n_samples", lambda v: testing.check_sampler(_first, P, Q, n_samples=v, rng=0), "n_samples"),
    ("check_sampler alpha_fail", lambda v: testing.check_sampler(_first, P, Q, alpha_fail=v, rng=0), "alpha_fail"),
    ("check_sampler k", lambda v: testing.check_sampler(_first, P, Q, k=v, n_samples=10, rng=0), "k"),
]


@pytest.mark.parametrize("value", [True, np.True_], ids=repr)
@pytest.mark.parametrize("case", BOOL_SCALARS, ids=[c[0] for c in BOOL_SCALARS])
def test_bool_scalars_are_refused(case, value):
    _, call, name = case
    with pytest.raises(TypeError, match=f"`{name}`"):
        call(value)


def test_integer_lists_still_give_the_array_answers():
    """Lists of Python and NumPy ints (no bool) are read as before: the answer of the int64 array."""
    law = [0.2, 0.3, 0.5]
    want = testing.chi2_gof(np.array([21, 29, 50]), np.array(law))
    for counts in ([21, 29, 50], (21, np.int64(29), 50), [np.uint8(21), 29, np.int32(50)]):
        got = testing.chi2_gof(counts, law)
        assert (got.statistic, got.pvalue, got.dof) == (want.statistic, want.pvalue, want.dof)
    assert testing.sample_size(0.1, [0.5, 0, 0.5]) == testing.sample_size(0.1, np.array([0.5, 0.0, 0.5]))
    assert otspec.kseq(P, Q, 2).conditional([np.int64(1), 0]).tolist() == otspec.kseq(P, Q, 2).conditional(
        (1, 0)).tolist()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 9), min_size=1, max_size=12), st.data())
def test_bool_entry_finds_the_first_bool(values, data):
    """``bool_entry`` returns None on int lists and the index of the first bool inserted anywhere (also one level
    down); a check of the dtype alone (the bug) finds none."""
    assert bool_entry(values) is None and bool_entry(tuple(values)) is None
    i = data.draw(st.integers(0, len(values)))
    b = data.draw(st.sampled_from([True, False, np.True_, np.False_]))
    with_bool = values[:i] + [b] + values[i:]
    assert np.asarray(with_bool).dtype.kind == "i"  # what the dtype shows: nothing
    assert bool_entry(with_bool) == (i,)
    nested = [list(values), with_bool]
    assert bool_entry(nested) == (1, i)
    assert bool_entry([np.array(values), np.array([b])]) == (1,)
