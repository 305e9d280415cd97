"""Regression tests of issue 15 (reliability under adversarial input), one per reported class.

Boundary coins: every sampler of the package runs with a numpy Generator
whose ``random()`` returns exactly 0.0, and one returning the largest double
below 1; no output may leave the support of the sampler's stated law. These
rngs are written here on purpose (independent of otspec.testing).
"""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import otspec
from otspec import speculative
from otspec.models import MemorylessModel, random_markov_model
from otspec.multidraft import VERIFIERS

ROOT = Path(__file__).resolve().parents[1]
ALMOST_ONE = float(np.nextafter(1.0, 0.0))


class ConstantCoins(np.random.Generator):
    """A Generator whose uniform draws are all ``value`` (0.0 or the largest double below 1)."""

    def __init__(self, value: float):
        super().__init__(np.random.PCG64(0))
        self.value = value

    def random(self, size=None, dtype=np.float64, out=None):
        if size is None:
            return self.value
        return np.full(size, self.value)


COINS = [pytest.param(0.0, id="u=0"), pytest.param(ALMOST_ONE, id="u=1-2^-53")]

# the reported reproducer, and a pair where the largest coin matters (zeros at both ends)
P, Q = np.array([0.5, 0.3, 0.2]), np.array([0.0, 0.5, 0.5])
P2, Q2 = np.array([0.2, 0.3, 0.5]), np.array([0.5, 0.5, 0.0])


#: values for the options some registered verifiers require
OPTIONS = {"D": 0.05, "w": 0.5}


def _token_verifiers(p, q, k):
    """Every token-level verifier of the registry (and the extra rules not in it), built for (p, q)."""
    for name, spec in VERIFIERS.items():
        if spec.kind != "token":
            continue
        kk = 1 if spec.single_draft else k
        yield name, spec.build(p, q, kk, **{o: OPTIONS[o] for o in spec.required})
    yield "multiround-without-replacement", otspec.multiround(p, q, 2, replacement=False)
    yield "lenient", otspec.lenient_verifier(p, q, 0.5)


def _draft_tuples(v):
    """The draft tuples the verifier's draft law produces (positive ``draft_law_of``)."""
    for x in itertools.product(range(v.n), repeat=v.k):
        if v.draft_law_of(x) > 0:
            yield x


@pytest.mark.parametrize("u", COINS)
@pytest.mark.parametrize("pq", [(P, Q), (P2, Q2), (Q, P)], ids=["issue", "zero-last", "swapped"])
def test_token_samplers_stay_in_support_with_boundary_coins(u, pq):
    p, q = pq
    for name, v in _token_verifiers(p, q, 2):
        support = np.asarray(v.output_law()) > 0
        for drafts in _draft_tuples(v):
            y = v.sample(drafts, rng=ConstantCoins(u))
            assert support[y], (name, drafts, y, u)
        if hasattr(v, "sample_drafts"):
            d = v.sample_drafts(rng=ConstantCoins(u))
            assert v.draft_law_of(tuple(d)) > 0, (name, d)


def test_issue_reproducer_u_zero_rejects_a_zero_target_token():
    """p = (0.5, 0.3, 0.2), q = (0, 0.5, 0.5), drafts on token 0, u = 0: never token 0 (q(0) = 0)."""
    for name, v in _token_verifiers(P, Q, 2):
        if v.output_law()[0] > 0:
            continue  # a lossy rule (mentored, ensemble) may output token 0 by design
        for drafts in _draft_tuples(v):
            if 0 in drafts:
                assert v.sample(drafts, rng=ConstantCoins(0.0)) != 0, (name, drafts)


@pytest.mark.parametrize("u", COINS)
@pytest.mark.parametrize("name", ["token", "block", "block-onestep"])
def test_block_samplers_stay_in_support_with_boundary_coins(u, name):
    d = random_markov_model(3, 1, concentration=0.3, rng=1)
    t = MemorylessModel(Q)
    v = otspec.block.make_verifier(d, t, 3, name)
    s = v.sample(rng=ConstantCoins(u))
    assert otspec.models.sequence_probability(d, s.block) > 0
    assert otspec.models.sequence_probability(t, s.output) > 0
    step = v.verify((0, 0, 0), rng=ConstantCoins(u))
    assert otspec.models.sequence_probability(t, step.output) > 0


@pytest.mark.parametrize("u", COINS)
@pytest.mark.parametrize("verifier", ["lp", "optimal", "kseq", "multiround"])
def test_spectr_samplers_stay_in_support_with_boundary_coins(u, verifier):
    d, t = MemorylessModel(P), MemorylessModel(Q)
    ds = otspec.spectr.iid_drafts(d, 3, 2, rng=ConstantCoins(u))
    assert np.all(P[ds.tokens] > 0)
    ds = otspec.spectr.prefix_tree_drafts(d, (2, 2), rng=ConstantCoins(u))
    assert np.all(P[ds.tokens] > 0)
    out = otspec.spectr.spectr_step(d, t, 2, 3, verifier=verifier, rng=ConstantCoins(u))
    assert all(Q[y] > 0 for y in out)


@pytest.mark.parametrize("u", COINS)
def test_decoding_row_sampler_stays_in_support(u):
    pytest.importorskip("torch")
    from otspec.decoding._sampling import sample_rows

    P_ = np.array([[0.0, 0.5, 0.5, 0.0], [0.3, 0.0, 0.7, 0.0], [0.0, 0.0, 0.0, 1.0]])
    idx = sample_rows(P_, ConstantCoins(u))
    assert all(P_[b, i] > 0 for b, i in enumerate(idx))


# ----------------------------------------------------------------------------- wrong answers
def test_mentored_subnormal_is_the_problem_with_zeros():
    r = otspec.mentored([0.5, 0.5], [1.0, 5e-324], 0.01)
    r0 = otspec.mentored([0.5, 0.5], [1.0, 0.0], 0.01)
    assert r.acceptance == r0.acceptance and r.kl == r0.kl
    assert math.isfinite(r.kl) and r.kl <= 0.01 + 1e-15
    # 1e-300 is a normal double: kept, and within the tolerance of the zero problem
    r3 = otspec.mentored([0.5, 0.5], [1.0 - 1e-300, 1e-300], 0.01)
    assert abs(r3.acceptance - r0.acceptance) <= 1e-12


@pytest.mark.parametrize("tiny", [5e-324, 1e-310, 1e-300])
def test_every_law_entry_point_treats_tiny_entries_like_zeros(tiny):
    p, q = np.array([0.6, 0.4, 0.0]), np.array([0.3, 0.7 - tiny, tiny])
    p0, q0 = p.copy(), np.array([0.3, 0.7, 0.0])
    for f in (
        lambda a, b: otspec.alpha_k(a, b, 3),
        lambda a, b: otspec.kseq(a, b, 2).acceptance(),
        lambda a, b: otspec.optimal_verifier(a, b, 2).acceptance(),
        lambda a, b: otspec.multiround(a, b, 2).acceptance(),
        lambda a, b: otspec.lenient_verifier(a, b, 0.7).acceptance(),
        lambda a, b: otspec.mentored(a, b, 0.05).acceptance,
        lambda a, b: otspec.block.expected_length(MemorylessModel(a), MemorylessModel(b), 3),
        lambda a, b: otspec.spectr.block_efficiency(MemorylessModel(a), MemorylessModel(b), 2, 2),
    ):
        for a, b, a0, b0 in ((p, q, p0, q0), (q, p, q0, p0)):
            got, ref = f(a, b), f(a0, b0)
            assert math.isfinite(got) and abs(got - ref) <= 1e-12


def test_near_one_entries():
    q = np.array([1 - 1e-16, 1e-16])
    assert otspec.alpha_k([0.5, 0.5], q, 4) == pytest.approx(1 - 0.5**4, abs=1e-15)
    r = otspec.mentored([0.5, 0.5], q, 0.0)
    assert r.acceptance == pytest.approx(0.5, abs=1e-15)


def test_float32_inputs_are_accepted_and_computed_in_float64():
    p32 = np.array([0.6, 0.4], dtype=np.float32)
    q32 = np.array([0.3, 0.7], dtype=np.float32)
    ref_p = p32.astype(np.float64) / p32.astype(np.float64).sum()
    ref_q = q32.astype(np.float64) / q32.astype(np.float64).sum()
    assert otspec.alpha_k(p32, q32, 2) == otspec.alpha_k(ref_p, ref_q, 2)
    v = otspec.kseq(p32, q32, 2)
    assert v.p.dtype == np.float64 and v.p.sum() == pytest.approx(1.0, abs=1e-15)
    assert MemorylessModel(p32).next_dist(()).dtype == np.float64


def test_optimal_gamma_free_drafts_is_the_cap():
    assert speculative.optimal_gamma(0.7, 0.0) == 1000
    assert speculative.optimal_gamma(0.7, 0.0, max_gamma=5000) == 5000
    # tiny c: the true optimum (about log(c)/log(alpha)), which the rounded factor could not see
    g = speculative.optimal_gamma(0.7, 1e-30, max_gamma=10**6)
    assert 150 < g < 250
    assert speculative.optimal_gamma(1.0, 0.5, max_gamma=7) == 7
    assert speculative.optimal_gamma(0.0, 0.0) == 1
    # an exact tie, f(1) = 1.5 / 1.2 = f(2) = 1.75 / 1.4: the smaller gamma, as documented
    assert speculative.optimal_gamma(0.5, 0.2) == 1


def test_optimal_block_efficiency_is_never_below_an_achieved_value():
    worst = -math.inf
    for seed in range(12):
        rng = np.random.default_rng(seed)
        V, K, L = int(rng.integers(2, 4)), int(rng.integers(1, 4)), int(rng.integers(1, 3))
        d = random_markov_model(V, 1, concentration=0.2, rng=rng)
        t = random_markov_model(V, 1, concentration=0.2, rng=rng)
        best = otspec.spectr.optimal_block_efficiency(d, t, K, L)
        for name in ("lp", "optimal", "kseq", "multiround"):
            worst = max(worst, otspec.spectr.block_efficiency(d, t, K, L, verifier=name) - best)
    assert worst <= 1e-12


def test_closed_forms_in_L_answer_at_once():
    assert otspec.block.bernoulli_token_length(0.5, 0.75, 10**15) == pytest.approx(3.0, rel=1e-15)
    assert otspec.block.bernoulli_block_length(0.5, 0.75, 10**15) == pytest.approx(13.784401085075961, rel=1e-12)
    assert otspec.block.bernoulli_block_length(0.4, 0.4, 10**15) == 10**15


# ----------------------------------------------------------------------------- seeds and rng
@pytest.mark.parametrize("seed", [np.int64(3), np.uint16(3), np.int8(3)])
def test_numpy_integer_seeds_are_the_int_seed(seed):
    v = otspec.kseq([0.5, 0.5], [0.2, 0.8], 3)
    assert v.sample_drafts(rng=seed) == v.sample_drafts(rng=3)
    a = otspec.models.random_table_model(3, 2, rng=seed).tables[1]
    np.testing.assert_array_equal(a, otspec.models.random_table_model(3, 2, rng=3).tables[1])


@pytest.mark.parametrize("bad,exc", [(-1, ValueError), (np.int64(-5), ValueError), (1.5, TypeError),
                                     (True, TypeError), ("3", TypeError)])
def test_bad_seeds_name_rng(bad, exc):
    with pytest.raises(exc, match="`rng`"):
        otspec.kseq([0.5, 0.5], [0.2, 0.8], 2).sample_drafts(rng=bad)


def test_decoding_check_lossless_numpy_seed_and_validation_before_model_calls():
    torch = pytest.importorskip("torch")
    from otspec.decoding import CallableLM, check_lossless

    calls = []

    def target_logits(ids):
        calls.append(1)
        return torch.tensor([0.0, 1.0, 2.0]).expand(ids.shape + (3,))

    t = CallableLM(target_logits, vocab_size=3)
    d = CallableLM(lambda ids: torch.zeros(ids.shape + (3,)), vocab_size=3)
    for bad, match in [(dict(k=0), "`k`"), (dict(L=0), "`L`"), (dict(verifier="nope"), "`verifier`"),
                       (dict(rng=-1), "`rng`"), (dict(draft=CallableLM(lambda i: i, vocab_size=4)), "vocab")]:
        kw = dict(draft=d, target=t, n_runs=10)
        kw.update(bad)
        with pytest.raises((ValueError, TypeError), match=match):
            check_lossless([0], **kw)
    assert not calls  # refused before any model call
    a = check_lossless([0], draft=d, target=t, n_runs=300, rng=np.int64(3))
    b = check_lossless([0], draft=d, target=t, n_runs=300, rng=3)
    assert a.passed and a.pvalue == b.pvalue


# ----------------------------------------------------------------------------- command line and results
@pytest.mark.parametrize("args", [["--verifiers", "no-such-verifier"], ["--num-drafts", "0"], ["--prompts", "0"],
                                  ["--temperature", "-1"], ["--verifiers", ","]])
def test_decode_real_pair_refuses_bad_options_before_loading(tmp_path, args):
    sentinel = tmp_path / "decoding.json"
    sentinel.write_text("{}\n")
    proc = subprocess.run([sys.executable, str(ROOT / "experiments" / "decode_real_pair.py"), *args,
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln]
    assert len(lines) == 1 and lines[0].startswith("decode_real_pair: error: --"), proc.stderr
    assert sentinel.read_text() == "{}\n"  # earlier results untouched


def test_results_csv_writer_is_stable_and_atomic(tmp_path):
    sys.path.insert(0, str(ROOT / "experiments"))
    try:
        from _report import SIG_DIGITS, csv_number, write_csv
    finally:
        sys.path.pop(0)
    rows = [["a", 0.1 + 0.2, np.float64(1 / 3), 7, -0.0, ""]]
    write_csv(tmp_path / "x.csv", ["s", "f", "g", "i", "z", "e"], rows)
    first = (tmp_path / "x.csv").read_bytes()
    # last-bit noise (0.1 + 0.2 vs 0.3) does not show at SIG_DIGITS significant digits
    write_csv(tmp_path / "x.csv", ["s", "f", "g", "i", "z", "e"], [["a", 0.3, 1 / 3, 7, 0.0, ""]])
    assert (tmp_path / "x.csv").read_bytes() == first
    assert first.decode() == "s,f,g,i,z,e\na,0.3,0.3333333333,7,0,\n"
    assert csv_number(1.23456789012345, SIG_DIGITS) == "1.23456789"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.csv"]  # no temporary left behind


def test_bench_marks_rows_that_miss_a_target(capsys):
    sys.path.insert(0, str(ROOT / "experiments"))
    try:
        from _bench import print_table
    finally:
        sys.path.pop(0)
    print_table("t", ("n", "ratio"), [(1, 2.0), (2, 9.27)], False, target=("ratio", 3.0))
    out = capsys.readouterr().out
    assert "MISSED (9.27 > 3)" in out and "1 of 2 rows MISS it" in out
    json.dumps(out)  # plain text


# ----------------------------------------------------------------------------- models and arrays
class _BadModel:
    """A draft model whose conditional rows sum to 1.4."""

    vocab_size = 2
    max_len = None

    def next_dist(self, prefix):
        return np.array([0.7, 0.7])


def test_block_and_spectr_samplers_validate_models_on_use():
    good = MemorylessModel([0.5, 0.5])
    with pytest.raises(ValueError, match="sum to 1"):
        otspec.block.make_verifier(_BadModel(), good, 2).sample(rng=0)
    with pytest.raises(ValueError, match="sum to 1"):
        otspec.block.make_verifier(_BadModel(), good, 2).verify((0, 1), rng=0)
    with pytest.raises(ValueError, match="sum to 1"):
        otspec.spectr.spectr_step(_BadModel(), good, 2, 2, rng=0)
    with pytest.raises(ValueError, match="sum to 1"):
        otspec.spectr.iid_drafts(_BadModel(), 2, 2, rng=0)


def test_torch_tensors_and_lists_are_laws():
    torch = pytest.importorskip("torch")
    p, q = [0.6, 0.4], [0.3, 0.7]
    ref = otspec.alpha_k(np.array(p), np.array(q), 3)
    assert otspec.alpha_k(torch.tensor(p, dtype=torch.float64), torch.tensor(q, dtype=torch.float64), 3) == ref
    assert otspec.alpha_k(p, q, 3) == ref
    t32 = torch.tensor(p, dtype=torch.float32)
    assert otspec.kseq(t32, q, 2).p.dtype == np.float64
