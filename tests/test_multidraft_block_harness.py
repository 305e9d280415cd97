"""check_block_sampler with ``k`` i.i.d. draft blocks: multi-draft block verifiers pass, broken ones fail."""

import numpy as np
import pytest

from otspec.block import MultiDraftPlanVerifier, OneTokenVerifier, make_verifier
from otspec.models import random_markov_model, random_table_model
from otspec.testing import StepError, check_block_sampler

L = 2
DRAFT, TARGET = random_markov_model(3, 1, concentration=0.5, rng=3), random_markov_model(3, 1, concentration=0.5,
                                                                                          rng=1003)


@pytest.mark.parametrize("cls", [MultiDraftPlanVerifier, OneTokenVerifier])
@pytest.mark.parametrize("boundary_coins", [False, True])
def test_multidraft_verifiers_pass_at_k2(cls, boundary_coins):
    v = cls(DRAFT, TARGET, L, 2)
    res = check_block_sampler(lambda d, rng: v.verify(d, rng=rng).output, DRAFT, TARGET, L, k=2, tv=0.05,
                              boundary_coins=boundary_coins, rng=11)
    assert res.passed, res.message
    assert res.law.shape == (27,)


def test_batched_k_draft_step_sees_k_blocks():
    v = MultiDraftPlanVerifier(DRAFT, TARGET, L, 3)
    shapes = set()

    def batched(drafts, rng):
        shapes.add(drafts.shape[1:])
        assert not drafts.flags.writeable
        return [v.verify(d, rng=rng).output for d in drafts.tolist()]

    res = check_block_sampler(batched, DRAFT, TARGET, L, k=3, n_samples=3000, batched=True, rng=12)
    assert res.passed, res.message
    assert shapes == {(3, L)}


def test_k_draft_blocks_are_iid_draft_blocks():
    # draft == target: handing back any one draft whole is lossless; splicing two drafts is not
    # (the first token of one block and the second of another lose the Markov dependence), so the
    # harness's k blocks are independent draws, not one block repeated
    seen = []

    def second(drafts, rng):
        seen.append(drafts)
        return drafts[1]

    res = check_block_sampler(second, DRAFT, DRAFT, L, k=2, tv=0.05, rng=13)
    assert res.passed, res.message
    assert all(len(d) == 2 and all(len(b) == L for b in d) for d in seen)
    assert any(d[0] != d[1] for d in seen)
    res = check_block_sampler(lambda d, rng: d[0][:1] + d[1][1:], DRAFT, DRAFT, L, k=2, tv=0.05, rng=13)
    assert not res.passed, res.message


def test_k1_is_the_one_block_harness_draw_for_draw():
    d, t = random_table_model(3, 3, rng=1), random_table_model(3, 3, rng=2)
    v = make_verifier(d, t, 2, "block")
    step = lambda b, rng: v.verify(b, rng=rng).output  # noqa: E731
    res = check_block_sampler(step, d, t, 2, tv=0.1, boundary_coins=True, rng=0)
    explicit = check_block_sampler(step, d, t, 2, k=1, tv=0.1, boundary_coins=True, rng=0)
    # counts measured with the one-block harness before ``k`` existed (same models, seed and step)
    before = [26, 25, 15, 38, 17, 37, 33, 60, 34, 9, 59, 48, 25, 34, 29, 130, 56, 65, 21, 42, 173, 168, 410, 166,
              5, 43, 108]
    for r in (res, explicit):
        assert r.passed and r.n_samples == 1876
        np.testing.assert_array_equal(np.rint(r.law * r.n_samples).astype(int), before)
        np.testing.assert_allclose(r.statistic, 25.83567437310726, rtol=1e-12, atol=0)


def test_first_draft_taken_whole_is_refuted():
    # always emit the first draft block (the target adds the bonus), no correction: the block follows p, not q
    res = check_block_sampler(lambda d, rng: d[0], DRAFT, TARGET, L, k=2, tv=0.05, rng=14)
    assert not res.passed


def test_longest_of_k_lossless_one_draft_verifications_is_refuted():
    # each draft verified by a lossless one-draft block verifier; keeping the longest acceptance is biased
    one = make_verifier(DRAFT, TARGET, L, "block")

    def longest(drafts, rng):
        outs = [one.verify(b, rng=rng) for b in drafts]
        return max(outs, key=lambda s: s.tau).output

    res = check_block_sampler(longest, DRAFT, TARGET, L, k=2, tv=0.05, rng=15)
    assert not res.passed, res.message
    # the first draft alone through the same verifier is lossless, and passes
    res = check_block_sampler(lambda d, rng: one.verify(d[0], rng=rng).output, DRAFT, TARGET, L, k=2, tv=0.05,
                              rng=15)
    assert res.passed, res.message


def test_bad_k():
    step = lambda d, rng: d[0] + (0,)  # noqa: E731
    with pytest.raises(ValueError, match=r"`k` must be an integer >= 1, got 0"):
        check_block_sampler(step, DRAFT, TARGET, L, k=0)
    with pytest.raises(TypeError, match=r"`k` must be an integer, got the float 2.0"):
        check_block_sampler(step, DRAFT, TARGET, L, k=2.0)
    with pytest.raises(TypeError, match=r"`k` must be an integer, got str"):
        check_block_sampler(step, DRAFT, TARGET, L, k="2")


def test_k_draft_step_errors_name_the_drafts():
    with pytest.raises(StepError, match=r"raised KeyError.* on drafts \(\(\d, \d\), \(\d, \d\)\)"):
        check_block_sampler(lambda d, rng: {}[d], DRAFT, TARGET, L, k=2, n_samples=500, rng=0)
    with pytest.raises(StepError, match=r"for block \(\(\d, \d\), \(\d, \d\)\) \(row 0\).*-1 padding"):
        check_block_sampler(lambda ds, rng: np.tile([0, -1, 1], (ds.shape[0], 1)), DRAFT, TARGET, L, k=2,
                            n_samples=500, batched=True, rng=0)
