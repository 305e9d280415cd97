"""otspec.testing.check_sampler / check_block_sampler: the contract of the harness, its power and its errors.

False-failure budget: every check of a correct sampler here runs at alpha_fail <= 1e-4 with a fixed seed;
with ~40 such checks the file fails spuriously with probability <= 4e-3 over seeds (union bound), and
never for the seeds written here (they are fixed).
"""

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings

from otspec.block import make_verifier
from otspec.models import MemorylessModel, random_table_model
from otspec.testing import (
    BOUNDARY_FRACTION,
    MAX_SAMPLES,
    BoundaryCoins,
    StepError,
    check_block_sampler,
    check_sampler,
    chi2_gof,
    detectable_tv,
    processed_law,
    sample_size,
    seed_for,
)
from otspec.testing.strategies import pairs, sampling_laws

P = np.array([0.5, 0.3, 0.2, 0.0])
Q = np.array([0.1, 0.3, 0.4, 0.2])


def speculative_step(p, q, *, strict=True):
    """Leviathan et al. (ICML 2023) Algorithm 1 for one draft, batched, in numpy (p draft, q target)."""
    res = np.maximum(q - p, 0.0)
    res = res / res.sum() if res.sum() > 0 else q
    cum = np.cumsum(res)

    def step(drafts, rng):
        x = drafts[:, 0]
        u = rng.random(x.shape[0])
        accept = u * p[x] < q[x] if strict else u * p[x] <= q[x]
        y = np.minimum(np.searchsorted(cum, rng.random(x.shape[0]) * cum[-1], side="right"), len(q) - 1)
        return np.where(accept, x, y)

    return step


def one_at_a_time(batched_step):
    return lambda drafts, rng: int(batched_step(np.array([drafts]), rng)[0])


# ---------------------------------------------------------------------------
# the sample-size rule and its power
# ---------------------------------------------------------------------------


def test_sample_size_rule_matches_the_noncentral_chi2():
    from scipy import stats

    for tv, C in [(0.1, 2), (0.02, 5), (0.01, 10)]:
        N = sample_size(tv, C)
        crit = stats.chi2.isf(1e-4, C - 1)
        assert stats.ncx2.sf(crit, C - 1, 4 * N * tv**2) >= 0.99
        assert stats.ncx2.sf(crit, C - 1, 4 * (N - 1) * tv**2) < 0.99
        assert detectable_tv(N, C) <= tv < detectable_tv(N - 1, C)
    # N grows as 1/tv^2; a single cell of positive probability is tested on its support alone
    assert sample_size(0.001, 2) == pytest.approx(sample_size(0.01, 2) * 100, rel=1e-3)
    assert sample_size(0.02, [1.0, 0.0]) == int(np.ceil(np.log(0.01) / np.log(0.98)))


def test_sample_size_pools_sparse_cells_at_a_fixed_point():
    law = np.array([0.5, 0.4] + [0.1 / 200] * 200)
    N = sample_size(0.05, law)
    assert N * law[2:].max() < 5  # the 200 sparse cells are pooled at N: two cells + one pooled cell
    assert sample_size(0.05, np.full(201, 1 / 201)) > 3 * N
    assert N == sample_size(0.05, 3)


@pytest.mark.parametrize("tv,C", [(0.1, 2), (0.1, 6), (0.05, 20)])
def test_power_is_at_least_099_against_the_least_favourable_law(tv, C):
    # r = q (1 +- 2 tv) on two halves of equal q-mass reaches chi2(r||q) = 4 tv^2 (equality in Cauchy-Schwarz)
    q = np.full(C, 1.0 / C)
    r = q * np.where(np.arange(C) < C // 2, 1 + 2 * tv, 1 - 2 * tv)
    N = sample_size(tv, q)
    rng = np.random.default_rng(11)
    runs = 600
    detected = sum(not chi2_gof(c, q).passed for c in rng.multinomial(N, r, size=runs))
    # Binomial(600, 0.99): mean 594, sd 2.4; the approximation is asymptotic, so allow 8 sd
    assert detected >= runs * 0.99 - 20


def test_false_failure_rate_of_check_sampler_is_alpha():
    q = np.array([0.2, 0.3, 0.5])
    step = speculative_step(q, q)
    fails = sum(not check_sampler(step, q, q, n_samples=2000, batched=True, alpha_fail=0.1, rng=s).passed
                for s in range(300))
    assert 12 <= fails <= 50  # Binomial(300, 0.1): mean 30, sd 5.2


# ---------------------------------------------------------------------------
# the harness's own draws
# ---------------------------------------------------------------------------


def test_drafts_follow_p_iid_and_without_replacement():
    p = np.array([0.4, 0.3, 0.2, 0.1])
    for i in range(3):
        res = check_sampler(lambda d, rng, i=i: d[:, i], p, p, k=3, batched=True, rng=1)
        assert res.passed, res.message
    # sequential without replacement: the second draft has law sum_i p_i p_j / (1 - p_i), j != i
    second = np.array([sum(p[i] * p[j] / (1 - p[i]) for i in range(4) if i != j) for j in range(4)])
    res = check_sampler(lambda d, rng: d[:, 1], p, second, k=2, replacement=False, batched=True, rng=2)
    assert res.passed, res.message
    rows = []
    check_sampler(lambda d, rng: rows.append(d) or d[:, 0], p, p, k=4, replacement=False, batched=True,
                  n_samples=500, rng=3)
    assert all((np.sort(r, axis=1) == np.arange(4)).all() for r in rows)  # all four distinct, every time


@settings(max_examples=60, derandomize=True, deadline=None)
@given(pq=pairs(max_n=8, near_equal=True))
def test_alias_table_is_the_draft_law_exactly(pq):
    # the column law of Walker's alias table, enumerated: p within rounding, zeros of p never drawn
    from otspec.testing._sampler import _alias_table

    p = pq[0]
    prob, alias = _alias_table(p)
    law = prob / p.size
    np.add.at(law, alias, (1.0 - prob) / p.size)
    assert np.all(law[p == 0] == 0)
    np.testing.assert_allclose(law, p, rtol=0, atol=4 * np.finfo(float).eps)


def test_batched_and_one_at_a_time_agree_and_rerun_deterministically():
    step = speculative_step(P, Q)
    a = check_sampler(step, P, Q, batched=True, rng=5)
    b = check_sampler(step, P, Q, batched=True, rng=5)
    c = check_sampler(one_at_a_time(step), P, Q, n_samples=3000, rng=5)
    assert a.passed and c.passed, (a.message, c.message)
    np.testing.assert_array_equal(a.law, b.law)
    assert a.n_samples == sample_size(0.02, Q) and a.detectable_tv <= 0.02
    assert a.method == "sampling" and a.n_cases == a.n_samples and a.target_law.tolist() == Q.tolist()
    assert "passed" in a.message and "SamplerCheck(passed=True" in repr(a)


def test_a_wrong_law_fails_with_its_tv_estimated():
    wrong = speculative_step(P, np.array([0.2, 0.3, 0.3, 0.2]))
    res = check_sampler(wrong, P, Q, batched=True, rng=6)
    assert not res.passed and res.pvalue < 1e-4 and "differs from the target" in res.message
    assert res.tv_estimate == pytest.approx(0.1, abs=0.01)


def test_torch_outputs_are_accepted():
    torch = pytest.importorskip("torch")
    step = speculative_step(P, Q)
    res = check_sampler(lambda d, rng: torch.from_numpy(step(d, rng)), P, Q, batched=True, rng=7)
    assert res.passed
    res = check_sampler(lambda d, rng: torch.tensor(int(step(np.array([d]), rng)[0])), P, Q,
                        n_samples=2000, rng=7)
    assert res.passed


# ---------------------------------------------------------------------------
# boundary coins
# ---------------------------------------------------------------------------


def test_boundary_coins_generator():
    coins = BoundaryCoins(np.random.PCG64(0))
    assert isinstance(coins, np.random.Generator) and np.random.default_rng(coins) is coins
    u = coins.random(200_000)
    top = np.nextafter(1.0, 0.0)
    frac = np.mean((u == 0.0) | (u == top))
    assert frac == pytest.approx(BOUNDARY_FRACTION, abs=0.01) and np.all((u >= 0) & (u < 1))
    assert np.mean(u == 0.0) == pytest.approx(BOUNDARY_FRACTION / 2, abs=0.01)
    u32 = coins.random(10_000, dtype=np.float32)
    assert u32.dtype == np.float32 and (u32 == np.nextafter(np.float32(1), np.float32(0))).any()
    assert {coins.random() for _ in range(200)} >= {0.0, top}
    assert 0 <= coins.integers(10) < 10  # other methods are honest


def test_non_strict_coin_is_invisible_to_frequencies_and_caught_by_boundary_coins():
    # q(3) = 0 < p(3): `u * p <= q` accepts token 3 when u == 0.0 (SGLang issue #35771)
    p, q = np.array([0.25, 0.25, 0.25, 0.25]), np.array([0.4, 0.3, 0.3, 0.0])
    loose = speculative_step(p, q, strict=False)
    assert check_sampler(loose, p, q, batched=True, rng=8).passed
    res = check_sampler(loose, p, q, batched=True, boundary_coins=True, rng=8)
    assert not res.passed and res.boundary_outside > 0 and res.violation.output == 3
    assert res.violation.phase == "boundary" and res.violation.drafts == (3,)
    assert "outside the target's support" in res.message
    strict = check_sampler(speculative_step(p, q), p, q, batched=True, boundary_coins=True, rng=8)
    assert strict.passed and strict.n_boundary == strict.n_samples and strict.boundary_outside == 0


# ---------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------


def test_bad_arguments():
    step = speculative_step(P, Q)
    with pytest.raises(TypeError, match="`step` must be a callable"):
        check_sampler(3, P, Q)
    with pytest.raises(ValueError, match="`q` must sum to 1"):
        check_sampler(step, P, [0.5, 0.4, 0.0, 0.0])
    with pytest.raises(ValueError, match="`p` and `q` must have the same length"):
        check_sampler(step, P, [0.5, 0.5])
    with pytest.raises(ValueError, match=r"`k` must be an integer >= 1"):
        check_sampler(step, P, Q, k=0)
    with pytest.raises(ValueError, match=r"`k`=4 drafts without replacement"):
        check_sampler(step, P, Q, k=4, replacement=False)
    with pytest.raises(TypeError, match="`replacement` must be a bool"):
        check_sampler(step, P, Q, replacement="no")
    with pytest.raises(TypeError, match="`batched` must be a bool"):
        check_sampler(step, P, Q, batched=1)
    with pytest.raises(TypeError, match="`boundary_coins` must be a bool"):
        check_sampler(step, P, Q, boundary_coins=None)
    with pytest.raises(TypeError, match="`n_samples` must be an integer"):
        check_sampler(step, P, Q, n_samples=1e4)
    with pytest.raises(ValueError, match=r"`n_samples`=10 is too few"):
        check_sampler(step, P, Q, n_samples=10)
    with pytest.raises(ValueError, match="`n_samples` must be at most MAX_SAMPLES"):
        check_sampler(step, P, Q, n_samples=MAX_SAMPLES + 1)
    with pytest.raises(ValueError, match=r"`tv` must lie in \(0, 1\]"):
        check_sampler(step, P, Q, tv=0.0)
    with pytest.raises(ValueError, match=r"`tv`=1e-06 needs .* samples, above the stated limit"):
        check_sampler(step, P, Q, tv=1e-6)
    with pytest.raises(ValueError, match=r"`alpha_fail` must lie in \(0, 1\)"):
        check_sampler(step, P, Q, alpha_fail=1.0)
    with pytest.raises(TypeError, match="`rng` must be a numpy Generator"):
        check_sampler(step, P, Q, rng="seed")


@pytest.mark.parametrize("out,match", [
    (2.0, r"`step` must return one token id .* got 2\.0 \(float\)"),
    (True, r"`step` must return one token id"),
    ("1", r"`step` must return one token id"),
    (4, r"`step` returned token 4, outside the vocabulary \[0, 4\), for drafts \(\d,\)"),
    (-1, r"`step` returned token -1"),
])
def test_step_returning_a_non_token(out, match):
    with pytest.raises(StepError, match=match):
        check_sampler(lambda d, rng: out, P, Q, n_samples=2000, rng=0)


@pytest.mark.parametrize("out,match", [
    (lambda d: d[:, 0][:-1], r"batched `step` must return \d+ token ids \(shape \(\d+,\)\)"),
    (lambda d: d, r"batched `step` must return \d+ token ids"),
    (lambda d: d[:, 0] * 1.0, r"must return integer token ids, got dtype float64"),
    (lambda d: d[:, 0] + 3, r"`step` returned token [4-6], outside the vocabulary \[0, 4\), for drafts \([1-3],\)"),
])
def test_batched_step_returning_wrong_tokens(out, match):
    with pytest.raises(StepError, match=match):
        check_sampler(lambda d, rng: out(d), P, Q, n_samples=2000, batched=True, rng=0)


def test_step_that_raises_is_reported_with_its_drafts():
    def step(drafts, rng):
        if drafts[0] == 2:
            raise ZeroDivisionError("residual has no mass")
        return drafts[0]

    with pytest.raises(StepError, match=r"`step` raised ZeroDivisionError: residual has no mass -- on drafts \(2,\)") as e:
        check_sampler(step, P, Q, n_samples=2000, rng=0)
    assert e.value.drafts == (2,) and e.value.phase == "frequency"
    assert isinstance(e.value.__cause__, ZeroDivisionError)

    def batched(drafts, rng):
        if (drafts[:, 0] == 2).any():
            raise ZeroDivisionError("residual has no mass")
        return drafts[:, 0]

    with pytest.raises(StepError, match=r"on drafts row \d+: \(2,\) \(frequency phase\)") as e:
        check_sampler(batched, P, Q, n_samples=2000, batched=True, rng=0)
    assert e.value.drafts == (2,)


def test_step_cannot_mutate_p_or_q():
    # the caller's arrays are compared with copies after the run (never made read-only: that failed on arrays
    # not owning their memory and left them read-only); a changed one is written back and the check fails
    p, q = P.copy(), Q.copy()

    def vandal(drafts, rng):
        q[0] = 0.5
        return drafts[0]

    with pytest.raises(StepError, match=r"`step` modified `q` during the check \(written back to its values"):
        check_sampler(vandal, p, q, n_samples=2000, rng=0)
    assert q.flags.writeable and q.tolist() == Q.tolist() and p.tolist() == P.tolist()  # written back
    base = Q.copy()
    view = base[:]

    def through_base(drafts, rng):
        base[0] += 1e-3
        return drafts[0]

    with pytest.raises(StepError, match="`step` modified `q`"):
        check_sampler(through_base, P, view, n_samples=2000, rng=0)
    assert base.tolist() == Q.tolist()
    as_list = Q.tolist()

    def on_a_list_then_raise(drafts, rng):
        as_list[1] = 0.0
        raise ZeroDivisionError("boom")

    with pytest.raises(StepError, match="`step` raised ZeroDivisionError"):  # the step's own error wins
        check_sampler(on_a_list_then_raise, P, as_list, n_samples=2000, rng=0)
    assert as_list == Q.tolist()  # written back all the same


def test_a_failed_check_names_the_over_and_under_represented_tokens():
    # planted bug: one output in 20 is replaced by token 0, so token 0 is over-represented and the others under
    right = speculative_step(P, Q)

    def favours_0(drafts, rng):
        y = right(drafts, rng)
        return np.where(rng.random(y.shape[0]) < 0.05, 0, y)

    res = check_sampler(favours_0, P, Q, batched=True, rng=0)
    assert not res.passed
    worst = res.worst_cells[0]
    assert worst.cell == 0 and worst.residual > 5
    np.testing.assert_allclose(worst.expected, res.n_samples * Q[0], rtol=1e-12)
    np.testing.assert_allclose(worst.residual, (worst.observed - worst.expected) / np.sqrt(worst.expected),
                               rtol=1e-12)
    assert worst.observed == round(res.law[0] * res.n_samples)
    assert "token 0 over-represented (observed" in res.message
    assert all(c.residual < 0 for c in res.worst_cells[1:])
    assert "under-represented" in res.message
    assert [abs(c.residual) for c in res.worst_cells] == sorted((abs(c.residual) for c in res.worst_cells),
                                                                reverse=True)
    ok = check_sampler(right, P, Q, batched=True, rng=0)  # a passing check keeps the cells, says nothing of them
    assert ok.passed and len(ok.worst_cells) == 4 and "represented" not in ok.message


def test_a_failed_block_check_names_the_sequence():
    draft, target = random_table_model(2, 2, rng=1), random_table_model(2, 2, rng=2)
    v = make_verifier(draft, target, 1, "block")

    def favours_00(block, rng):
        return (0, 0) if rng.random() < 0.1 else v.verify(block, rng=rng).output

    res = check_block_sampler(favours_00, draft, target, 1, tv=0.1, rng=0)
    assert not res.passed and res.worst_cells[0].cell == (0, 0) and res.worst_cells[0].residual > 0
    assert "sequence (0, 0) over-represented" in res.message


def test_seed_for_is_a_function_of_the_example():
    assert seed_for(P, Q, 2) == seed_for(P.copy(), Q.tolist(), 2)
    assert seed_for(P, Q, 2) != seed_for(P, Q, 3) != seed_for(Q, P, 3)
    assert 0 <= seed_for("a", [1, 2], (P, 1.5)) < 2**63


# ---------------------------------------------------------------------------
# block level
# ---------------------------------------------------------------------------


DRAFT, TARGET = random_table_model(3, 3, rng=1), random_table_model(3, 3, rng=2)


@pytest.mark.parametrize("name", ["token", "block", "block-onestep"])
def test_block_verifiers_of_the_package_pass(name):
    v = make_verifier(DRAFT, TARGET, 2, name)
    res = check_block_sampler(lambda b, rng: v.verify(b, rng=rng).output, DRAFT, TARGET, 2, tv=0.05, rng=3)
    assert res.passed, res.message
    assert res.law.shape == (27,) and res.target_law.sum() == pytest.approx(1.0)


def test_batched_block_step_and_a_wrong_bonus_model():
    v = make_verifier(DRAFT, TARGET, 2, "token")

    def batched(blocks, rng):
        out = np.full((blocks.shape[0], 3), -1)
        for i, b in enumerate(blocks.tolist()):
            o = v.verify(b, rng=rng).output
            out[i, : len(o)] = o
        return out

    assert check_block_sampler(batched, DRAFT, TARGET, 2, n_samples=3000, batched=True, rng=4).passed
    lists = check_block_sampler(lambda bs, rng: [v.verify(b, rng=rng).output for b in bs.tolist()],
                                DRAFT, TARGET, 2, n_samples=3000, batched=True, rng=4)
    assert lists.passed
    # verifying against the draft model itself: lossless for the draft, so refuted against the target
    w = make_verifier(DRAFT, DRAFT, 2, "token")
    res = check_block_sampler(lambda b, rng: w.verify(b, rng=rng).output, DRAFT, TARGET, 2, tv=0.05, rng=4)
    assert not res.passed


def _prefix_step(L):
    """Batched block step for draft == target: keep a prefix of random length 1..L (lossless there)."""

    def step(blocks, rng):
        m = rng.integers(1, L + 1, size=blocks.shape[0])
        return np.where(np.arange(L + 1)[None, :] < m[:, None], np.pad(blocks, ((0, 0), (0, 1))), -1)

    return step


@pytest.mark.parametrize("n", [49, 50, 51, 100, 151])
def test_block_sampler_across_chunk_boundaries(monkeypatch, n):
    import otspec.testing._sampler as sampler

    monkeypatch.setattr(sampler, "CHUNK", 50)  # chunks of 50 trials: n straddles 0, 1 or 3 boundaries
    model = random_table_model(3, 3, rng=5)
    res = check_block_sampler(_prefix_step(2), model, model, 2, n_samples=n, batched=True, rng=n)
    assert res.n_samples == n and int(round(res.law.sum() * n)) == n


def test_block_sampler_default_size_runs_past_one_chunk():
    # L = 3, V = 4, tv = 0.02: the sample-size rule asks for more than one 65,536-trial chunk
    from otspec.testing import CHUNK

    model = random_table_model(4, 4, rng=6)
    res = check_block_sampler(_prefix_step(3), model, model, 3, batched=True, rng=7)
    assert res.n_samples > CHUNK and res.passed, res.message


def test_block_errors():
    v = make_verifier(DRAFT, TARGET, 2, "token")
    ok = lambda b, rng: v.verify(b, rng=rng).output  # noqa: E731
    with pytest.raises(ValueError, match=r"V\*\*\(L\+1\) = 3\*\*14 = 4782969 sequences, above the stated limit"):
        check_block_sampler(ok, MemorylessModel([0.5, 0.2, 0.3]), MemorylessModel([0.3, 0.3, 0.4]), 13)
    with pytest.raises(ValueError, match="`draft` and `target` must share one vocabulary"):
        check_block_sampler(ok, MemorylessModel([0.5, 0.5]), TARGET, 2)
    with pytest.raises(ValueError, match=r"`L` must be an integer >= 1"):
        check_block_sampler(ok, DRAFT, TARGET, 0)
    with pytest.raises(StepError, match=r"must return 1 to L\+1=3 token ids, got 4 for block"):
        check_block_sampler(lambda b, rng: (0, 0, 0, 0), DRAFT, TARGET, 2, n_samples=500, rng=0)
    with pytest.raises(StepError, match=r"must return 1 to L\+1=3 token ids, got 0"):
        check_block_sampler(lambda b, rng: (), DRAFT, TARGET, 2, n_samples=500, rng=0)
    with pytest.raises(StepError, match=r"every entry must be a token id in \[0, 3\)"):
        check_block_sampler(lambda b, rng: (0, 5), DRAFT, TARGET, 2, n_samples=500, rng=0)
    with pytest.raises(StepError, match=r"must return a sequence of 1 to L\+1=3 token ids, got 7"):
        check_block_sampler(lambda b, rng: 7, DRAFT, TARGET, 2, n_samples=500, rng=0)
    with pytest.raises(StepError, match=r"followed by -1 padding"):
        check_block_sampler(lambda bs, rng: np.tile([0, -1, 1], (bs.shape[0], 1)), DRAFT, TARGET, 2,
                            n_samples=500, batched=True, rng=0)
    with pytest.raises(StepError, match=r"raised KeyError.* on drafts \(\d, \d\)"):
        check_block_sampler(lambda b, rng: {}[b], DRAFT, TARGET, 2, n_samples=500, rng=0)


def test_block_boundary_coins_find_a_zero_probability_continuation():
    # the target never emits token 1 first; a "verifier" that keeps the draft's first token on coin 0 is caught
    target = MemorylessModel([0.5, 0.0, 0.5])
    draft = MemorylessModel([0.2, 0.6, 0.2])
    v = make_verifier(draft, target, 1, "token")

    def loose(block, rng):
        if block[0] == 1 and rng.random() == 0.0:
            return (1,)
        return v.verify(block, rng=rng).output

    assert check_block_sampler(loose, draft, target, 1, tv=0.05, rng=0).passed
    res = check_block_sampler(loose, draft, target, 1, tv=0.05, boundary_coins=True, rng=0)
    assert not res.passed and res.violation.output == (1,) and res.violation.phase == "boundary"


# ---------------------------------------------------------------------------
# strategies and the property-test recipe
# ---------------------------------------------------------------------------

EXAMPLES = 25
BUDGET = 1e-3  # total false-failure budget of the property test below, over its examples


@settings(max_examples=EXAMPLES, derandomize=True, deadline=None)
@given(pq=pairs(max_n=5, near_equal=True))
def test_recipe_speculative_sampling_is_lossless_on_adversarial_pairs(pq):
    p, q = pq
    res = check_sampler(speculative_step(p, q), p, q, batched=True, boundary_coins=True,
                        alpha_fail=BUDGET / EXAMPLES, rng=seed_for(p, q))
    assert res.passed, res.message


@settings(max_examples=40, derandomize=True, deadline=None)
@given(s=sampling_laws())
def test_sampling_laws_are_processed_laws(s):
    law = s.law
    assert law.sum() == pytest.approx(1.0, abs=1e-12) and (law >= 0).all()
    kept = law > 0
    assert not kept[~np.isfinite(s.logits)].any()
    if s.top_k is not None:
        assert kept.sum() >= min(s.top_k, np.isfinite(s.logits).sum()) or s.top_p is not None
        assert (s.logits[kept].min() >= np.sort(s.logits)[::-1][s.top_k - 1]) or s.top_k > kept.size
    # kept tokens are the most likely ones
    if (~kept).any() and kept.any():
        assert s.logits[kept].min() >= s.logits[~kept & np.isfinite(s.logits)].max(initial=-np.inf)


@settings(max_examples=40, derandomize=True, deadline=None)
@given(s=sampling_laws(separated=True))
def test_processed_law_agrees_with_otspec_decoding_sampling(s):
    torch = pytest.importorskip("torch")
    from otspec.decoding import Sampling

    ref = Sampling(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p).probs(
        torch.tensor(s.logits, dtype=torch.float64))
    np.testing.assert_allclose(ref.numpy(), s.law, rtol=0, atol=1e-12)


@pytest.mark.parametrize("logits", [[0.0, 1.0, 1.0, -np.inf], [2.0, -1.0, 2.0], [-np.inf, 0.5, 0.25]])
@pytest.mark.parametrize("top_k,top_p", [(None, None), (1, None), (None, 0.3)])
def test_processed_law_greedy_is_the_argmax_as_otspec_decoding_sampling(logits, top_k, top_p):
    torch = pytest.importorskip("torch")
    from otspec.decoding import Sampling

    law = processed_law(logits, temperature=0, top_k=top_k, top_p=top_p)
    expect = np.zeros(len(logits))
    expect[int(torch.argmax(torch.tensor(logits)))] = 1.0  # torch.argmax: the first maximum
    np.testing.assert_array_equal(law, expect)
    ref = Sampling(temperature=0, top_k=top_k, top_p=top_p).probs(torch.tensor(logits, dtype=torch.float64))
    np.testing.assert_array_equal(ref.numpy(), law)


def test_processed_law_errors():
    with pytest.raises(ValueError, match="`temperature` must be a finite number >= 0"):
        processed_law([0.0, 1.0], temperature=-0.5)
    with pytest.raises(ValueError, match="`top_k` must be a positive integer"):
        processed_law([0.0, 1.0], top_k=0)
    with pytest.raises(ValueError, match=r"`top_p` must lie in \(0, 1\]"):
        processed_law([0.0, 1.0], top_p=1.5)
    with pytest.raises(ValueError, match="`logits` must be finite or -inf"):
        processed_law([-np.inf, -np.inf])


def test_import_without_hypothesis():
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'hypothesis' or name.startswith('hypothesis.'):\n"
        "            raise ImportError('blocked')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import otspec.testing\n"
        "assert 'hypothesis' not in sys.modules\n"
        "try:\n"
        "    import otspec.testing.strategies\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "otspec.testing.strategies needs hypothesis" in out and "pip install 'otspec-verifiers[test]'" in out


@pytest.mark.slow  # ~5 s; the same broken residual is refuted by default in test_bug_catalogue.py (resampling from q)
def test_hypothesis_shrinks_a_refuted_sampler_to_a_minimal_pair():
    # a residual drawn from q instead of (q - p)+: the smallest pair hypothesis finds that refutes it
    from hypothesis import find

    def wrong(p, q):
        def step(drafts, rng):
            x = drafts[:, 0]
            accept = rng.random(x.shape[0]) * p[x] < q[x]
            return np.where(accept, x, rng.choice(q.shape[0], size=x.shape[0], p=q))

        return step

    def refuted(pq):
        p, q = pq
        return not check_sampler(wrong(p, q), p, q, batched=True, tv=0.1, rng=seed_for(p, q)).passed

    p, q = find(pairs(max_n=5), refuted, settings=settings(max_examples=200, derandomize=True, database=None))
    assert p.shape == (2,)  # one token cannot show it; two can
    assert refuted((p, q))


def test_sample_size_with_a_rounding_level_second_cell():
    """A law (1, 1e-300): 1 - max rounds to 0; the tiny cell is never testable, so the one-cell rule applies."""
    from otspec.testing import sample_size

    n = sample_size(0.02, [1.0, 1e-300])
    # one cell: a law at TV 0.02 puts mass 0.02 elsewhere, seen with probability 0.99 after n draws
    assert (1 - 0.02) ** n <= 0.01 < (1 - 0.02) ** (n - 1)


# ---------------------------------------------------------------------------
# tiny cells, the trial budget, vacuous boundary phases
# ---------------------------------------------------------------------------


TINY = np.array([1 - 1.1e-6, 1.1e-6])  # the shape of target that once asked for 4,480,016 trials


def test_a_tiny_cell_is_tested_by_the_binomial_tail_not_by_millions_of_trials():
    N = sample_size(0.02, TINY)
    assert N < 1000  # was 4,545,455: the rule waited for an expected count of 5 on the 1.1e-6 cell
    assert detectable_tv(N, TINY) <= 0.02 < detectable_tv(N - 1, TINY)
    res = check_sampler(speculative_step(np.array([0.5, 0.5]), TINY), np.array([0.5, 0.5]), TINY, batched=True, rng=1)
    assert res.passed and res.n_samples == N and res.test == "binomial tail", res.message
    assert res.pooled_cells == 1 and res.pooled_mass == pytest.approx(1.1e-6)
    assert "tested together by the exact binomial test" in res.message
    # a sampler putting 3% on the tiny cell (TV 0.03 > detectable_tv) is refuted
    wrong = np.array([0.97, 0.03])
    bad = check_sampler(speculative_step(wrong, wrong), wrong, TINY, batched=True, rng=1)
    assert not bad.passed and bad.pvalue < 1e-4 and "binomial tail p-value" in bad.message


def test_power_of_the_tail_test_against_the_least_favourable_law():
    from scipy import stats

    N = sample_size(0.02, TINY)
    r = np.array([0.98, 0.02])  # TV 0.02 - 1.1e-6: all the deviation on the tail
    hits = stats.binom.rvs(N, r[1], size=2000, random_state=np.random.default_rng(3))
    pvals = stats.binom.sf(hits - 1, N, TINY[1])
    assert np.mean(pvals <= 1e-4) >= 0.985  # power 0.99 (exact binomial), 2000 runs: sd 0.002


def test_the_trial_budget_raises_before_any_trial():
    calls = []

    def step(drafts, rng):
        calls.append(1)
        return drafts[0]

    with pytest.raises(ValueError, match=r"needs 11,360,209 trials .* above the trial budget `max_samples`=3,000,000; "
                                         r"raise `tv`.*batched=True"):
        check_sampler(step, Q, Q, tv=0.001)
    with pytest.raises(ValueError, match=r"`n_samples`=5,000 is above the trial budget `max_samples`=1,000"):
        check_sampler(step, Q, Q, n_samples=5000, max_samples=1000)
    with pytest.raises(ValueError, match=r"above the trial budget `max_samples`=100"):
        check_block_sampler(lambda b, rng: b, DRAFT, TARGET, 2, max_samples=100)
    with pytest.raises(TypeError, match="`max_samples` must be an integer"):
        check_sampler(step, Q, Q, max_samples=1e6)
    assert not calls


def test_boundary_phase_that_could_not_fail_is_reported():
    full = np.array([0.2, 0.3, 0.5])
    res = check_sampler(speculative_step(full, full), full, full, batched=True, boundary_coins=True, n_samples=2000, rng=2)
    assert res.passed and res.boundary_vacuous and "could not have failed" in res.message
    res = check_sampler(speculative_step(Q, P), Q, P, batched=True, boundary_coins=True, n_samples=2000, rng=2)
    assert res.passed and not res.boundary_vacuous and "could not have failed" not in res.message  # P has a zero
    # block level: Dirichlet models have no zeros; support-limited ones do, and a non-strict step is caught
    dense = check_block_sampler(_prefix_step(2), DRAFT, DRAFT, 2, n_samples=500, batched=True, boundary_coins=True,
                                rng=3)
    assert dense.passed and dense.boundary_vacuous
    sparse = random_table_model(4, 3, support=2, rng=4)
    assert np.all((sparse.tables[2] > 0).sum(axis=-1) == 2)
    res = check_block_sampler(_prefix_step(2), sparse, sparse, 2, n_samples=500, batched=True, boundary_coins=True,
                              rng=3)
    assert res.passed and not res.boundary_vacuous


def test_random_table_model_support_errors():
    with pytest.raises(ValueError, match=r"`support` must lie in \[1, V=3\], got 4"):
        random_table_model(3, 2, support=4)
    with pytest.raises(ValueError, match="`support`"):
        random_table_model(3, 2, support=0)


@settings(max_examples=20, derandomize=True, deadline=None)
@given(pairs(min_n=2, max_n=5, target_zero=True))
def test_pairs_with_a_support_limited_target(pq):
    p, q = pq
    assert np.any(q == 0) and abs(q.sum() - 1) < 1e-12
