"""The profile's summary and report as a reader meets them: one position set per table, the recommendation first,
measured costs in the speed-up model, figures for every family with integer axes."""

from __future__ import annotations

import re

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("pyarrow")

import pyarrow.compute as pc  # noqa: E402

from otspec.profile import ProfileSettings, profile, read_table, summarize, toy_pair, write_report  # noqa: E402
from otspec.profile._collect import COST_REPEATS, cost_shapes  # noqa: E402
from otspec.profile._figures import plot_acceptance_vs_k, plot_speedup, plot_tokens_vs_L  # noqa: E402
from otspec.profile._overhead import overhead_configs  # noqa: E402
from otspec.profile._summary import MIN_RANKED_POSITIONS, Costs  # noqa: E402

PROMPTS = [[0, 1], [2], [3, 4], [1, 1, 2], [4], [0]]
SETTINGS = dict(k_max=3, L_max=3, max_new_tokens=8, subsample=4, verifiers=["token", "optimal", "kseq", "top-k"],
                families=["token", "block", "kseq", "multiround", "typical"], progress=False)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    d, t = toy_pair(5, seed=1)
    profile(PROMPTS, out=out, draft=d, target=t, **SETTINGS)
    return out


@pytest.fixture(scope="module")
def summary(run):
    return summarize(run, n_boot=300)


def test_every_table_rests_on_one_set_of_positions(summary):
    sets = summary.sets
    assert set(sets) == {"all", "subsample"}
    assert sets["all"].positions == summary.positions == len(PROMPTS) * SETTINGS["max_new_tokens"]
    assert 0 < sets["subsample"].positions < sets["all"].positions
    for ps in sets.values():
        assert {e.positions for e in ps.tokens_per_call.values()} == {ps.positions}
        assert {e.positions for e in ps.speedup.values()} == {ps.positions}
    # the costly schemes are only in the subsample's table; the cheap ones in both
    assert {f for f, _, _ in sets["all"].tokens_per_call} == {"token", "block"}
    assert {f for f, _, _ in sets["subsample"].tokens_per_call} == {"token", "block", "kseq", "multiround", "typical"}


def test_schemes_equal_in_law_are_equal_on_common_positions(summary):
    # k-Seq and recursive rejection at k = 1 are token verification: on the same positions, the same numbers
    sub = summary.sets["subsample"]
    for L in range(1, SETTINGS["L_max"] + 1):
        for f in ("kseq", "multiround"):
            assert sub.tokens_per_call[(f, 1, L)] == sub.tokens_per_call[("token", 1, L)]
        for j in range(1, L + 1):  # two closed forms of one number: equal to rounding
            a, b = sub.acceptance[("kseq", 1, j)], sub.acceptance[("token", 1, j)]
            assert a.positions == b.positions
            np.testing.assert_allclose([a.value, a.lo, a.hi], [b.value, b.lo, b.hi], rtol=1e-12)


def test_recommendation_is_the_fastest_lossless_configuration(summary):
    sub = summary.sets["subsample"]
    rec = sub.recommendation  # every scheme is computed there
    # 12 subsampled positions: too few to rank the costly schemes, so the summary ranks the others on all 48
    assert sub.positions < MIN_RANKED_POSITIONS and summary.recommendation is summary.sets["all"].recommendation
    lossless = {key: e.value for key, e in sub.speedup.items() if key[0] != "typical"}
    order = sorted(lossless, key=lambda key: (-lossless[key], key))
    assert (rec.best, rec.runner_up) == (order[0], order[1])
    assert rec.speedup == sub.speedup[rec.best] and rec.tokens_per_call == sub.tokens_per_call[rec.best]
    np.testing.assert_allclose(rec.difference.value, lossless[order[0]] - lossless[order[1]], rtol=0, atol=1e-12)
    assert rec.difference.lo <= rec.difference.value <= rec.difference.hi
    assert [key for key, _ in rec.ranking] == order and all(key[0] != "typical" for key, _ in rec.ranking)


def test_measured_costs_predict_from_the_calibration(run, summary):
    # independent route: the medians straight from the stored calibration rows
    t = read_table(run, timing=True)
    t = t.filter(pc.equal(t["kind"], "cost"))
    rows = {}
    for name, k, m, v in zip(*(t[c].to_pylist() for c in ("name", "k", "m", "value"))):
        rows.setdefault((name, k, m), []).append(v)
    shards = 1
    shapes = cost_shapes(summary_settings := type("S", (), SETTINGS))
    calls = {key for key in rows if key[0] in ("target", "draft")}
    assert sorted(calls) == sorted({("target", k, m) for k, m in shapes["target"]} | {
        ("draft", k, m) for k, m in shapes["draft"]})
    # the racing calibration: every shape and configuration timed at least once, the baseline (plain decoding's call
    # and step, the draft's first step) every repetition, nothing more than COST_REPEATS times
    assert all(1 <= len(v) <= COST_REPEATS * shards for v in rows.values())
    assert all(len(rows[key]) == COST_REPEATS for key in (("target", 1, 1), ("draft", 1, 1), ("step:plain", 1, 1)))
    med = {key: float(np.median(v)) for key, v in rows.items()}

    def env(name, k, m):  # the monotone envelope: at least as dear as any call on fewer rows and tokens
        return max(v for (n, a, b), v in med.items() if n == name and a <= k and b <= m)

    c = summary.costs
    assert c.source == "measured" and summary_settings.k_max == 3
    assert c.plain == med[("target", 1, 1)]
    def fwd(k, L):
        return env("draft", 1, 1) + (L - 1) * env("draft", k, 1) + env("target", k, L + 1)

    # the decoder's work beyond the calibrated forwards: its measured step less them, exact at the timed points
    np.testing.assert_allclose(c.overhead_plain, med[("step:plain", 1, 1)] - med[("target", 1, 1)], rtol=1e-12)
    timed = {(n.split(":")[1], k, L): v for (n, k, L), v in med.items() if n.startswith("step:")}
    untimed = {(n.split(":")[1], k, L) for (n, k, L) in med if n.startswith("untimed:")}
    assert {f for f, _, _ in timed} == set(SETTINGS["families"]) | {"plain"}  # every family at least once
    # every configuration of the calibration timed, or left out with its reason recorded (k it supports, <= 2)
    profiled = ProfileSettings(**{key: v for key, v in SETTINGS.items() if key != "progress"})
    assert set(timed) | untimed == set(overhead_configs(profiled)) | {("plain", 1, 1)}
    assert not set(timed) & untimed and ("kseq", 2, 3) in set(timed) | untimed and ("block", 2, 3) not in untimed
    for (f, k, L), v in timed.items():
        if f != "plain":
            np.testing.assert_allclose(c.overhead[(f, k, L)], v - fwd(k, L), rtol=1e-9, atol=1e-15)
    for k in range(1, 4):
        for L in range(1, 4):
            it = env("draft", 1, 1) + (L - 1) * env("draft", k, 1) + env("target", k, L + 1)
            np.testing.assert_allclose(c.iteration(k, L), it, rtol=1e-15)
            if k == 1:
                tpc = summary.sets["all"].tokens_per_call[("token", 1, L)].value
                np.testing.assert_allclose(summary.sets["all"].speedup_forward[("token", 1, L)].value,
                                           tpc * med[("target", 1, 1)] / it, rtol=1e-12)
                dec = (med[("target", 1, 1)] + c.overhead_plain) / (it + c.overhead[("token", 1, L)])
                np.testing.assert_allclose(summary.sets["all"].speedup[("token", 1, L)].value, tpc * dec,
                                           rtol=1e-12)


def test_speedup_intervals_carry_the_timing_spread(run):
    # the costs' bootstrap replicates resample each call's timing repetitions: they vary, within the repetitions (a
    # call the racing calibration timed once: within its timing scaled by the pooled deviations of the repeated ones)
    from otspec.profile._summary import _costs, _pooled_deviations, _replicates, read_manifest

    settings = read_manifest(run)["settings"]
    c = _costs(run, settings, None, None)
    reps = _replicates(c, settings, 400, 0)
    it = np.asarray(reps.iteration(2, 3))
    assert it.shape == (400,) and np.ptp(it) > 0
    low = _pooled_deviations(c.samples)["calls"].min()

    def least(key):
        v = c.samples[key]
        return min(v) if len(v) > 1 else v[0] * (1.0 + low)

    assert it.min() >= least(("draft", 1, 1)) + 2 * least(("draft", 2, 1)) + least(("target", 2, 4)) - 1e-15


def test_a_call_cheaper_than_a_smaller_one_is_flagged_and_not_predicted_from():
    from otspec.profile._summary import _cost_violations, _envelope

    med = {("target", 1, 1): 10.0, ("target", 1, 3): 4.0, ("target", 4, 5): 12.0, ("draft", 1, 1): 1.0,
           ("draft", 2, 1): 0.95}
    spread = {key: 0.1 for key in med}
    got = _cost_violations(med, spread)
    assert len(got) == 1 and got[0].startswith("target: 1 rows x 3 tokens 4000.000 ms, cheaper than 1 x 1")
    env = _envelope(med)
    assert env[("target", 1, 3)] == 10.0 and env[("target", 4, 5)] == 12.0 and env[("draft", 2, 1)] == 1.0
    assert _cost_violations(env, spread) == ()


def test_given_costs_keep_the_relative_model(run):
    s = summarize(run, draft_cost=0.25, score_cost=2.0, n_boot=50)
    assert s.costs.source == "given"
    for L in range(1, 4):
        e = s.sets["all"]
        np.testing.assert_allclose(e.speedup[("token", 1, L)].value,
                                   e.tokens_per_call[("token", 1, L)].value / (0.25 * L + 2.0), rtol=1e-12)
    with pytest.raises(ValueError, match="`draft_cost` must be a finite number >= 0"):
        summarize(run, draft_cost=-1.0)
    assert isinstance(s.costs, Costs)


@pytest.mark.parametrize(("options", "error", "match"), [
    (dict(score_cost=0.0), ValueError, r"`score_cost` must be a finite number > 0, got 0\.0"),
    (dict(draft_cost=0.0, score_cost=0.0), ValueError, r"`score_cost` must be a finite number > 0"),
    (dict(score_cost=float("inf")), ValueError, r"`score_cost` must be a finite number > 0"),
    (dict(draft_cost="0.1"), TypeError, r"`draft_cost` must be a number, got str"),
    (dict(score_cost=True), TypeError, r"`score_cost` must be a number, got bool"),
])
def test_given_costs_out_of_range_are_refused_before_the_run_is_read(tmp_path, options, error, match):
    # a free scoring call made every speed-up a division by zero (a traceback from the tree costs); the folder
    # need not hold a run: the costs are checked first
    with pytest.raises(error, match=match):
        summarize(tmp_path / "none", **options)
    assert not (tmp_path / "none").exists()


def test_report_leads_with_the_recommendation(run):
    text = write_report(run, n_boot=200).read_text()
    sections = re.findall(r"^## (.*)$", text, flags=re.M)
    assert sections[0] == "Recommendation"
    first_table = [ln for ln in text.split("## Recommendation")[1].splitlines() if ln.startswith("|")]
    assert first_table[0] == ("| rank | configuration | verifier | engine settings | engines | positions | "
                              "tokens per call | speed-up | forward passes alone |")
    assert first_table[2] == "| baseline | plain decoding | - | - | every engine | - | 1 | 1 | 1 |"
    assert first_table[3].startswith("| 1 | ")
    # prediction (b), the forward passes alone, beside (a) in every ranked row
    s = summarize(run, n_boot=200)
    assert all(c.speedup_forward is not None for c in s.configurations)
    ranked = first_table[3:3 + len(s.configurations)]
    assert all(re.match(r"\| \d+ \| ", row) and row.count("|") == 10 and not row.endswith("| - |") for row in ranked)
    assert "below 1 is slower than plain decoding" in text
    assert "Runner-up:" in text and "paired difference in speed-up, best - runner-up" in text
    # every table names its positions; no mean of one set of positions beside another's
    for title in sections:
        if title.startswith(("Tokens per target call", "Mean acceptance")):
            assert "on all" in title or "of the subsample" in title
    assert "every 4th profiled position only" in text


def test_report_works_without_the_optimal_family(tmp_path):
    # the first-contact crash: a run whose families do not include "optimal"
    d, t = toy_pair(4, seed=0)
    profile([[0, 1], [2]], out=tmp_path, draft=d, target=t, k_max=2, L_max=2, max_new_tokens=16,
            families=["token", "kseq", "block"], verifiers=["token"], progress=False)
    path = write_report(tmp_path, n_boot=50)
    assert path.is_file() and {p.name for p in tmp_path.glob("*.png")} == {
        "acceptance_vs_k.png", "tokens_vs_L.png", "speedup.png"}


def test_figures_draw_every_family_with_integer_axes(summary):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    plot_acceptance_vs_k(summary, depth=2, positions="subsample", ax=ax)
    assert all(float(x).is_integer() for x in ax.get_xticks())
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "alpha_k: ceiling of k i.i.d. drafts" in labels and "top-k (own draft process)" in labels
    ax.clear()
    plot_tokens_vs_L(summary, k=2, positions="subsample", ax=ax)
    assert all(float(x).is_integer() for x in ax.get_xticks())
    assert {t.get_text() for t in ax.get_legend().get_texts()} == {"kseq", "multiround"}
    for fam in ("token", "block", "kseq", "multiround", "typical"):
        ax.clear()
        plot_speedup(summary, family=fam, positions="subsample", ax=ax)
    with pytest.raises(ValueError, match="`family` must be one of"):
        plot_speedup(summary, family="optimal", positions="subsample", ax=ax)
    with pytest.raises(ValueError, match="`positions` must be one of"):
        plot_tokens_vs_L(summary, positions="half", ax=ax)
    plt.close("all")


def test_the_recommendation_ranks_every_scheme_when_the_subsample_is_large_enough(tmp_path):
    d, t = toy_pair(5, seed=1)
    profile(PROMPTS, out=tmp_path, draft=d, target=t, **{**SETTINGS, "subsample": 1})
    s = summarize(tmp_path, n_boot=100)
    assert s.sets["subsample"].positions == s.positions >= MIN_RANKED_POSITIONS
    assert s.recommendation is s.sets["subsample"].recommendation
    assert {f for (f, _, _), _ in s.recommendation.ranking} == {"token", "block", "kseq", "multiround"}
    text = write_report(tmp_path, n_boot=100, figures=False).read_text()
    assert "Not ranked" not in text


def test_report_says_which_schemes_are_not_ranked(run):
    text = write_report(run, n_boot=100, figures=False).read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("Not ranked:"))
    assert "kseq, multiround" in line and "typical" not in line and "12 positions" in line


def test_cli_default_families_at_a_vocabulary_that_leaves_optimal_out(tmp_path, capsys):
    # the first-contact path: default families where "optimal" is left out (V above 1024), then the report
    from otspec.__main__ import main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"input_ids": [0, 1]}\n{"input_ids": [2]}\n')
    out = tmp_path / "run"
    assert main(["profile", "--draft", "toy:1100", "--target", "toy:1100", "--prompts", str(prompts), "--out",
                 str(out), "--k-max", "2", "--L-max", "2", "--max-new-tokens", "3", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "optimal (--families)" in printed and "above 1024 tokens" in printed
    assert main(["report", str(out), "--no-figures"]) == 0
    text = (out / "report.md").read_text()
    assert text.split("\n## ")[1].startswith("Recommendation")
    assert "- Left out (families): optimal -- " in text and "above 1024 tokens" in text


def test_a_family_the_decoder_refused_gets_no_prediction_a():
    from otspec.profile._summary import Costs, _overhead

    med = {("draft", 1, 1): 1.0, ("draft", 2, 1): 1.5, ("target", 1, 1): 4.0, ("target", 1, 2): 5.0,
           ("target", 2, 2): 6.0, ("step:kseq", 1, 1): 7.0, ("step:token", 1, 1): 6.0, ("step:plain", 1, 1): 5.0}
    env = dict(med)
    over, plain, _, _ = _overhead(med, {"k_max": 2, "L_max": 1, "families": ["token", "kseq"]}, env)
    assert over == {("token", 1, 1): 0.0, ("kseq", 1, 1): 1.0} and plain == 1.0  # kseq refused at k = 2: none
    c = Costs("measured", 4.0, {(1, 1): 5.0, (2, 1): 6.0}, {1: 1.0, 2: 1.5}, "", overhead=over, overhead_plain=plain)
    assert c.decoder_iteration("kseq", 1, 1) == 7.0 and np.isnan(c.decoder_iteration("kseq", 2, 1))


def test_report_says_which_predictions_a_rest_on_the_fitted_line():
    from otspec.profile._report import _fitted_sentence
    from otspec.profile._summary import Costs, _overhead

    env = {("draft", k, 1): 0.0 for k in (1, 2)} | {("target", k, m): 0.0 for k in (1, 2) for m in (1, 2, 3, 4)}
    med = {("step:kseq", 1, 1): 4.5, ("step:kseq", 1, 2): 5.0, ("step:kseq", 1, 3): 8.5, ("step:kseq", 2, 3): 15.0,
           ("step:plain", 1, 1): 2.0, **env}
    over, plain, _, fit = _overhead(med, {"k_max": 2, "L_max": 3, "families": ["kseq"]}, env)
    assert set(fit) == {("kseq", 2, 1), ("kseq", 2, 2)}  # k = 2 below L_max: read off the line
    c = Costs("measured", 1.0, {}, {}, "", overhead=over, overhead_plain=plain, overhead_fit=fit)
    text = _fitted_sentence(c)
    assert "timed itself" in text and "2 others" in text and "residual error" in text
    assert _fitted_sentence(Costs("measured", 1.0, {}, {}, "", overhead=over, overhead_plain=plain)) == ""
