"""The racing cost calibration: sized to what the recommendation needs, within its budget of seconds.

Model calls are priced on a fake clock (:func:`otspec._timing.clock`): every ``logits`` call of a stand-in model
advances it by a known number of seconds, and nothing else does, so that every timing, every estimate of the
budget and every prediction is exact and the same in every run.
"""

from __future__ import annotations

import math
import tempfile

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("pyarrow")

from otspec._timing import clock  # noqa: E402
from otspec.profile import ProfileSettings, profile, summarize, toy_pair  # noqa: E402
from otspec.profile import _collect as C  # noqa: E402
from otspec.profile import _overhead as O  # noqa: E402
from otspec.profile._collect import COST_REPEATS, cost_rows, cost_shapes  # noqa: E402
from otspec.profile._summary import calibration_predictions  # noqa: E402

#: Seconds of a model call: a fixed part and a part per token scored (rows x new tokens).
FIXED, PER_TOKEN = 1.0, 0.1


class Priced:
    """A model whose calls cost ``FIXED + PER_TOKEN * tokens`` seconds on the fake clock ``now``."""

    def __init__(self, lm, now: list, scale: float = 1.0, by_rows: bool = False):
        self.lm, self.now, self.scale, self.by_rows = lm, now, scale, by_rows

    def _pay(self, tokens: int) -> None:
        self.now[0] += self.scale * (FIXED + PER_TOKEN * tokens)

    def logits(self, state, ids):
        self._pay(int(ids.shape[0]) if self.by_rows else int(np.prod(tuple(ids.shape))))
        return self.lm.logits(state, ids)

    def tree_logits(self, state, parents, tokens, **kw):
        self._pay(len(tokens))
        return self.lm.tree_logits(state, parents, tokens, **kw)

    def __getattr__(self, name):
        return getattr(self.lm, name)


def _pair(now: list, *, same: bool = False):
    d, t = toy_pair(5, seed=1)
    return Priced(t if same else d, now), Priced(t, now)


def _walk(tpc: dict) -> dict:
    """Walk rows whose tokens per call are ``tpc``: ``(family, k, L) -> tokens per call`` (one position each)."""
    cols = {c: [] for c in ("prompt", "pos", "kind", "name", "k", "j", "m", "value")}
    for (f, k, L), v in tpc.items():
        for c, x in zip(cols, (0, 0, "tau", f, k, L, 0, v - 1.0)):
            cols[c].append(x)
    return cols


def _counts(cols: dict) -> dict:
    out: dict = {}
    for n, k, m in zip(cols["name"], cols["k"], cols["m"]):
        out[(n, k, m)] = out.get((n, k, m), 0) + 1
    return out


#: Two lossless families and a lossy one at k_max = L_max = 2; the walk's tokens per call make token (1, 1) and (1, 2)
#: the contenders: with FIXED = 1 s and 0.1 s per token, prediction (a) = tokens per call x 1.1 s / (forward seconds
#: of an iteration) -- the decoder's own work costs nothing on the fake clock -- is 0.909 for token (1, 1) (2.3 s),
#: 0.849 for token (1, 2) (3.5 s, within 10 %), 0.574 for kseq (1, 1), below 0.41 for kseq's others (forward passes
#: alone too: not decoded).
SETTINGS = dict(k_max=2, L_max=2, families=["token", "kseq", "typical"], verifiers=["token"], trees=[])
TPC = {("token", 1, 1): 1.9, ("token", 1, 2): 2.7, ("kseq", 1, 1): 1.2, ("kseq", 1, 2): 1.3, ("kseq", 2, 1): 1.3,
       ("kseq", 2, 2): 1.4, ("typical", 1, 1): 1.9, ("typical", 1, 2): 2.9}


def test_contenders_get_the_repetitions_the_others_one_plain_always():
    now = [0.0]
    d, t = _pair(now, same=True)  # draft = target: every draft accepted, the decodes' lengths fixed
    s = ProfileSettings(**SETTINGS, calibration_s=None)
    with clock(lambda: now[0]):
        cols = cost_rows(d, t, [0, 1, 2], s, 0, walked=_walk(TPC), predict=calibration_predictions)
    n = _counts(cols)
    assert n[("step:plain", 1, 1)] == n[("step:token", 1, 1)] == n[("step:token", 1, 2)] == O.OVERHEAD_REPEATS
    assert n[("step:kseq", 1, 1)] == 1  # its family's first: timed once
    assert n[("step:typical", 1, 1)] == n[("step:typical", 1, 2)] == 1  # lossy: never recommended
    assert ("step:kseq", 1, 2) not in n and ("step:kseq", 2, 2) not in n
    untimed = {(nm, k, m): v for nm, k, m, v in zip(cols["name"], cols["k"], cols["m"], cols["value"])
               if nm.startswith(O.UNTIMED_PREFIX)}
    assert untimed == {("untimed:kseq", 1, 2): 2.0, ("untimed:kseq", 2, 2): 2.0}  # 2.0: "bound"
    # the contenders' call shapes (and plain decoding's) every repetition, the others' once
    shapes = cost_shapes(s)
    need = {("target", 1, 1), ("draft", 1, 1), ("target", 1, 2), ("target", 1, 3)}
    for name in ("target", "draft"):
        for k, m in shapes[name]:
            assert n[(name, k, m)] == (COST_REPEATS if (name, k, m) in need else 1), (name, k, m)
    # exact timings on the fake clock: a step of token (1, 2) is its forward passes -- the draft catching up on the
    # two tokens of the last iteration (every draft accepted) and drafting one, the target scoring 1 row of 3 tokens
    got = {nm: [v for n2, k, m, v in zip(cols["name"], cols["k"], cols["m"], cols["value"]) if (n2, k, m) == (
        nm, 1, 2)] for nm in ("step:token", "forward:token")}
    np.testing.assert_allclose(got["step:token"], 1.2 + 1.1 + 1.3, rtol=1e-12)
    np.testing.assert_allclose(got["forward:token"], got["step:token"], rtol=1e-12)


def test_contenders_from_predictions_a():
    pa = {("token", 1, 1): 2.0, ("token", 1, 2): 1.85, ("kseq", 2, 2): 1.79, ("block", 1, 1): 1.5,
          ("typical", 1, 2): 9.0, ("kseq", 1, 1): float("nan")}
    # within 10 % of the best (1.8 and above), the lossy one never
    assert O.contenders(pa) == {("token", 1, 1), ("token", 1, 2)}
    assert O.contenders(pa, margin=0.2) == {("token", 1, 1), ("token", 1, 2), ("kseq", 2, 2)}
    # the runner-up whatever its distance
    assert O.contenders({("token", 1, 1): 2.0, ("block", 1, 1): 1.0}) == {("token", 1, 1), ("block", 1, 1)}
    assert O.contenders({("typical", 1, 1): 2.0}) == set()


@pytest.mark.parametrize("budget", [30.0, 70.0, 150.0, 250.0])
def test_the_budget_is_respected(budget):
    # every call of the decodes costs known seconds: the calibration stops before a decode that would not fit; the
    # first round of call shapes (2 calls per shape, 7 shapes here: 20.2 s) is what any prediction needs and always
    # runs, so the budgets start above it; unbounded, this calibration takes 228 s
    now = [0.0]
    d, t = _pair(now, same=True)
    s = ProfileSettings(**SETTINGS, calibration_s=budget)
    shapes = cost_shapes(s)
    first = 2 * sum(FIXED + PER_TOKEN * k * m for name in ("target", "draft") for k, m in shapes[name]) + 2 * (
        FIXED + 2 * PER_TOKEN)  # and each model's prefill of the context
    assert first < budget
    with clock(lambda: now[0]):
        cols = cost_rows(d, t, [0, 1, 2], s, 0, walked=_walk(TPC), predict=calibration_predictions)
    got = dict(zip(cols["name"], cols["value"]))
    assert got["calibration:budget"] == budget
    assert got["calibration:seconds"] == now[0] <= budget
    n = _counts(cols)
    steps = {key: v for key, v in n.items() if key[0].startswith("step:")}
    left = {key for key in n if key[0].startswith(O.UNTIMED_PREFIX)}
    # every configuration timed, or recorded as left out; the baseline first: without it nothing else
    assert {(nm.partition(":")[2], k, m) for nm, k, m in set(steps) | left} == {("plain", 1, 1), *O.overhead_configs(s)}
    if ("step:plain", 1, 1) not in steps:
        assert not steps
    else:  # plain decoding has at least as many timings as any other configuration
        assert steps[("step:plain", 1, 1)] == max(steps.values())
    reasons = {(nm, k, m): v for nm, k, m, v in zip(cols["name"], cols["k"], cols["m"], cols["value"])
               if nm.startswith(O.UNTIMED_PREFIX)}
    if budget < 228:  # cut short: configurations left out for the budget (1.0), or the baseline with fewer timings
        assert 1.0 in reasons.values() or steps[("step:plain", 1, 1)] < O.OVERHEAD_REPEATS
    else:
        assert 1.0 not in reasons.values() and steps[("step:plain", 1, 1)] == O.OVERHEAD_REPEATS


def test_an_unbounded_calibration_without_a_walk_times_everything_every_round():
    # no walk rows (no tokens per call): every configuration is a contender, as the calibration was before racing
    now = [0.0]
    d, t = _pair(now, same=True)
    s = ProfileSettings(**SETTINGS, calibration_s=None)
    with clock(lambda: now[0]):
        cols = cost_rows(d, t, [0, 1, 2], s, 0)
    n = _counts(cols)
    for c in [("plain", 1, 1)] + O.overhead_configs(s):
        assert n[(f"step:{c[0]}", c[1], c[2])] == O.OVERHEAD_REPEATS
    assert not any(nm.startswith(O.UNTIMED_PREFIX) for nm in cols["name"])
    assert "calibration:budget" not in cols["name"]


def _profiled(monkeypatch, full: bool):
    """A profile of the toy pair on the fake clock; ``full``: the calibration without the walk's tokens per call (every
    configuration timed every round, as before racing)."""
    if full:
        monkeypatch.setattr(C, "walk_tokens", lambda cols: {})
    now = [0.0]
    d0, t0 = toy_pair(5, seed=1)
    # the target 3x the draft; the draft priced by its rows, so that its catching up on one or two tokens after an
    # iteration costs the same whatever was accepted: every step's seconds are then the same in every decode
    d, t = Priced(d0, now, by_rows=True), Priced(t0, now, scale=3.0)
    s = dict(SETTINGS, families=["token", "kseq", "multiround", "typical"], max_new_tokens=6, subsample=2,
             calibration_s=None)
    out = tempfile.mkdtemp()
    with clock(lambda: now[0]):
        profile([[0, 1], [2], [3, 4]], out=out, draft=d, target=t, progress=False, **s)
    monkeypatch.undo()
    return summarize(out, n_boot=50), now[0]


def test_the_recommendation_is_the_full_calibrations_when_both_see_the_same_costs(monkeypatch):
    # deterministic costs: every step's seconds per iteration are the same whatever the draws, so the full and the
    # racing calibration see the same medians; the racing one reads its untimed configurations off the family's line
    # (exact here: the decoder's work is zero on the fake clock) -- the same recommendation and predictions, fewer
    # seconds
    racing, t_racing = _profiled(monkeypatch, full=False)
    full, t_full = _profiled(monkeypatch, full=True)
    for tm in (racing.timings, full.timings):  # the premise: every timing of a call or a step the same every time
        assert all(np.ptp(v) < 1e-9 for key, v in tm.items() if key[0].partition(":")[0] in ("step", "target", "draft"))
    assert len(racing.timings[("step:token", 1, 1)]) <= len(full.timings[("step:token", 1, 1)]) == O.OVERHEAD_REPEATS
    for which in ("all", "subsample"):
        a, b = racing.sets[which].recommendation, full.sets[which].recommendation
        for key, e in full.sets[which].speedup.items():
            np.testing.assert_allclose(racing.sets[which].speedup[key].value, e.value, rtol=1e-9)

        def ranked(rec):  # exact ties (k-Seq at k = 1 is token verification) in the keys' order
            return sorted((key for key, _ in rec.ranking), key=lambda key: (-round(
                dict(rec.ranking)[key].value, 9), key))

        assert ranked(a) == ranked(b) and len(a.ranking) == len(b.ranking) >= (2 if which == "all" else 10)
        # the same best and runner-up (up to exact ties), with the same speed-ups
        np.testing.assert_allclose([a.speedup.value, a.runner_up_speedup.value],
                                   [b.speedup.value, b.runner_up_speedup.value], rtol=1e-9)
        assert ranked(a)[0] in {key for key, e in a.ranking if abs(e.value - b.speedup.value) < 1e-9 * e.value}
    assert t_racing < t_full


def test_a_configuration_timed_once_carries_a_single_timings_scatter():
    from otspec.profile._summary import _measured, _pooled_deviations, _replicates

    samples = {("target", 1, 1): (1.0, 1.2, 0.9), ("target", 1, 2): (1.5, 1.5, 1.8), ("draft", 1, 1): (0.5, 0.6, 0.5),
               ("step:plain", 1, 1): (1.1, 1.3, 1.2), ("step:token", 1, 1): (3.0,)}
    settings = {"k_max": 1, "L_max": 1, "families": ["token"]}
    med = {key: float(np.median(v)) for key, v in samples.items()}
    spread = {key: 0.5 * (max(v) - min(v)) for key, v in samples.items()}
    costs = _measured(med, settings, spread, samples)
    pool = _pooled_deviations(samples)
    assert set(pool) == {"calls", "steps"} and len(pool["calls"]) == 9 and len(pool["steps"]) == 3
    reps = _replicates(costs, settings, 2000, 0)
    step = np.asarray(reps.overhead[("token", 1, 1)]) + np.asarray(reps.iteration(1, 1))
    # the old bootstrap of one timing: that timing every time (no scatter); now 3 (1 + r), r from the steps' pool
    assert np.ptp(step) > 0
    np.testing.assert_allclose(np.unique(np.round(step / 3.0 - 1.0, 12)), np.unique(np.round(pool["steps"], 12)))
    # no step repeated (plain decoding timed once too): the steps draw the calls' scatter, never none
    once = {**samples, ("step:plain", 1, 1): (1.2,)}
    c1 = _measured({key: float(np.median(v)) for key, v in once.items()}, settings, spread, once)
    r1 = _replicates(c1, settings, 2000, 0)
    step1 = np.asarray(r1.overhead[("token", 1, 1)]) + np.asarray(r1.iteration(1, 1))
    assert "steps" not in _pooled_deviations(once) and np.ptp(step1) > 0
    assert set(np.round(step1 / 3.0 - 1.0, 12)) <= set(np.round(pool["calls"], 12))


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), 1e9])
def test_bad_calibration_s_raises_naming_it(bad):
    with pytest.raises(ValueError, match="`calibration_s` must be a finite number of seconds"):
        ProfileSettings(calibration_s=bad)


@pytest.mark.parametrize("bad", ["5", True, [5]])
def test_calibration_s_of_the_wrong_type_raises_naming_it(bad):
    with pytest.raises(TypeError, match="`calibration_s` must be a number of seconds or None"):
        ProfileSettings(calibration_s=bad)


def test_calibration_s_is_not_part_of_the_runs_identity():
    from otspec.profile._store import settings_entry

    assert ProfileSettings(calibration_s=5).calibration_s == 5.0 and ProfileSettings(calibration_s=None)
    assert settings_entry(ProfileSettings(calibration_s=5)) == settings_entry(ProfileSettings()) == settings_entry(
        ProfileSettings(calibration_s=None))
    assert math.isclose(ProfileSettings().calibration_s, 30.0)


def test_the_command_line_takes_calibration_s_and_refuses_a_bad_one_before_loading(tmp_path, capsys, monkeypatch):
    import otspec.__main__ as cli

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the error was reported")

    p = tmp_path / "p.jsonl"
    p.write_text('{"input_ids": [0, 1]}\n')
    base = ["profile", "--draft", "toy:3", "--target", "toy:3", "--prompts", str(p), "--k-max", "1", "--L-max", "1",
            "--max-new-tokens", "2", "--families", "token", "--verifiers", "token", "--no-progress"]
    with monkeypatch.context() as m:
        m.setattr(cli, "_load_pair", refuse)
        assert cli.main([*base, "--out", str(tmp_path / "bad"), "--calibration-s", "-1"]) != 0
        err = capsys.readouterr().err
        assert "`--calibration-s` must be a finite number of seconds" in err and not (tmp_path / "bad").exists()
    # 0: unbounded; the run's calibration records no budget, and a run resumes under another budget
    out = tmp_path / "run"
    assert cli.main([*base, "--out", str(out), "--calibration-s", "0"]) == 0
    assert cli.main([*base, "--out", str(out), "--calibration-s", "5"]) == 0


def test_a_budget_too_small_for_the_baseline_is_reported(tmp_path):
    # the first round of call shapes always runs (about 20 s on the fake clock here); a 1-second budget leaves no
    # room for plain decoding's decodes: nothing is decoded, both predictions count the forward passes, and the
    # report says why
    from otspec.profile import write_report

    now = [0.0]
    d, t = _pair(now)
    out = tmp_path / "run"
    with clock(lambda: now[0]):
        profile([[0, 1], [2]], out=out, draft=d, target=t, progress=False, max_new_tokens=3,
                **dict(SETTINGS, calibration_s=1.0))
    s = summarize(out, n_boot=20)
    assert s.costs.source == "measured" and not s.costs.decoder_measured
    assert not any(key[0].startswith("step:") for key in s.timings)
    assert {key for key in s.timings if key[0].startswith(O.UNTIMED_PREFIX)} == {
        (f"untimed:{f}", k, L) for f, k, L in [("plain", 1, 1), *O.overhead_configs(ProfileSettings(**SETTINGS))]}
    text = write_report(out, figures=False).read_text()
    assert "of its budget of 1 s (`calibration_s`): the budget ran out before plain decoding's decodes" in text


def test_a_tree_family_is_timed_right_after_the_baseline():
    # the trees' prediction (a) needs a timed tree decoder (the other tree families' work is interpolated in the
    # nodes from the timed ones): the smallest tree family is decoded right after plain decoding, before the chains,
    # so that a budget spent on the chains never leaves the trees with their forward passes alone
    now = [0.0]
    d, t = _pair(now, same=True)
    s = ProfileSettings(**{**SETTINGS, "trees": ["topk:branching(3,2)", "topk:branching(2)"]}, calibration_s=None)
    with clock(lambda: now[0]):
        cols = cost_rows(d, t, [0, 1, 2], s, 0, walked=_walk(TPC), predict=calibration_predictions)
    steps = [nm for nm in cols["name"] if nm.startswith("step:")]
    trees = {nm for f in s.tree_plan.families for nm in f.names()}
    assert steps[0] == "step:plain"
    smallest = min(s.tree_plan.families, key=lambda f: (f.n, f.depth)).names()[0]
    assert steps[1] == f"step:{smallest}", steps
    assert {f"step:{nm}" for nm in trees} <= set(steps)
