"""Error messages: plain numbers (no numpy reprs), the row of a batched input, "did you mean" for names."""

from __future__ import annotations

import numpy as np
import pytest

import otspec
from otspec._validation import number_text


def test_numbers_are_plain_in_messages():
    assert number_text(np.float64(-0.1)) == "-0.1" and number_text(np.int64(3)) == "3"
    with pytest.raises(ValueError, match=r"`p` must be non-negative, got minimum -0\.1 at index 1$") as exc:
        otspec.alpha_k(np.array([1.1, -0.1]), np.array([0.5, 0.5]), 2)
    assert "np." not in str(exc.value)
    with pytest.raises(ValueError, match=r"`tv` must lie in \(0, 1\], got 1\.5$"):
        otspec.testing.check_sampler(lambda d, r: 0, [0.5, 0.5], [0.5, 0.5], tv=np.float64(1.5))
    with pytest.raises(ValueError, match=r"got minimum -0\.2 at prefix \(1,\), token 0$"):
        otspec.models.TableModel([np.array([0.5, 0.5]), np.array([[0.5, 0.5], [-0.2, 1.2]])])


def test_a_batched_input_error_names_the_row():
    good = np.full((3, 2), 0.5)
    neg = good.copy()
    neg[2] = [1.1, -0.1]
    with pytest.raises(ValueError, match=r"got minimum -0\.1 \(first negative entry in row \(2,\)\)"):
        otspec.alpha_k(neg, good, 2)
    off = good.copy()
    off[1] = [0.6, 0.6]
    with pytest.raises(ValueError, match=r"got row \(1,\) off by 0\.2"):
        otspec.alpha_k(good, off, 2)
    nan = np.full((2, 2, 2), 0.5)
    nan[1, 0, 1] = np.nan
    with pytest.raises(ValueError, match=r"1 non-finite entries, the first in row \(1, 0\)"):
        otspec.alpha_k(nan, np.full((2, 2, 2), 0.5), 2)


@pytest.mark.parametrize("typo,meant", [("kseg", "kseq"), ("Optimal_Verifier", "optimal"), ("topk", "top-k"),
                                         ("block_onestep", "block-onestep")])
def test_a_misspelt_verifier_name_gets_a_suggestion(typo, meant):
    with pytest.raises(ValueError, match=rf"got {typo!r} \(did you mean {meant!r}"):
        otspec.get_verifier(typo)


def test_a_name_of_the_wrong_kind_is_explained():
    with pytest.raises(ValueError, match=r"'block' is registered but is a block-level verifier not accepted here"):
        otspec.get_verifier("block", kind="token")
    with pytest.raises(ValueError, match=r"must be one of .*got 'zzz'$"):
        otspec.get_verifier("zzz")
