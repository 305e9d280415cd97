"""Audit of the profile's summary, answer and report with other seeds, sizes and inputs (task BZ).

Intervals' coverage by simulation (rows of a known law), degenerate runs (one prompt, equal values, a prompt with
no positions, no tokens per call), ties, a resumed run, and folders that are not runs of this version: every
answer finite or a clear statement, every refusal naming its file.
"""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
from scipy import stats

torch = pytest.importorskip("torch")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pc = pytest.importorskip("pyarrow.compute")

from otspec.profile import profile, summarize, toy_pair, write_report  # noqa: E402
from otspec.profile._summary import (  # noqa: E402
    MIN_PERCENTILE_PROMPTS,
    N_BOOT,
    PositionSet,
    _boot,
    _interval,
    _recommend,
    configurations,
)

PROMPTS = [[i % 6, (5 * i + 1) % 6] for i in range(6)]
RUN = dict(k_max=2, L_max=2, max_new_tokens=4, verifiers=["token"], families=["token", "block", "kseq"], subsample=1,
           shard_size=2, progress=False)
NAN = re.compile(r"\b(nan|inf)\b")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bz") / "run"
    d, t = toy_pair(6, seed=2)
    profile(PROMPTS, out=out, draft=d, target=t, **RUN)
    return out


def _variant(run, tmp_path, edit=None):
    """A copy of the run with every shard's table passed through ``edit(table, path)`` (None: the shard removed)."""
    out = tmp_path / "v"
    shutil.copytree(run, out)
    for p in sorted(out.glob("shard-*.parquet")):
        t = edit(pq.read_table(p), p) if edit is not None else pq.read_table(p)
        if t is None:
            p.unlink()
        else:
            pq.write_table(t, p)
    return out


def _set_values(t, kinds, value):
    v = t["value"].to_numpy().copy()
    v[np.isin(np.asarray(t["kind"].to_pylist(), dtype=object), kinds)] = value
    return t.set_column(t.column_names.index("value"), "value", pa.array(v))


def _first(text: str) -> str:
    return text.split("## Recommendation\n\n", 1)[1].split("\n\n", 1)[0]


# --------------------------------------------------------------------------- 1. the intervals' coverage
def _coverage(N: int, reps: int, seed: int) -> int:
    """How many of ``reps`` intervals of tokens per call over ``N`` prompts hold the truth: every prompt 8 positions,
    its acceptance rate a ~ Beta(4, 3), each position's accepted tokens ~ Binomial(4, a) (L = 4), so the truth is
    1 + 4 E[a] = 1 + 16 / 7; resampled as :func:`summarize` does (multinomial weights, N_BOOT rows)."""
    rng = np.random.default_rng(seed)
    truth = 1.0 + 16.0 / 7.0
    hit = 0
    for _ in range(reps):
        a = rng.beta(4.0, 3.0, size=N)
        S = (rng.binomial(4, a[:, None], size=(N, 8)) + 1.0).sum(axis=1, keepdims=True)
        C = np.full((N, 1), 8.0)
        W = rng.multinomial(N, np.full(N, 1.0 / N), size=N_BOOT).astype(np.float64)
        point, res = _boot(S, C, W)
        e = _interval(point[0], res[:, 0], 8 * N, N)
        hit += e.lo <= truth <= e.hi
    return hit


@pytest.mark.parametrize("N", [2, 3, 5, pytest.param(40, marks=pytest.mark.slow)])
def test_intervals_cover_at_their_nominal_rate_on_few_prompts_and_many(N):
    # the percentile bootstrap alone covered 0.54 from 2 prompts (the range of the two), 0.75 from 3, 0.82 from 5.
    # Bound: the count of R = 400 intervals holding the truth is Binomial(R, c); we require c >= 0.90 (Student's
    # interval is exact for normal per-prompt means; this law is skewed and bounded) and c <= 0.99 (not useless),
    # each refused at the 0.1 % level: count >= binom.ppf(0.001, R, 0.90), count <= binom.isf(0.001, R, 0.99).
    R = 400
    hit = _coverage(N, R, seed=N)
    assert stats.binom.ppf(0.001, R, 0.90) <= hit <= stats.binom.isf(0.001, R, 0.99), (N, hit / R)


def test_few_prompts_interval_holds_students_on_the_bootstrap_standard_error():
    # an independent route: Student's interval of a mean of 3 normal values from scipy, the ideal bootstrap's
    # standard error sqrt((n - 1) / n) s / sqrt(n): the interval of 3 prompts must hold it (to the resampling's
    # Monte-Carlo error, 2000 rows: 5 %)
    x = np.array([1.3, 2.9, 2.2])
    W = np.random.default_rng(1).multinomial(3, np.full(3, 1 / 3), size=N_BOOT).astype(np.float64)
    point, res = _boot(x[:, None], np.ones((3, 1)), W)
    e = _interval(point[0], res[:, 0], 3, 3)
    lo, hi = stats.t.interval(0.95, 2, loc=x.mean(), scale=stats.sem(x))
    assert point[0] == pytest.approx(x.mean(), abs=1e-15)
    # on the log scale (a positive estimate): its ends are x̄ e^{-+h}, h from the log resamples; it holds the
    # linear Student interval's width to within the log's curvature
    assert e.lo < x.mean() - 0.6 * (x.mean() - lo) and e.hi > hi
    # 30 prompts and more: the percentile interval alone, as before
    y = np.random.default_rng(2).normal(2.0, 0.5, size=MIN_PERCENTILE_PROMPTS)
    W = np.random.default_rng(3).multinomial(y.size, np.full(y.size, 1 / y.size), size=N_BOOT).astype(np.float64)
    point, res = _boot(y[:, None], np.ones((y.size, 1)), W)
    e = _interval(point[0], res[:, 0], y.size, y.size)
    assert (e.lo, e.hi) == tuple(np.nanpercentile(res[:, 0], [2.5, 97.5]))


def test_degenerate_intervals_are_finite_and_hold_their_point():
    W = np.random.default_rng(0).multinomial(4, np.full(4, 0.25), size=200).astype(np.float64)
    # every value equal: a zero-width interval at the value; zero: zero
    for v in (1.7, 0.0):
        p, r = _boot(np.full((4, 1), v), np.ones((4, 1)), W)
        assert _interval(p[0], r[:, 0], 4, 4) == _interval(p[0], r[:, 0], 4, 4)
        e = _interval(p[0], r[:, 0], 4, 4)
        assert (e.lo, e.value, e.hi) == (v, v, v)
    # a difference about 0 (values of both signs): Student's interval on the linear scale, finite
    p, r = _boot(np.array([[-1.0], [0.5], [1.0], [-0.2]]), np.ones((4, 1)), W)
    e = _interval(p[0], r[:, 0], 4, 4)
    assert np.isfinite([e.lo, e.hi]).all() and e.lo < e.value < e.hi
    # a prompt with no position: resamples without a position are NaN and left out; the prompts counted are those
    # with positions
    S, C = np.array([[2.0], [0.0], [3.0], [2.5]]), np.array([[1.0], [0.0], [1.0], [1.0]])
    p, r = _boot(S, C, W)
    e = _interval(p[0], r[:, 0], 3, 3)
    assert np.isfinite([e.lo, e.hi]).all() and e.lo <= e.value <= e.hi


# --------------------------------------------------------------------------- 2. the answer
def test_tied_configurations_keep_the_recommendations_order():
    # equal speed-ups (a degenerate run: every scheme as fast) at L = 2 and L = 10 and k = 2 and 10: the answer's
    # first configuration is the recommendation's best; the names were sorted as text ("L = 10" before "L = 2")
    from otspec.profile._summary import Estimate

    keys = [("token", 1, 10), ("token", 1, 2), ("kseq", 10, 2), ("kseq", 2, 2)]
    point = {key: 1.0 for key in keys}
    res = {key: np.full(8, 1.0) for key in keys}
    tokens = {key: Estimate(1.0, 1.0, 1.0, 40, 4) for key in keys}
    rec = _recommend(point, res, tokens, 40)
    ps = PositionSet(name="all", positions=40, acceptance={}, gaps={}, tokens_per_call=tokens,
                     speedup={key: sp for key, sp in rec.ranking}, recommendation=rec)
    got = [c.key for c in configurations(ps, None)]
    assert got == [key for key, _ in rec.ranking] == sorted(keys)
    assert got[0] == rec.best


def test_the_answer_is_plain_decoding_when_every_interval_straddles_or_lies_below_1(run):
    # docs/guide/profile.rst: "when no speed-up interval lies above 1, plain decoding is fastest on this device"
    for dc in (1.0, 0.6):
        s = summarize(run, draft_cost=dc, score_cost=1.0, n_boot=200)
        text = write_report(run, dest=run.parent / f"rep{dc}", figures=False, draft_cost=dc, score_cost=1.0,
                            n_boot=200).read_text()
        clear = [c for c in s.configurations if c.speedup.lo > 1]
        if clear:
            assert _first(text).startswith(f"Run **{clear[0].name}**")
        else:
            assert _first(text).startswith("**Plain decoding is fastest on this device**")
        assert not NAN.search(text)


def test_chains_and_trees_share_one_cost_model_when_costs_are_given():
    # a chain of L nodes drafted as a tree costs, under given costs, what the (1, L) scheme does: L draft steps and
    # one scoring call
    from otspec.profile._summary import Costs, _TreeCosts
    from otspec.tree import TreeShape

    c = Costs("given", 1.0, {(1, L): 1.5 for L in (1, 2, 3)}, {1: 0.25}, "given")
    tc = _TreeCosts(c, {"L_max": 3, "trees": ["topk:branching(1,1,1)"], "tree_universe": None})
    for L in (1, 2, 3):
        chain = TreeShape([()] + [(0,) * d for d in range(1, L + 1)])
        assert tc.iteration(chain) == pytest.approx(c.iteration(1, L), abs=1e-15) == 0.25 * L + 1.5


# --------------------------------------------------------------------------- 3. degenerate runs, end to end
def test_equal_values_and_zero_variance_give_a_finite_report(run, tmp_path):
    out = _variant(run, tmp_path, lambda t, p: _set_values(t, ["tau", "acc"], 0.0))
    text = write_report(out, figures=False, n_boot=200).read_text()
    assert not NAN.search(text)
    s = summarize(out, n_boot=200)
    for e in s.tokens_per_call.values():
        assert np.isfinite([e.value, e.lo, e.hi]).all() and e.lo <= e.value <= e.hi
    for f, k, L in s.tokens_per_call:
        if f != "block":  # nothing accepted: one token per call, exactly
            assert s.tokens_per_call[(f, k, L)].value == 1.0 == s.tokens_per_call[(f, k, L)].hi
    # given costs: no timing replicates, so a scheme whose every prompt emits one token per call is exactly as fast
    g = summarize(out, draft_cost=0.1, score_cost=1.0, n_boot=200)
    for (f, _k, L), e in g.speedup.items():
        if f != "block":
            assert (e.lo, e.value, e.hi) == pytest.approx((1.0 / (0.1 * L + 1.0),) * 3, rel=1e-12)


def test_a_speed_ups_timing_replicates_are_not_widened_by_students_factor():
    # a speed-up's resamples carry the timings' bootstrap replicates (a median of 3 timings, resampled: long
    # tails, even a negative denominator) beside the prompts'; Student's factor widens the prompts' part only. With
    # the prompts' part constant the interval is the percentile's; widening the whole took one run's 0.38 to
    # [0.04, 4.07]
    rng = np.random.default_rng(0)
    res = 0.4 * np.exp(rng.standard_t(2, size=N_BOOT) * 0.3)
    e = _interval(0.4, res, 24, 6, np.full(N_BOOT, 0.4))
    assert (e.lo, e.hi) == tuple(np.nanpercentile(res, [2.5, 97.5]))
    wide = _interval(0.4, res, 24, 6)
    assert wide.hi > e.hi and wide.lo < e.lo


def test_one_prompt_and_a_prompt_without_positions(run, tmp_path):
    # one prompt: no interval, the answer undecided; the run's other shards missing are named
    one = _variant(run, tmp_path, lambda t, p: (t.filter(pc.equal(t["prompt"], 0)) if p.name == "shard-00000.parquet"
                                                else None))
    text = write_report(one, figures=False, n_boot=200).read_text()
    assert not NAN.search(text)
    assert "n/a (1 prompt)" in text and _first(text).startswith("**Not decided: one prompt gives no interval**")
    assert "**An unfinished run**: 2 of its 3 shards are not written (shard-00001.parquet, shard-00002.parquet)" in text
    # a prompt without positions (its rows gone): the prompts counted are the others
    gone = _variant(run, tmp_path / "g", lambda t, p: t.filter(pc.or_(pc.not_equal(t["prompt"], 3), pc.is_in(
        t["kind"], value_set=pa.array(["cost", "time"])))))
    s = summarize(gone, n_boot=200)
    assert s.prompts == 5 and all(e.prompts == 5 for e in s.tokens_per_call.values())
    assert not NAN.search(write_report(gone, figures=False, n_boot=200).read_text())


def test_a_run_without_tokens_per_call_says_so(run, tmp_path):
    out = _variant(run, tmp_path, lambda t, p: t.filter(pc.invert(pc.is_in(t["kind"], value_set=pa.array(
        ["tau", "calls"])))))
    text = write_report(out, figures=False, n_boot=100).read_text()
    assert _first(text) == "No lossless scheme with tokens per call was profiled: nothing to recommend."
    assert not NAN.search(text)


def test_costs_from_timers_the_run_lacks_are_refused(run, tmp_path):
    # no calibration and no timers: the speed-ups were NaN and the answer "no prediction (a)"
    out = _variant(run, tmp_path, lambda t, p: t.filter(pc.invert(pc.is_in(t["kind"], value_set=pa.array(
        ["cost", "time"])))))
    with pytest.raises(ValueError, match="holds no timed target call and draft step.*give `draft_cost` and"):
        summarize(out, n_boot=50)
    with pytest.raises(ValueError, match="`score_cost` alone takes the draft step's cost from them"):
        summarize(out, score_cost=1.0, n_boot=50)
    s = summarize(out, draft_cost=0.1, score_cost=1.0, n_boot=50)  # both given: no timer needed
    assert all(np.isfinite(e.value) for e in s.speedup.values())


# --------------------------------------------------------------------------- 4. resume
def test_a_resumed_run_gives_the_same_summary_and_report_bytes(run, tmp_path):
    # the run's last two shards removed and written again by the same call: the report (measured costs, from the
    # first shard's calibration; the tables from every shard) is the same, byte for byte
    resumed = _variant(run, tmp_path, lambda t, p: None if p.name != "shard-00000.parquet" else t)
    d, t = toy_pair(6, seed=2)
    profile(PROMPTS, out=resumed, draft=d, target=t, **RUN)
    a = write_report(run, dest=tmp_path / "a", figures=False, n_boot=300, seed=5).read_bytes()
    b = write_report(resumed, dest=tmp_path / "b", figures=False, n_boot=300, seed=5).read_bytes()
    assert a == b
    sa, sb = summarize(run, n_boot=300, seed=5), summarize(resumed, n_boot=300, seed=5)
    assert sa.tokens_per_call == sb.tokens_per_call and sa.speedup == sb.speedup
    assert sa.configurations == sb.configurations


# --------------------------------------------------------------------------- 5. inputs that are not this run's
def _with_column(t, p):
    return t.append_column("extra", pa.array([0] * t.num_rows)) if p.name == "shard-00001.parquet" else t


@pytest.mark.parametrize(("edit", "match"), [
    (_with_column, r"shard '.*shard-00001\.parquet' does not hold a profile's rows: unknown column extra"),
    (lambda t, p: t.drop(["m"]) if p.name == "shard-00002.parquet" else t,
     r"shard '.*shard-00002\.parquet' does not hold a profile's rows: no column m \(an older schema\?\)"),
])
def test_a_shard_of_another_schema_is_refused_by_name(run, tmp_path, edit, match):
    with pytest.raises(ValueError, match=match):
        summarize(_variant(run, tmp_path, edit), n_boot=50)


def test_unreadable_files_and_strays_are_refused_by_name(run, tmp_path):
    out = _variant(run, tmp_path)
    (out / "shard-00001.parquet").write_bytes(b"garbage")
    with pytest.raises(ValueError, match=r"shard '.*shard-00001\.parquet' cannot be read as Parquet"):
        summarize(out, n_boot=50)
    out = _variant(run, tmp_path / "s")
    shutil.copy(out / "shard-00000.parquet", out / "shard-00007.parquet")
    with pytest.raises(ValueError, match=r"shard '.*shard-00007\.parquet' is not one of the 3 shards"):
        summarize(out, n_boot=50)
    out = _variant(run, tmp_path / "m")
    (out / "manifest.json").write_text("{")
    with pytest.raises(ValueError, match=r"'.*manifest\.json' cannot be read as a profile manifest"):
        summarize(out, n_boot=50)
    man = json.loads((run / "manifest.json").read_text())
    del man["settings"]
    (out / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(ValueError, match=r"'.*manifest\.json' is not a profile manifest: it has no settings"):
        summarize(out, n_boot=50)


def test_a_calibration_with_one_timing_says_its_intervals_lack_the_timing_scatter(run, tmp_path):
    def once(t, p):  # the first timing of every calibrated call only
        seen, keep = set(), []
        for row in zip(t["kind"].to_pylist(), t["name"].to_pylist(), t["k"].to_pylist(), t["m"].to_pylist()):
            keep.append(not (row[0] == "cost" and row in seen))
            seen.add(row)
        return t.filter(pa.array(keep))

    text = write_report(_variant(run, tmp_path, once), figures=False, n_boot=100).read_text()
    assert "**Every call was timed once**: no timing was repeated" in text
    assert "(timed once)" in text and "median of 1 timings" not in text and not NAN.search(text)
    assert "**Every call was timed once**" not in write_report(run, dest=tmp_path / "r", figures=False,
                                                               n_boot=100).read_text()


def test_a_difference_takes_student_on_its_own_scale_whatever_its_sign():
    # a gap or paired difference whose resamples happen to be all positive is not put on the log scale (which
    # stretched a gap to a bound of 0.33 [0.13, 0.57] from 4 prompts to [0.07, 1.49], beside [-0.10, 0.36] for
    # the same kind of gap whose resamples crossed 0)
    from otspec.profile._summary import _interval

    rng = np.random.default_rng(0)
    res = np.abs(0.3 + 0.1 * rng.standard_normal(2000))
    d = _interval(0.3, res, 0, 4, difference=True)
    assert d.hi - 0.3 == pytest.approx(0.3 - d.lo, rel=1e-12)  # symmetric: Student's ends on both sides
    r = _interval(0.3, res, 0, 4)  # a positive ratio: the log scale, its ends positive
    assert r.lo > 0 and r.hi - 0.3 > 0.3 - r.lo
