"""A law whose total is off 1 is answered with the hint "pass normalize=True to rescale" only by functions that take
``normalize``: the others (which have no such option) name the parameter and its total alone."""

import inspect

import numpy as np
import pytest

import otspec
import otspec.block as blk
import otspec.lossy as lossy
import otspec.otm as otm
from otspec.testing import chi2_gof
from otspec.tree import spechub_optimum

P, Q = np.array([0.5, 0.5, 0.0]), np.array([0.2, 0.3, 0.5])
OFF = np.array([0.5, 0.5, 0.5])          # total 1.5

WITHOUT = {
    "tau_law_on_path": lambda: blk.tau_law_on_path("block", (0,), [OFF], [Q]),
    "kl_divergence": lambda: lossy.kl_divergence(OFF, Q),
    "chi2_gof": lambda: chi2_gof(np.array([5, 5, 5]), OFF),
    "expected_acceptance": lambda: otspec.speculative.expected_acceptance(OFF, Q),
    "wor_draft_prob": lambda: otm.wor_draft_prob(OFF, 2),
    "spechub_optimum": lambda: spechub_optimum(OFF, Q),
}
WITH = {
    "alpha_k": lambda: otspec.alpha_k(OFF, Q, 2),
}


@pytest.mark.parametrize("name", sorted(WITHOUT))
def test_no_hint_where_there_is_no_normalize(name):
    with pytest.raises(ValueError, match=r"must sum to 1") as err:
        WITHOUT[name]()
    assert "normalize" not in str(err.value), str(err.value)
    assert "1.5" in str(err.value)                       # the total received


@pytest.mark.parametrize("name", sorted(WITH))
def test_the_hint_where_normalize_is_taken(name):
    fn = getattr(otspec, name)
    assert "normalize" in inspect.signature(fn).parameters
    with pytest.raises(ValueError, match=r"pass normalize=True to rescale"):
        WITH[name]()
    assert np.isfinite(fn(OFF, Q, 2, normalize=True))
