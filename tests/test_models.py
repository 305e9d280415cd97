"""Autoregressive source models: tables, memoryless, Markov; joint probabilities; validation."""

import itertools
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import otspec
from otspec.models import (
    MarkovModel,
    MemorylessModel,
    Model,
    TableModel,
    conditional_tables,
    joint_from_tables,
    joint_law,
    random_markov_model,
    random_memoryless_model,
    random_table_model,
    sequence_probability,
    validate_model,
    validate_model_pair,
)


class UserModel:
    """A duck-typed model: next token = previous token with prob 0.7 (token 0 first)."""

    vocab_size = 3

    def next_dist(self, prefix):
        if not prefix:
            return np.array([1.0, 0.0, 0.0])
        d = np.full(3, 0.15)
        d[prefix[-1]] = 0.7
        return d


def test_protocol_duck_typing():
    for m in (UserModel(), MemorylessModel([0.5, 0.5]), random_table_model(2, 2, rng=0),
              random_markov_model(2, 1, rng=0)):
        assert isinstance(m, Model)
        assert validate_model(m) == m.vocab_size


def test_sequence_probability_is_product_of_conditionals():
    m = UserModel()
    assert sequence_probability(m, (0, 0, 1, 1)) == pytest.approx(1.0 * 0.7 * 0.15 * 0.7, rel=1e-15)
    assert sequence_probability(m, (1,)) == 0.0
    assert sequence_probability(m, ()) == 1.0


@pytest.mark.parametrize("V,length", [(1, 3), (2, 1), (3, 3), (4, 2)])
def test_joint_law_matches_sequence_probability(V, length):
    m = random_table_model(V, length, concentration=0.7, rng=V * 10 + length)
    J = joint_law(m, length)
    assert J.shape == (V,) * length
    np.testing.assert_allclose(J.sum(), 1.0, rtol=0, atol=1e-14)
    for x in itertools.product(range(V), repeat=length):
        np.testing.assert_allclose(J[x], sequence_probability(m, x), rtol=1e-14, atol=0)


def test_table_model_tables_and_next_dist():
    t0 = [0.5, 0.5]
    t1 = [[0.9, 0.1], [0.2, 0.8]]
    m = TableModel([t0, t1])
    assert m.max_len == 2 and m.vocab_size == 2
    np.testing.assert_array_equal(m.next_dist((0,)), [0.9, 0.1])
    with pytest.raises(ValueError, match="shorter than max_len=2"):
        m.next_dist((0, 1))
    # inputs are copied, not aliased
    a = np.array(t1)
    m2 = TableModel([t0, a])
    a[0, 0] = 0.0
    assert m2.next_dist((0,))[0] == 0.9
    assert not m2.tables[1].flags.writeable


def test_memoryless_is_iid():
    d = np.array([0.1, 0.2, 0.7])
    m = MemorylessModel(d)
    J = joint_law(m, 3)
    np.testing.assert_allclose(J, np.einsum("i,j,k->ijk", d, d, d), rtol=1e-15)


def test_markov_order_and_initial():
    T = np.array([[0.9, 0.1], [0.3, 0.7]])
    m = MarkovModel(T, initial=[[0.4, 0.6]])
    assert m.order == 1
    assert sequence_probability(m, (1, 1, 0)) == pytest.approx(0.6 * 0.7 * 0.3, rel=1e-15)
    # order 2: depends on the last two tokens only
    m2 = random_markov_model(3, 2, concentration=0.5, rng=4)
    np.testing.assert_array_equal(m2.next_dist((0, 2, 1)), m2.next_dist((1, 2, 1)))
    np.testing.assert_array_equal(m2.next_dist((2, 1)), m2.transition[2, 1])
    np.testing.assert_array_equal(m2.next_dist((2,)), m2.initial[1][2])
    # order 0 is memoryless
    m0 = random_markov_model(3, 0, rng=1)
    np.testing.assert_array_equal(m0.next_dist((1, 2)), m0.next_dist(()))
    # default initial is uniform
    mu = MarkovModel(T)
    np.testing.assert_array_equal(mu.next_dist(()), [0.5, 0.5])


def test_random_constructors_reproducible_and_concentration():
    a = random_table_model(3, 3, concentration=0.3, rng=7)
    b = random_table_model(3, 3, concentration=0.3, rng=7)
    for x, y in zip(a.tables, b.tables):
        np.testing.assert_array_equal(x, y)
    # tiny concentration: rows near point masses; huge: near uniform
    peaked = random_table_model(4, 2, concentration=0.01, rng=0)
    flat = random_table_model(4, 2, concentration=1e4, rng=0)
    assert peaked.tables[1].max(axis=-1).mean() > 0.9
    np.testing.assert_allclose(flat.tables[1], 0.25, atol=0.05)
    # extremely small concentration cannot give NaN rows
    tiny = random_table_model(3, 3, concentration=1e-300, rng=0)
    for t in tiny.tables:
        np.testing.assert_allclose(t.sum(axis=-1), 1.0, atol=1e-15)
    m = random_memoryless_model(5, concentration=2.0, rng=3)
    np.testing.assert_allclose(m.dist.sum(), 1.0, atol=1e-15)


@given(st.integers(1, 4), st.integers(1, 3), st.sampled_from([0.05, 0.5, 1.0, 20.0]), st.integers(0, 2**31))
def test_random_tables_rows_are_distributions(V, max_len, c, seed):
    m = random_table_model(V, max_len, concentration=c, rng=seed)
    for t in conditional_tables(m, max_len):
        assert np.all(t >= 0)
        np.testing.assert_allclose(t.sum(axis=-1), 1.0, rtol=0, atol=1e-12)
    np.testing.assert_allclose(joint_from_tables(m.tables).sum(), 1.0, atol=1e-12)


def test_validate_model_pair():
    assert validate_model_pair(MemorylessModel([0.5, 0.5]), MemorylessModel([0.1, 0.9])) == 2
    with pytest.raises(ValueError, match="`draft` and `target` must share one vocabulary, got vocab_size 2"):
        validate_model_pair(MemorylessModel([0.5, 0.5]), MemorylessModel([0.2, 0.3, 0.5]))
    with pytest.raises(TypeError, match="`draft` must be a model"):
        validate_model_pair([0.5, 0.5], MemorylessModel([0.5, 0.5]))


@pytest.mark.parametrize(
    "tables, match",
    [
        ([[0.5, 0.6]], "every row of `tables\\[0\\]` must sum to 1"),
        ([[0.5, 0.5], [[0.9, 0.1], [0.5, 0.6]]], "must sum to 1 within .* at prefix \\(1,\\)"),
        ([[1.5, -0.5]], "`tables\\[0\\]` must be non-negative"),
        ([[0.5, np.nan]], "`tables\\[0\\]` must be finite"),
        ([[0.5, 0.5], [0.5, 0.5]], "`tables\\[1\\]` must have shape \\(2, 2\\)"),
        ([], "non-empty sequence"),
    ],
)
def test_table_model_bad_input(tables, match):
    with pytest.raises(ValueError, match=match):
        TableModel(tables)


def test_bad_input_messages():
    with pytest.raises(ValueError, match="`dist` must sum to 1"):
        MemorylessModel([0.5, 0.4])
    with pytest.raises(ValueError, match="`transition` must have shape"):
        MarkovModel(np.full((2, 3), 1 / 3))
    with pytest.raises(ValueError, match="`initial` must hold m=1 tables"):
        MarkovModel([[0.5, 0.5], [0.5, 0.5]], initial=[])
    with pytest.raises(ValueError, match="`concentration` must be a positive"):
        random_table_model(2, 2, concentration=0.0)
    with pytest.raises(TypeError, match="`concentration` must be a positive real"):
        random_table_model(2, 2, concentration="1")
    with pytest.raises(ValueError, match="`V` must be an integer >= 1"):
        random_table_model(0, 2)
    with pytest.raises(ValueError, match="`max_len` must be an integer >= 1"):
        random_table_model(2, 0)
    with pytest.raises(ValueError, match="exceeds the stated limit"):
        random_table_model(10, 7)
    with pytest.raises(ValueError, match="`seq` must hold token ids in \\[0, 2\\), got 2"):
        sequence_probability(MemorylessModel([0.5, 0.5]), (0, 2))
    with pytest.raises(ValueError, match="exceeds the stated limit `max_entries`=100"):
        joint_law(MemorylessModel([0.5, 0.5]), 7, max_entries=100)
    with pytest.raises(ValueError, match="at most max_len=2 tokens, but length 3"):
        joint_law(random_table_model(2, 2, rng=0), 3)


def test_user_model_rows_checked():
    class Bad:
        vocab_size = 2

        def next_dist(self, prefix):
            return np.array([0.5, 0.6]) if prefix else np.array([0.5, 0.5])

    with pytest.raises(ValueError, match="`model.next_dist\\(\\(0,\\)\\)` must sum to 1"):
        joint_law(Bad(), 2)

    class WrongShape:
        vocab_size = 3

        def next_dist(self, prefix):
            return np.array([0.5, 0.5])

    with pytest.raises(ValueError, match="must have shape \\(3,\\)"):
        sequence_probability(WrongShape(), (0,))


def test_exported_at_top_level():
    for name in ("Model", "TableModel", "MemorylessModel", "MarkovModel", "random_table_model",
                 "random_markov_model", "sequence_probability", "joint_law", "validate_model_pair"):
        assert getattr(otspec, name) is getattr(otspec.models, name)
    assert math.isclose(otspec.sequence_probability(MemorylessModel([0.25, 0.75]), (1,)), 0.75)
