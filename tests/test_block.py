"""Block verification: exactness (lossless), Theorems 1-2, the block-OT LP, samplers, bad input."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import otspec
import otspec.block
from otspec.block import (
    VERIFIERS,
    BlockVerify,
    BlockVerifyOneStep,
    TokenVerify,
    bernoulli_block_length,
    bernoulli_token_length,
    check_lossless,
    expected_length,
    make_verifier,
    ot_optimum,
    theorem1_length,
    theorem2_length,
)
from otspec.models import (
    MarkovModel,
    MemorylessModel,
    TableModel,
    joint_law,
    random_markov_model,
    random_table_model,
    sequence_probability,
)
from otspec.testing import chi2_gof

NAMES = ("token", "block-onestep", "block")
TOL = 1e-12


def _random_pair(seed):
    """A random (draft, target) pair of table or Markov models with V <= 4, L <= 4."""
    rng = np.random.default_rng(seed)
    V = int(rng.integers(1, 5))
    L = int(rng.integers(1, 5))
    c = float(rng.choice([0.05, 0.3, 1.0, 10.0]))
    kind = seed % 3
    if kind == 0:
        s = random_table_model(V, L + 1, concentration=c, rng=rng)
        b = random_table_model(V, L + 1, concentration=c, rng=rng)
    elif kind == 1:
        s = random_markov_model(V, int(rng.integers(0, 3)), concentration=c, rng=rng)
        b = random_markov_model(V, int(rng.integers(0, 3)), concentration=c, rng=rng)
    else:  # table draft against a Markov target
        s = random_table_model(V, L + 1, concentration=c, rng=rng)
        b = random_markov_model(V, 1, concentration=c, rng=rng)
    return s, b, L


def _point(V, i):
    d = np.zeros(V)
    d[i] = 1.0
    return d


# special pairs: p == q, disjoint supports, point masses, zeros, ties, tiny probabilities
SPECIAL = [
    ("equal", MemorylessModel([0.2, 0.3, 0.5]), MemorylessModel([0.2, 0.3, 0.5]), 3),
    ("disjoint", MemorylessModel([0.5, 0.5, 0.0]), MemorylessModel([0.0, 0.0, 1.0]), 3),
    ("point-masses", MemorylessModel(_point(3, 0)), MemorylessModel(_point(3, 1)), 2),
    ("same-point", MemorylessModel(_point(2, 1)), MemorylessModel(_point(2, 1)), 4),
    ("V=1", MemorylessModel([1.0]), MemorylessModel([1.0]), 3),
    ("tiny", MemorylessModel([1 - 1e-300, 1e-300]), MemorylessModel([0.5, 0.5]), 3),
    ("zeros-markov", MarkovModel([[1.0, 0.0], [0.5, 0.5]], initial=[[0.5, 0.5]]),
     MarkovModel([[0.0, 1.0], [0.3, 0.7]], initial=[[0.0, 1.0]]), 3),
    ("ties", MemorylessModel([0.25, 0.25, 0.5]), MemorylessModel([0.5, 0.25, 0.25]), 3),
]


# ---------------------------------------------------------------------------
# exactness: lossless output law
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(24))
def test_lossless_random_models(seed):
    s, b, L = _random_pair(seed)
    for name in NAMES:
        assert check_lossless(s, b, L, name).max_error <= TOL
        assert check_lossless(s, b, L, name, bonus=False).max_error <= TOL


@pytest.mark.parametrize("label,s,b,L", SPECIAL, ids=[c[0] for c in SPECIAL])
def test_lossless_special_pairs(label, s, b, L):
    for name in NAMES:
        assert check_lossless(s, b, L, name).max_error <= TOL


@settings(max_examples=30)
@given(st.integers(1, 3), st.integers(1, 3), st.sampled_from([0.02, 0.5, 3.0]), st.integers(0, 2**31))
def test_lossless_hypothesis(V, L, c, seed):
    s = random_table_model(V, L + 1, concentration=c, rng=seed)
    b = random_table_model(V, L + 1, concentration=c, rng=seed + 1)
    for name in NAMES:
        assert check_lossless(s, b, L, name).max_error <= TOL


def test_output_law_independent_of_check_lossless():
    """The output law against joint_law (built only from the target's conditionals)."""
    s, b, L = _random_pair(4)
    ref = joint_law(b, L + 1)
    for name in NAMES:
        law = make_verifier(s, b, L, name).output_law()
        np.testing.assert_allclose(law, ref, rtol=0, atol=TOL)


# ---------------------------------------------------------------------------
# expected lengths: enumeration vs Theorems 1-2, ordering, the LP
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(24))
def test_lengths_equal_theorems_and_ordering(seed):
    s, b, L = _random_pair(seed)
    tok = expected_length(s, b, L, "token")
    one = expected_length(s, b, L, "block-onestep")
    blk = expected_length(s, b, L, "block")
    np.testing.assert_allclose(blk, theorem1_length(s, b, L), rtol=0, atol=TOL)
    np.testing.assert_allclose(tok, theorem2_length(s, b, L), rtol=0, atol=TOL)
    assert tok <= one + TOL
    assert one <= blk + TOL
    assert 0.0 <= tok and blk <= L + TOL


@pytest.mark.parametrize("label,s,b,L", SPECIAL, ids=[c[0] for c in SPECIAL])
def test_lengths_special_pairs(label, s, b, L):
    lens = [expected_length(s, b, L, n) for n in NAMES]
    np.testing.assert_allclose(lens[2], theorem1_length(s, b, L), rtol=0, atol=TOL)
    np.testing.assert_allclose(lens[0], theorem2_length(s, b, L), rtol=0, atol=TOL)
    assert lens[0] <= lens[1] + TOL <= lens[2] + 2 * TOL
    if label in ("equal", "same-point", "V=1"):
        np.testing.assert_allclose(lens, [L] * 3, rtol=0, atol=TOL)
    if label in ("disjoint", "point-masses"):
        np.testing.assert_allclose(lens, [0.0] * 3, rtol=0, atol=TOL)


@pytest.mark.parametrize("seed", [0, 1, 2, 5, 7, 9, 11, 13])
def test_ot_optimum_equals_theorem1(seed):
    rng = np.random.default_rng(100 + seed)
    V, L = [(2, 1), (2, 2), (3, 1), (2, 3), (3, 2), (4, 1), (2, 4), (3, 3)][seed % 8]
    c = float(rng.choice([0.2, 1.0, 5.0]))
    s = random_table_model(V, L, concentration=c, rng=rng)
    b = random_table_model(V, L, concentration=c, rng=rng)
    res = ot_optimum(s, b, L)
    assert res.success and res.status == "optimal"
    assert res.n_variables == V ** (2 * L)
    np.testing.assert_allclose(res.value, theorem1_length(s, b, L), rtol=0, atol=1e-9)
    # the plan is a coupling of the two joint laws
    np.testing.assert_allclose(res.plan.sum(axis=1), joint_law(s, L).ravel(), atol=1e-9)
    np.testing.assert_allclose(res.plan.sum(axis=0), joint_law(b, L).ravel(), atol=1e-9)


def test_block_verify_plan_is_feasible_for_the_lp():
    """BlockVerify's coupling (X^L, Y^L) attains the LP value: E[beta] = E[tau] exactly."""
    s = random_table_model(2, 3, concentration=0.5, rng=3)
    b = random_table_model(2, 3, concentration=0.5, rng=4)
    L = 2
    v = BlockVerify(s, b, L)
    # enumerate the joint law of (X^L, Y^L) from the exact pieces, then E[common prefix]
    T = v._tables(False)
    beta_mass = 0.0
    for x in itertools.product(range(2), repeat=L):
        px = sequence_probability(s, x)
        cond = v.tau_given_block(x)
        for t in range(L + 1):
            w = px * cond[t]
            if w == 0:
                continue
            if t == L:
                beta_mass += w * L
                continue
            # the first continuation token differs from x_{t+1} (residual support), so beta = t
            cont = v._continuation(T, t)[0][x[:t]]
            assert cont[x[t]] == 0.0 or w * cont[x[t]] < 1e-15
            beta_mass += w * t
    np.testing.assert_allclose(beta_mass, ot_optimum(s, b, L).value, atol=1e-9)


def test_toy_anchor():
    """docs/guide/block.rst toy anchor: draft (2/3, 1/3), target (1/3, 2/3), L = 2 -> 10/9, 11/9, 12/9."""
    s, b = MemorylessModel([2 / 3, 1 / 3]), MemorylessModel([1 / 3, 2 / 3])
    got = [expected_length(s, b, 2, n) for n in NAMES]
    np.testing.assert_allclose(got, [10 / 9, 11 / 9, 12 / 9], rtol=0, atol=1e-15)
    np.testing.assert_allclose(ot_optimum(s, b, 2).value, 12 / 9, atol=1e-10)
    np.testing.assert_allclose(
        [expected_length(s, b, 2, n, include_bonus=True) for n in NAMES], [19 / 9, 20 / 9, 21 / 9], atol=1e-15
    )


# ---------------------------------------------------------------------------
# memoryless Bernoulli closed forms
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("p", [0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0])
@pytest.mark.parametrize("L", [1, 2, 5, 8])
def test_bernoulli_closed_forms_vs_enumeration(p, L):
    q = 0.75
    s, b = MemorylessModel([1 - p, p]), MemorylessModel([1 - q, q])
    np.testing.assert_allclose(bernoulli_token_length(p, q, L), expected_length(s, b, L, "token"),
                               rtol=0, atol=TOL)
    np.testing.assert_allclose(bernoulli_block_length(p, q, L), expected_length(s, b, L, "block"),
                               rtol=0, atol=TOL)
    np.testing.assert_allclose(bernoulli_block_length(p, q, L, include_bonus=True),
                               bernoulli_block_length(p, q, L) + 1, rtol=0, atol=1e-15)
    np.testing.assert_allclose(bernoulli_token_length(p, q, L, include_bonus=True),
                               sum((1 - abs(p - q)) ** i for i in range(L + 1)), rtol=1e-15)
    if p != q:
        assert bernoulli_block_length(p, q, L) >= bernoulli_token_length(p, q, L) - 1e-15
        if L >= 2 and 0 < p < 1:
            assert bernoulli_block_length(p, q, L) > bernoulli_token_length(p, q, L) + 1e-6


def test_bernoulli_gap_grows_with_L():
    """arXiv:2403.10444, Figure 2: for p != q the block-token gap increases with L."""
    for p in (0.25, 0.5, 0.6, 0.9):
        gaps = [bernoulli_block_length(p, 0.75, L) - bernoulli_token_length(p, 0.75, L) for L in range(1, 12)]
        assert gaps[0] == pytest.approx(0.0, abs=1e-15)
        assert all(b2 > b1 for b1, b2 in zip(gaps, gaps[1:]))


# ---------------------------------------------------------------------------
# samplers: chi-square against the exact laws
# ---------------------------------------------------------------------------

# 12 chi-square tests below at alpha_fail = 1e-4: spurious failure probability <= 1.2e-3 (fixed seeds).
ALPHA_FAIL = 1e-4
N_SAMPLES = 6000


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("case", ["table", "markov"])
def test_sampler_tau_chi2(name, case):
    if case == "table":
        s = random_table_model(3, 4, concentration=0.7, rng=11)
        b = random_table_model(3, 4, concentration=0.7, rng=12)
    else:
        s = random_markov_model(2, 2, concentration=0.5, rng=21)
        b = random_markov_model(2, 1, concentration=0.5, rng=22)
    v = make_verifier(s, b, 3, name)
    taus = v.sample_tau(N_SAMPLES, rng=1234)
    res = chi2_gof(np.bincount(taus, minlength=4), v.tau_law(), alpha_fail=ALPHA_FAIL)
    assert res.passed, res


@pytest.mark.parametrize("name", NAMES)
def test_sampler_output_chi2(name):
    """The sampled output sequence (L + 1 tokens) follows the target's joint law."""
    s = random_table_model(2, 4, concentration=0.6, rng=31)
    b = random_table_model(2, 4, concentration=0.6, rng=32)
    v = make_verifier(s, b, 3, name)
    gen = np.random.default_rng(99)
    outs = np.array([v.sample(rng=gen).output for _ in range(N_SAMPLES)])
    idx = np.ravel_multi_index(outs.T, (2,) * 4)
    res = chi2_gof(np.bincount(idx, minlength=16), joint_law(b, 4).ravel(), alpha_fail=ALPHA_FAIL)
    assert res.passed, res


@pytest.mark.parametrize("name", NAMES)
def test_verify_on_fixed_block_chi2(name):
    """verify(block) follows tau_given_block(block) (the path route vs the enumeration tables)."""
    s = random_table_model(3, 4, concentration=0.8, rng=41)
    b = random_table_model(3, 4, concentration=0.8, rng=42)
    v = make_verifier(s, b, 3, name)
    law = v.tau_given_block((1, 0, 2))
    gen = np.random.default_rng(5)
    taus = [v.verify((1, 0, 2), rng=gen).tau for _ in range(N_SAMPLES)]
    res = chi2_gof(np.bincount(taus, minlength=4), law, alpha_fail=ALPHA_FAIL)
    assert res.passed, res


def test_step_shapes_and_reproducibility():
    s = random_table_model(3, 4, concentration=0.5, rng=1)
    b = random_table_model(3, 4, concentration=0.5, rng=2)
    for name in NAMES:
        v = make_verifier(s, b, 3, name)
        a1, a2 = v.sample(rng=7), v.sample(rng=7)
        assert a1 == a2
        assert len(a1.output) == 4 and a1.output[: a1.tau] == a1.block[: a1.tau]
        st_ = v.verify(a1.block, rng=3)
        assert st_.output == a1.block[: st_.tau] + st_.emitted
        if name == "block" and st_.tau < 3:
            assert len(st_.emitted) == 3 + 1 - st_.tau
        elif name != "block":
            assert len(st_.emitted) == 1


def test_rejected_token_never_reemitted_by_token_and_onestep():
    """After tau < L the correction differs from the rejected draft token (beta = tau)."""
    s = random_table_model(3, 3, concentration=0.5, rng=8)
    b = random_table_model(3, 3, concentration=0.5, rng=9)
    for name in ("token", "block-onestep"):
        v = make_verifier(s, b, 2, name)
        gen = np.random.default_rng(0)
        for _ in range(300):
            smp = v.sample(rng=gen)
            if smp.tau < 2:
                assert smp.output[smp.tau] != smp.block[smp.tau]


# ---------------------------------------------------------------------------
# API and bad input
# ---------------------------------------------------------------------------


def test_module_access():
    assert otspec.block is otspec.block
    assert "block" in otspec.__all__
    assert set(VERIFIERS) == set(NAMES)
    assert VERIFIERS["token"] is TokenVerify and VERIFIERS["block-onestep"] is BlockVerifyOneStep
    for name in otspec.block.__all__:
        assert hasattr(otspec.block, name)


def test_tau_law_sums_to_one_and_expected_length_consistent():
    s, b, L = _random_pair(3)
    for name in NAMES:
        v = make_verifier(s, b, L, name)
        law = v.tau_law()
        np.testing.assert_allclose(law.sum(), 1.0, atol=1e-14)
        assert np.all(law >= -1e-16)
        np.testing.assert_allclose(v.expected_length(), float(np.arange(L + 1) @ law), atol=1e-14)
        np.testing.assert_allclose(v.expected_length(include_bonus=True), v.expected_length() + 1, atol=1e-15)


class _NoLen:
    vocab_size = 2

    def next_dist(self, prefix):
        return np.array([0.5, 0.5])


class _BadRow:
    vocab_size = 2

    def next_dist(self, prefix):
        return np.array([0.5, 0.7]) if len(prefix) == 1 else np.array([0.5, 0.5])


def test_bad_input():
    s, b = MemorylessModel([0.5, 0.5]), MemorylessModel([0.2, 0.8])
    with pytest.raises(ValueError, match="`L` must be an integer >= 1, got 0"):
        expected_length(s, b, 0)
    with pytest.raises(TypeError, match="`L` must be an integer"):
        expected_length(s, b, 2.0)
    with pytest.raises(ValueError, match="share one vocabulary"):
        check_lossless(s, MemorylessModel([0.2, 0.3, 0.5]), 2, "token")
    with pytest.raises(ValueError, match="`verifier` must be one of"):
        expected_length(s, b, 2, "blocks")
    with pytest.raises(TypeError, match="`verifier` must be one of"):
        expected_length(s, b, 2, 3)
    with pytest.raises(ValueError, match="built for other models"):
        expected_length(s, b, 3, TokenVerify(s, b, 2))
    with pytest.raises(ValueError, match="every row of `tables\\[1\\]` must sum to 1"):
        TableModel([[0.5, 0.5], [[0.5, 0.5], [0.1, 0.1]]])
    with pytest.raises(ValueError, match="`draft.next_dist\\(\\(0,\\)\\)` must sum to 1"):
        expected_length(_BadRow(), _NoLen(), 2, "block")
    with pytest.raises(ValueError, match="`target.next_dist\\(\\(0,\\)\\)` must sum to 1"):
        check_lossless(_NoLen(), _BadRow(), 2, "token")
    with pytest.raises(ValueError, match="exceeds the stated limit `max_entries`=1000"):
        expected_length(MemorylessModel(np.full(4, 0.25)), MemorylessModel(np.full(4, 0.25)), 6,
                        max_entries=1000)
    with pytest.raises(ValueError, match="exceeds the stated limit `max_entries`"):
        theorem1_length(s, b, 30)
    with pytest.raises(ValueError, match="`max_variables`"):
        ot_optimum(s, b, 10)
    with pytest.raises(ValueError, match="`block` must hold L=2 token ids, got 3"):
        TokenVerify(s, b, 2).verify((0, 1, 1))
    with pytest.raises(ValueError, match="`block` must hold token ids in \\[0, 2\\)"):
        TokenVerify(s, b, 2).verify((0, 5))
    with pytest.raises(TypeError, match="`include_bonus` must be a bool"):
        expected_length(s, b, 2, include_bonus=1)
    with pytest.raises(ValueError, match="`p` must lie in \\[0, 1\\]"):
        bernoulli_token_length(1.5, 0.5, 3)
    with pytest.raises(ValueError, match="`L` must be an integer >= 1"):
        bernoulli_block_length(0.5, 0.5, 0)
    # too-short table models are refused before any work
    short = random_table_model(2, 2, rng=0)
    with pytest.raises(ValueError, match="at most max_len=2 tokens, but a block of `L`=3"):
        BlockVerify(short, short, 3)
    with pytest.raises(ValueError, match="pass bonus=False or a longer target"):
        check_lossless(short, short, 2, "block")
    assert check_lossless(short, short, 2, "block", bonus=False).max_error <= TOL


def test_enumeration_refused_before_any_model_call():
    calls = []

    class Counting:
        vocab_size = 4

        def next_dist(self, prefix):
            calls.append(prefix)
            return np.full(4, 0.25)

    with pytest.raises(ValueError, match="exceeds the stated limit"):
        expected_length(Counting(), Counting(), 8, "token", max_entries=10_000)
    with pytest.raises(ValueError, match="exceeds the stated limit"):
        check_lossless(Counting(), Counting(), 7, "block", max_entries=10_000)
    assert calls == []


def test_inputs_not_mutated():
    d = np.array([0.3, 0.7])
    s = MemorylessModel(d)
    b = MemorylessModel([0.6, 0.4])
    expected_length(s, b, 3, "block")
    np.testing.assert_array_equal(d, [0.3, 0.7])


def test_onestep_tau_is_max_not_first_failure():
    """tau = max{i : eta_i <= h_i}: a later success counts even after an early failure."""
    s, b = MemorylessModel([2 / 3, 1 / 3]), MemorylessModel([1 / 3, 2 / 3])
    v = BlockVerifyOneStep(s, b, 2)
    law = v.tau_given_block((0, 1))
    # p_1 = 1/2, p_2 = min(1/2 * 2, 1) = 1, so h_2 = 1: tau = 2 surely for block (0, 1)
    np.testing.assert_allclose(law, [0.0, 0.0, 1.0], atol=1e-15)
    # block (0, 0): p_1 = 1/2, Z_1 = 0 so h_1 = 0; p_2 = h_2 = 1/4
    np.testing.assert_allclose(v.tau_given_block((0, 0)), [0.75, 0.0, 0.25], atol=1e-15)


def test_tau_law_on_path_equals_enumeration_tables():
    """The law of tau from the conditionals logged along one block (what decoding uses) = enumeration."""
    L = 3
    for seed in range(4):
        dm = random_table_model(3, L, rng=seed, concentration=1.0)
        tm = random_table_model(3, L + 1, rng=100 + seed, concentration=1.0)
        for name in NAMES:
            v = make_verifier(dm, tm, L, name)
            for block in [(0, 1, 2), (2, 2, 0), (1, 0, 1)]:
                cs = [dm.next_dist(block[:i]) for i in range(L)]
                cb = [tm.next_dist(block[:i]) for i in range(L)]
                want = v.tau_given_block(block)
                np.testing.assert_allclose(otspec.block.tau_law_on_path(name, block, cs, cb), want, atol=1e-13)
                np.testing.assert_allclose(v.tau_law_on_path(block), want, atol=1e-13)
