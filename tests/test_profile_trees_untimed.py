"""The trees' prediction (a) when the racing cost calibration timed no tree family within its budget.

Prediction (a) adds the decoder's measured work outside the forward passes; a ``(k, L)`` family with no timed
configuration gets none and is not ranked. The tree families follow the same rule: with the decoder timed (plain
decoding at least) but no tree family's decode, no tree has a prediction (a) -- it is NaN, the summary's
configurations and device-aware choices leave the trees out, and the report says which families were left untimed
and that raising ``calibration_s`` would time them; prediction (b), the forward passes alone, is still shown.

Model calls are priced on the fake clock of ``tests/test_profile_calibration_budget.py`` (every timing exact and the
same in every run): with the toy pair, four prompts and one top-k tree, a budget of 72 s times plain decoding and
k-Seq at (1, 1) but not the tree; 96 s times the tree too.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("pyarrow")

from otspec._timing import clock  # noqa: E402
from otspec.profile import profile, summarize, write_report  # noqa: E402
from tests.test_profile_calibration_budget import SETTINGS, _pair  # noqa: E402

TREE = "topk:branching(2)"
#: Budgets (seconds on the fake clock) that leave the tree untimed, and that time it.
NO_TREE, WITH_TREE = 72.0, 96.0


def _run(tmp_path, budget: float):
    now = [0.0]
    d, t = _pair(now)
    out = tmp_path / f"run{budget:g}"
    with clock(lambda: now[0]):
        profile([[0, 1], [2], [3, 4], [1]], out=out, draft=d, target=t, progress=False, max_new_tokens=4,
                **dict(SETTINGS, trees=[TREE], calibration_s=budget))
    return out, summarize(out, n_boot=20)


def test_no_tree_timed_leaves_the_trees_without_prediction_a(tmp_path):
    out, s = _run(tmp_path, NO_TREE)
    steps = {key[0] for key in s.timings if key[0].startswith("step:")}
    assert "step:plain" in steps and f"step:{TREE}" not in steps and (f"untimed:{TREE}", 2, 1) in s.timings
    assert s.costs.decoder_measured
    ts = s.trees
    assert ts.unranked == (TREE,)
    assert np.isnan(ts.speedup[TREE].value)
    # prediction (b) stands: the forward passes alone (the value the old, optimistic prediction (a) gave too)
    np.testing.assert_allclose(ts.speedup_forward[TREE].value, 0.7121470762941629, rtol=1e-12)
    # not ranked: no tree among the configurations, no device-aware static shape nor EAGLE-2 choice
    assert s.configurations and all(c.kind == "chain" for c in s.configurations)
    assert all(np.isfinite(c.speedup.value) for c in s.configurations)
    ch = ts.choice
    assert ch is not None and ch.static and ch.fastest is None and ch.export == {}
    assert all(np.isnan(st.speedup.value) for st in ch.static)
    assert all(np.isfinite(st.speedup_forward.value) for st in ch.static)
    text = write_report(out, figures=False).read_text()
    assert f"No tree family was timed ({TREE} left untimed): the trees have no prediction (a)" in text
    assert "raising `calibration_s` (`--calibration-s`) would time them" in text
    assert "Not ranked, no prediction (a)" in text and f"{TREE} (forward passes alone: 0.71" in text
    assert "**No device-aware choice**" in text
    assert "optimistic beside the chains'" not in text


def test_a_tree_timed_keeps_the_results(tmp_path):
    # the values of the code before this change (the same fake clock, the same seeds), but for the tree's timed
    # decodes: their last iteration, one token left, is now plain decoding's step (a tree's last iterations draft
    # only the levels left), so their steady span ends one iteration earlier, before it (the same tokens; the tree's
    # step 2.5 fake seconds instead of 2.4667 over the three iterations that included a whole tree's drafts there)
    out, s = _run(tmp_path, WITH_TREE)
    ts = s.trees
    assert ts.unranked == ()
    e = ts.speedup[TREE]
    # the interval on these few prompts (fewer than MIN_PERCENTILE_PROMPTS) is widened to at least Student's on the
    # prompts' part of the resamples: it holds the percentile interval of before, [0.6786290950511976,
    # 0.6880555158366166]
    np.testing.assert_allclose([e.value, e.lo, e.hi], [0.6836611932423939, 0.6732175717933452, 0.6942668265484423],
                               rtol=1e-12)
    assert e.lo < 0.6786290950511976 and e.hi > 0.6880555158366166
    np.testing.assert_allclose(ts.speedup_forward[TREE].value, 0.7121470762941629, rtol=1e-12)
    ch = ts.choice
    assert ch.fastest is not None and ch.fastest.n == 2
    np.testing.assert_allclose([st.speedup.value for st in ch.static], [0.6013372287793163, 0.6880555158366184],
                               rtol=1e-12)
    kinds = [c.kind for c in s.configurations]
    assert "tree" in kinds and "chosen tree" in kinds
    text = write_report(out, figures=False).read_text()
    assert "No tree family was timed" not in text and "Not ranked, no prediction (a)" not in text
    assert "**Device-aware choice**: n = 2 nodes" in text


def test_nothing_with_a_prediction_a_is_said_not_ranked(tmp_path):
    # no configuration left with a prediction (a) (here: the chains' ranking removed as well): the report says it
    # cannot rank, never that nothing was profiled, and still names the trees left out with their prediction (b)
    from otspec.profile._report import _recommendation_lines

    _, s = _run(tmp_path, NO_TREE)
    lines = "\n".join(_recommendation_lines(dataclasses.replace(s, configurations=(), recommendation=None)))
    assert "No lossless configuration has a prediction (a): this report cannot rank them" in lines
    assert "nothing to recommend" not in lines and f"{TREE} (forward passes alone" in lines


def test_a_run_that_timed_no_decoder_counts_the_forward_passes_for_the_trees_too(tmp_path):
    # a budget too small for plain decoding: nothing decoded, both predictions count the forward passes alone, for
    # the chains and the trees alike (unchanged): the trees are ranked on those
    _, s = _run(tmp_path, 1.0)
    assert not s.costs.decoder_measured and s.trees.unranked == ()
    np.testing.assert_allclose(s.trees.speedup[TREE].value, s.trees.speedup_forward[TREE].value, rtol=1e-12)
    assert any(c.kind == "tree" for c in s.configurations)
