"""Input validation at the public entry points: clear errors, never a wrong answer, no mutation."""

import numpy as np
import pytest

import otspec
from otspec._validation import as_rng, validate_distribution, validate_drafts, validate_ks


@pytest.mark.parametrize(
    "bad, exc, match",
    [
        ([[0.5, 0.5]], ValueError, r"`p` must be 1-D"),
        ([], ValueError, r"`p` must be non-empty"),
        ([0.5, np.nan], ValueError, r"`p` must be finite"),
        ([1.5, -0.5], ValueError, r"`p` must be non-negative"),
        ([0.5, 0.4], ValueError, r"`p` must sum to 1 within 1e-09, got 0.9"),
        ("ab", TypeError, r"`p` must be a 1-D array_like"),
        (None, TypeError, r"`p` must be a 1-D array_like"),
        ([1j, 0], TypeError, r"`p` must be"),
    ],
)
def test_alpha_k_rejects_bad_p(bad, exc, match):
    with pytest.raises(exc, match=match):
        otspec.alpha_k(bad, [0.5, 0.5], 2)


def test_bad_q_is_named():
    with pytest.raises(ValueError, match=r"`q` must sum to 1"):
        otspec.alpha_k([0.5, 0.5], [0.5, 0.6], 1)


def test_length_mismatch():
    with pytest.raises(ValueError, match=r"`p` and `q` must have the same length, got 2 and 3"):
        otspec.alpha_k([0.5, 0.5], [0.2, 0.3, 0.5], 1)


@pytest.mark.parametrize(
    "k, exc, match",
    [
        (0, ValueError, r"`k` must be an integer >= 1, got 0"),
        (-3, ValueError, r"`k` must be an integer >= 1"),
        (2.0, TypeError, r"`k` must be an integer, got the float 2.0"),
        ("2", TypeError, r"`k` must be an integer"),
        (True, TypeError, r"`k` must be an integer"),
        ([], ValueError, r"non-empty sequence"),
        ([1, 0], ValueError, r"`k` must be an integer >= 1"),
    ],
)
def test_bad_k(k, exc, match):
    with pytest.raises(exc, match=match):
        otspec.alpha_k([0.5, 0.5], [0.5, 0.5], k)


def test_bad_method():
    with pytest.raises(ValueError, match=r"`method` must be one of"):
        otspec.alpha_k([0.5, 0.5], [0.5, 0.5], 1, method="simplex")


def test_normalize_opt_in():
    a = otspec.alpha_k([3.0, 1.0], [1.0, 3.0], 2, normalize=True)
    np.testing.assert_allclose(a, otspec.alpha_k([0.75, 0.25], [0.25, 0.75], 2), rtol=0, atol=1e-15)
    with pytest.raises(ValueError, match=r"positive total"):
        otspec.alpha_k([0.0, 0.0], [0.5, 0.5], 1, normalize=True)


def test_inputs_never_mutated_or_aliased():
    p = np.array([0.2, 0.3, 0.5])
    q = np.array([0.5, 0.25, 0.25])
    p0, q0 = p.copy(), q.copy()
    otspec.alpha_k(p, q, [1, 3])
    otspec.otm_lp(p, q, 2)
    v = otspec.maximal_coupling(p, q)
    assert v.p is not p and not np.shares_memory(v.p, p)
    np.testing.assert_array_equal(p, p0)
    np.testing.assert_array_equal(q, q0)
    pn = np.array([2.0, 3.0, 5.0])
    otspec.alpha_k(pn, q, 1, normalize=True)
    np.testing.assert_array_equal(pn, [2.0, 3.0, 5.0])


def test_validated_arrays_are_read_only_copies():
    x = [0.5, 0.5]
    arr = validate_distribution(x, "p")
    assert arr.dtype == np.float64 and not arr.flags.writeable


def test_validate_ks_forms():
    ks, scalar = validate_ks(np.int64(3))
    assert scalar and ks.tolist() == [3]
    ks, scalar = validate_ks(np.array([1, 2]))
    assert not scalar and ks.tolist() == [1, 2]
    with pytest.raises(TypeError, match=r"`k` must be an integer or a sequence"):
        validate_ks(object())


@pytest.mark.parametrize(
    "drafts, exc, match",
    [
        ([0], ValueError, r"`drafts` must be a sequence of k=2 token ids"),
        ([0, 5], ValueError, r"`drafts` must be token ids in \[0, 3\)"),
        ([0, -1], ValueError, r"token ids in"),
        ([0.0, 1.0], TypeError, r"integer token ids, got floats"),
        (["a", "b"], TypeError, r"integer token ids"),
    ],
)
def test_validate_drafts(drafts, exc, match):
    with pytest.raises(exc, match=match):
        validate_drafts(drafts, 2, 3)


def test_rng():
    g = np.random.default_rng(1)
    assert as_rng(g) is g
    assert isinstance(as_rng(3), np.random.Generator)
    assert isinstance(as_rng(None), np.random.Generator)
    with pytest.raises(TypeError, match=r"`rng` must be"):
        as_rng("seed")
    with pytest.raises(TypeError, match=r"`rng` must be"):
        as_rng(True)
