"""The report as a serving engineer acts on it: one answer across the (k, L) schemes and the draft trees, every
figure and table on the positions it claims, every number with its unit and its provenance."""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("pyarrow")
pytest.importorskip("matplotlib")

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import otspec  # noqa: E402
from otspec.profile import profile, summarize, toy_pair, write_report  # noqa: E402
from otspec.profile._figures import plot_chosen_tree, plot_tree_speedup, plot_tree_tokens  # noqa: E402
from otspec.profile._report import ONE_PROMPT, report_markdown  # noqa: E402
from otspec.profile._summary import (  # noqa: E402
    CHAIN_ENGINES,
    DETERMINISTIC_VERIFIER,
    MIN_RANKED_POSITIONS,
    Estimate,
    StaticShape,
    _universe_edge,
    configurations,
    cost_inversions,
)
from otspec.tree import TreeShape  # noqa: E402

# 16 prompts of 4 positions: 64 profiled positions, 32 held out (the odd-indexed prompts): both enough to rank
PROMPTS = [[i % 6, (5 * i + 1) % 6] for i in range(16)]
TREES = ["topk:branching(2,2)", "eagle2:2,2,4", "eagle2:3,2,5", "iid:branching(2,1):specinfer",
         "wor:branching(2,2):sequoia,traversal"]
RUN = dict(k_max=2, L_max=2, max_new_tokens=4, verifiers=["token"], families=["token", "block", "kseq"],
           subsample=1, trees=TREES, tree_universe="branching(3,2,2)", progress=False)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("answer") / "run"
    d, t = toy_pair(6, seed=2)
    profile(PROMPTS, out=out, draft=d, target=t, **RUN)
    return out


@pytest.fixture(scope="module")
def summary(run):
    return summarize(run, n_boot=200)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """2 prompts of 4 positions, the costly scheme at every 64th: its subsample is 1 position of 1 prompt."""
    out = tmp_path_factory.mktemp("small") / "run"
    d, t = toy_pair(4, seed=0)
    profile([[0, 1], [2]], out=out, draft=d, target=t, k_max=2, L_max=2, max_new_tokens=4, subsample=64,
            families=["token", "kseq", "block"], verifiers=["token", "kseq"], progress=False)
    return out


def _section(text: str, title: str) -> str:
    return text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


# --------------------------------------------------------------------------- 1. one answer first
def test_every_configuration_is_ranked_by_one_speed_up(summary):
    configs = summary.configurations
    ts, ch, rec = summary.trees, summary.trees.choice, summary.recommendation
    # the (k, L) schemes of the recommendation, every lossless tree family, and the chosen static shape held out
    assert {c.key for c in configs if c.kind == "chain"} == {key for key, _ in rec.ranking}
    assert {c.key for c in configs if c.kind == "tree"} == set(ts.families)
    (chosen,) = [c for c in configs if c.kind == "chosen tree"]
    assert chosen.speedup == ch.fastest.speedup and chosen.positions == "held out"
    assert chosen.speedup.positions == ch.positions[1] >= MIN_RANKED_POSITIONS
    values = [c.speedup.value for c in configs]
    assert values == sorted(values, reverse=True)
    for c in configs:
        if c.kind == "tree":
            assert c.speedup == ts.speedup[c.key] and c.speedup.positions == ts.positions
        if c.kind == "chain":
            assert c.speedup == summary.sets[c.positions].speedup[c.key]
    by = {c.key: c for c in configs}
    # a deterministic tree is verified by any lossless rule; EAGLE-2 carries SGLang's flags, a top-k tree its
    # medusa_choices; which engines ship each is said
    assert by["eagle2:3,2,5"].verifier == DETERMINISTIC_VERIFIER == by["topk:branching(2,2)"].verifier
    assert by["eagle2:3,2,5"].settings == ("--speculative-num-steps 3 --speculative-eagle-topk 2 "
                                           "--speculative-num-draft-tokens 5")
    assert by["eagle2:3,2,5"].engines == "SGLang"
    assert by["topk:branching(2,2)"].settings == "medusa_choices = [[0], [1], [0, 0], [0, 1], [1, 0], [1, 1]]"
    assert by["wor:branching(2,2)/sequoia"].verifier == "sequoia" and by["wor:branching(2,2)/sequoia"].engines.startswith(
        "none")
    assert by[("token", 1, 2)].engines == CHAIN_ENGINES["token"] and "vLLM" in by[("token", 1, 2)].engines
    assert by[("kseq", 2, 2)].engines == "none"


def test_the_report_opens_with_one_sentence(run):
    # a draft step as dear as a target call: an iteration of depth d costs d + 1 calls and emits at most d + 1
    # tokens, so nothing beats plain decoding and the answer says so
    slow = summarize(run, draft_cost=1.0, score_cost=1.0, n_boot=200)
    assert all(c.speedup.hi < 1 for c in slow.configurations)
    text = write_report(run, dest=run.parent / "rep", n_boot=200, figures=False, draft_cost=1.0,
                        score_cost=1.0).read_text()
    first = _section(text, "Recommendation").strip().split("\n\n")[0]
    assert first.startswith("**Plain decoding is fastest on this device**")
    assert slow.configurations[0].name in first
    rows = [ln for ln in _section(text, "Recommendation").splitlines() if re.match(r"\| \d+ \|", ln)]
    assert len(rows) == len(slow.configurations)
    assert [r.split(" | ")[1] for r in rows] == [c.name for c in slow.configurations]
    # cheap drafts and scoring: a configuration clears 1, and the sentence names what to run, with what, and where
    s = summarize(run, draft_cost=0.01, score_cost=1.0, n_boot=200)
    best = next(c for c in s.configurations if c.speedup.lo > 1)
    first = _section(report_markdown(s), "Recommendation").strip().split("\n\n")[0]
    assert first.startswith(f"Run **{best.name}** (verifier: {best.verifier}")
    assert f"{best.speedup.value:.2f} [{best.speedup.lo:.2f}, {best.speedup.hi:.2f}]" in first
    assert f"(engines: {best.engines})" in first
    if best.settings:
        assert f"; engine settings: `{best.settings}`)" in first
    # what no engine ships comes with the fastest configuration that one does
    shipped = next(c for c in s.configurations if c.engines != "none" and not c.engines.startswith("none ("))
    second = _section(report_markdown(s), "Recommendation").strip().split("\n\n")[1]
    assert best.engines.startswith("none")  # a tree drawn without replacement, at these costs
    assert second.startswith(f"No serving engine ships it; the fastest that one does ({shipped.engines}): "
                             f"**{shipped.name}**")


def test_engine_settings_too_long_for_the_answers_table_are_in_the_tree_section(summary):
    # a top-k family of many rank paths: its row says "see the tree section", which has to hold them
    mc = [[i] for i in range(40)]
    configs = tuple(dataclasses.replace(c, settings=f"medusa_choices = {mc}") if c.key == "topk:branching(2,2)"
                    else c for c in summary.configurations)
    text = report_markdown(dataclasses.replace(summary, configurations=configs))
    row = next(ln for ln in _section(text, "Recommendation").splitlines() if "| topk:branching(2,2) |" in ln)
    assert "| see the tree section |" in row
    trees = _section(text, "Draft trees, on all 64 profiled positions")
    assert f"- topk:branching(2,2): `medusa_choices = {mc}`" in trees


def test_a_chosen_tree_on_too_few_held_out_positions_is_not_ranked(summary):
    ts = summary.trees
    few = dataclasses.replace(ts, choice=dataclasses.replace(ts.choice, positions=(ts.choice.positions[0], 12)))
    chains = next(p for p in summary.sets.values() if p.recommendation is summary.recommendation)
    assert any(c.kind == "chosen tree" for c in configurations(chains, ts))
    ranked = configurations(chains, few)
    assert not any(c.kind == "chosen tree" for c in ranked) and len(ranked) == len(summary.configurations) - 1
    text = report_markdown(dataclasses.replace(summary, trees=few, configurations=ranked))
    assert "Not ranked: the chosen static tree" in text and "12 positions" in text


def test_one_prompt_decides_nothing_and_few_positions_are_said_in_the_answer(tmp_path, small):
    # one prompt: no interval exists, so "plain decoding is fastest" (what no interval clearing 1 means with
    # several prompts) would be a claim the run cannot make
    d, t = toy_pair(4, seed=0)
    profile([[0, 1]], out=tmp_path / "one", draft=d, target=t, k_max=2, L_max=2, max_new_tokens=4,
            families=["token", "block", "block-onestep"], verifiers=["token"], progress=False)
    s = summarize(tmp_path / "one", draft_cost=0.01, score_cost=1.0, n_boot=50)
    assert s.prompts == 1 and not any(c.speedup.has_interval for c in s.configurations)
    rec = _section(report_markdown(s), "Recommendation").strip().split("\n\n")
    assert rec[0].startswith("**Not decided: one prompt gives no interval**") and "fastest" not in rec[0].split(
        "**")[1]
    assert "Plain decoding is fastest" not in report_markdown(s)
    assert s.configurations[0].name in rec[0] and f"[{ONE_PROMPT}]" in rec[0]
    assert any(p.startswith("Ranked on as few as 4 positions, fewer than the 30") for p in rec)
    assert "1 prompt, 4 profiled positions" in report_markdown(s) and "1 prompts" not in report_markdown(s)
    # with nothing decided, the engines' line names what no engine ships (not "it")
    top = s.configurations[0]
    assert top.engines == "none"
    assert any(p.startswith(f"No serving engine ships {top.name}; the fastest that one does") for p in rec)
    slow = summarize(small, draft_cost=1.0, score_cost=1.0, n_boot=50)
    text = _section(report_markdown(slow), "Recommendation")
    assert text.strip().startswith("**Plain decoding is fastest on this device**")
    assert "Ranked on as few as 8 positions" in text


def test_trees_with_every_k_L_scheme_on_the_subsample_only(tmp_path):
    # the (k, L) schemes (here one lossy rule) computed on the subsample only: the prompts without a subsampled
    # position hold tree rows alone; they used to be missing from the summary's prompts (a KeyError in the
    # renewal starts), and the profiled positions were counted from the subsample
    d, t = toy_pair(4, seed=1)
    prompts = [[i % 4, (i + 1) % 4] for i in range(6)]
    profile(prompts, out=tmp_path / "r", draft=d, target=t, k_max=2, L_max=2, max_new_tokens=2, subsample=8,
            families=["typical"], verifiers=["typical"], trees=["topk:branching(2,1)"], progress=False)
    s = summarize(tmp_path / "r", n_boot=50)
    assert s.prompts == 6 and s.positions == 12 == s.trees.positions
    assert s.sets["subsample"].positions == 1
    e = s.trees.tokens_per_call["topk:branching(2,1)"]
    assert e.prompts == 6 and e.positions == 12
    assert {c.kind for c in s.configurations} <= {"tree", "chosen tree"}  # a lossy rule is never ranked
    assert "6 prompts, 12 profiled positions" in report_markdown(s)
    # no (k, L) figure to draw on every position: no line about one resting on "0 positions"
    text = write_report(tmp_path / "r", dest=tmp_path / "rep", n_boot=50).read_text()
    assert "0 positions" not in text and "acceptance_vs_k.png" not in text


# --------------------------------------------------------------------------- 2. the positions each figure claims
def test_no_interval_from_one_prompt(small):
    s = summarize(small, n_boot=100)
    sub = s.sets["subsample"]
    assert sub.positions == 1
    e = sub.tokens_per_call[("kseq", 2, 2)]
    assert e.prompts == 1 and not e.has_interval and format(e) == f"{e.value:.3f} [{ONE_PROMPT}]"
    assert s.sets["all"].tokens_per_call[("token", 1, 2)].prompts == 2
    text = report_markdown(s)
    table = _section(text, "Tokens per target call and predicted speed-up, on the 1 position of the subsample "
                           "(every 64th profiled position)")
    rows = [ln for ln in table.splitlines() if ln.startswith("| ") and "---" not in ln and "scheme" not in ln]
    assert rows and all(ln.count(ONE_PROMPT) == 2 for ln in rows)
    # no degenerate interval anywhere: "x [x, x]" from one prompt (three decimals and more: a speed-up's two
    # decimals may round a narrow interval over two prompts to its value)
    for a, lo, hi in re.findall(r"([-+]?\d+\.\d{3,}) \[([-+]?\d+\.\d+), ([-+]?\d+\.\d+)\]", text):
        assert not (a == lo == hi), (a, lo, hi)


def test_figures_from_too_few_positions_are_left_out_with_a_line(small, tmp_path):
    text = write_report(small, dest=tmp_path, n_boot=50).read_text()
    assert not list(tmp_path.glob("*.png"))
    line = next(ln for ln in text.splitlines() if "acceptance_vs_k.png" in ln)
    assert "left out" in line and f"fewer than the {MIN_RANKED_POSITIONS}" in line and "8 positions" in line
    assert "drawn on" not in line  # a figure left out was not drawn
    assert "## Figures\n\n- " in text and "\n\n\n" not in text


def test_the_figures_of_a_report_rest_on_the_recommendations_positions(run, summary, tmp_path):
    text = write_report(run, dest=tmp_path, n_boot=100).read_text()
    names = {p.name for p in tmp_path.glob("*.png")}
    assert names == {"acceptance_vs_k.png", "tokens_vs_L.png", "speedup.png", "trees_tokens.png",
                     "trees_speedup.png", "trees_heldout.png", "tree_chosen.png"}
    assert all(f"({n})" in text for n in names) and "left out" not in _section(text, "Figures")
    from PIL import Image

    for n in names:  # larger than the 414 x 324 pixels at which labels could not be read (the bounding box is
        w, h = Image.open(tmp_path / n).size  # fitted to what is drawn, so the exact size depends on the tree)
        assert w * h >= 1.5 * 414 * 324 and min(w, h) >= 300, (n, w, h)


def _points(ax) -> dict:
    """Every labelled errorbar point of an axes: ``label -> (x, y, marker, colour)``."""
    out = {}
    for c in ax.containers:
        line = c.lines[0]
        out[c.get_label()] = (float(line.get_xdata()[0]), float(line.get_ydata()[0]), line.get_marker(),
                              matplotlib.colors.to_hex(line.get_color()))
    return out


def test_tree_figures_draw_one_position_set_each(summary):
    ts, ch = summary.trees, summary.trees.choice
    fig, ax = plt.subplots()
    plot_tree_tokens(summary, positions="all", ax=ax)
    pts = _points(ax)
    assert set(pts) == set(ts.families)
    for name, (x, y, _, _) in pts.items():
        assert (x, y) == (ts.families[name]["n"], ts.tokens_per_call[name].value)
    assert "all 64 profiled positions" in ax.get_title()
    assert not any("static" in ln.get_label() for ln in ax.get_lines())  # no held-out curve among them
    ax.clear()
    plot_tree_speedup(summary, positions="held out", ax=ax)
    for name, (_x, y, _, _) in _points(ax).items():
        assert y == ch.heldout_speedup[name].value
        np.testing.assert_allclose(y, ch.heldout[name].value * summary.costs.plain / ts.seconds[name], rtol=1e-12)
    assert "32 held-out positions" in ax.get_title()
    curve = next(ln for ln in ax.get_lines() if ln.get_label() == "best static top-k shape of each size")
    assert list(curve.get_ydata()) == [s.speedup.value for s in ch.static]
    with pytest.raises(ValueError, match="`positions` must be one of"):
        plot_tree_tokens(summary, positions="subsample", ax=ax)
    plt.close(fig)


@pytest.mark.parametrize("positions", ["all", "held out"])
def test_tree_size_axes_read_as_plain_integers(summary, positions):
    # the logarithmic axis of sizes used matplotlib's minor labels below a decade ("2 x 10^0", overlapping)
    fig, ax = plt.subplots()
    plot_tree_tokens(summary, positions=positions, ax=ax)
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.get_xticklabels(which="both") if t.get_text()]
    assert labels and all(re.fullmatch(r"\d+", t) for t in labels), labels
    ticks = [int(t) for t in labels]
    assert ticks == sorted(set(ticks)) and ticks[0] >= 1
    sizes = [f["n"] for f in summary.trees.families.values()]
    assert ticks[-1] <= max(sizes + [s.n for s in summary.trees.choice.static]) and 1 in ticks
    plt.close(fig)


def test_one_marker_and_colour_per_family_and_legends_outside(summary):
    fig, ax = plt.subplots()
    plot_tree_tokens(summary, ax=ax)
    styles = {name: (m, c) for name, (_, _, m, c) in _points(ax).items()}
    assert len(set(styles.values())) == len(styles) == 6
    assert styles["eagle2:2,2,4"] != styles["eagle2:3,2,5"]
    assert styles["wor:branching(2,2)/sequoia"] != styles["wor:branching(2,2)/traversal"]
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    assert ax.get_legend().get_window_extent(r).x0 >= ax.get_window_extent(r).x1  # beside, never over, the points
    plt.close(fig)


def test_every_node_label_of_the_chosen_tree_is_readable(summary):
    ch = summary.trees.choice
    n = len(ch.static)  # the largest shape the universe holds: the widest tree to label
    ax = plot_chosen_tree(summary, n=n)
    fig = ax.figure
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    labels = [t for t in ax.texts if ":" in t.get_text()]
    assert len(labels) == n
    boxes = [t.get_window_extent(r) for t in labels]
    W, H = fig.get_size_inches() * fig.dpi
    for i, a in enumerate(boxes):
        assert a.x0 >= 0 and a.x1 <= W and a.y0 >= 0 and a.y1 <= H
        for b in boxes[i + 1:]:
            assert not a.overlaps(b), (a, b)
    plt.close(fig)


# --------------------------------------------------------------------------- 3. units and provenance
def test_cost_inversions_are_the_calls_cheaper_than_smaller_ones_beyond_their_spread():
    t = {("target", 1, 1): (1.0, 1.1, 1.2), ("target", 1, 3): (1.9, 2.0, 2.1), ("target", 1, 4): (1.4, 1.5, 1.6),
         ("target", 2, 3): (1.3, 2.5, 3.0), ("draft", 1, 1): (0.5, 0.6, 0.7), ("draft", 2, 1): (0.2, 0.3, 0.4),
         ("tree-target", 1, 5): (0.9, 0.95, 0.99)}
    # (1, 4) below (1, 3) beyond both spreads; (2, 3) overlaps (1, 3): noise, not flagged; the draft on 2 rows
    # below 1 row; a tree of 4 nodes below the plain call
    assert cost_inversions(t) == sorted([(("target", 1, 4), ("target", 1, 3)), (("draft", 2, 1), ("draft", 1, 1)),
                                         (("tree-target", 1, 5), ("target", 1, 1))])
    assert cost_inversions({k: v for k, v in t.items() if k[0] == "target" and k != ("target", 1, 4)}) == []


def test_the_costs_show_their_spread_the_tree_calls_and_a_non_monotone_table(summary):
    text = _section(report_markdown(summary), "Costs of the model calls")
    assert re.search(r"\| draft step on k rows \(x plain\) \| \d+\.\d\d \(\d+\.\d\d-\d+\.\d\d\) \|", text)
    assert "the target scoring a tree of 6 nodes" in text  # the tree calls behind the tree speed-ups
    # plain decoding's call is repeated in every round; a chain's shapes only while the racing calibration keeps
    # one of its configurations among the contenders, which depends on the run's own timings
    key = ("target", 1, 1)
    assert summary.timings[key] and len(summary.timings[key]) == 3
    # timings growing with the rows and tokens of a call: monotone, nothing flagged (whatever the run's own
    # noisy timings say) ...
    tm = {key: tuple(key[1] * key[2] * summary.costs.plain * f for f in (0.9, 1.0, 1.1)) for key in summary.timings}
    text = _section(report_markdown(dataclasses.replace(summary, timings=tm)), "Costs of the model calls")
    assert cost_inversions(tm) == [] and "not monotone" not in text
    # ... but scoring 2 tokens dearer than 3 beyond both spreads is flagged
    tm[("target", 1, 2)] = tuple(4 * x for x in tm[("target", 1, 2)])
    text = _section(report_markdown(dataclasses.replace(summary, timings=tm)), "Costs of the model calls")
    assert "**The cost table is not monotone**: the target scoring 1 row of 3 tokens (" in text
    assert "cheaper than the target scoring 1 row of 2 tokens" in text


def test_manifest_and_report_record_device_threads_load_and_version(run, summary):
    from importlib import metadata

    man = json.loads((run / "manifest.json").read_text())
    try:
        want = metadata.version("otspec-verifiers")
    except metadata.PackageNotFoundError:
        want = otspec.__version__
    assert man["packages"]["otspec"] == want is not None
    m = man["machine"]
    assert m["devices"] == {"draft": "cpu", "target": "cpu"} and m["torch_threads"] == torch.get_num_threads()
    assert len(m["load_average"]) == 3 and m["cpu_count"] >= 1
    text = _section(report_markdown(summary), "Costs of the model calls")
    assert f"torch threads {m['torch_threads']}" in text and "load average when the run started" in text
    assert f"otspec {want}" in text and "draft on cpu, target on cpu" in text


def test_given_costs_are_relative_units_with_their_source(run):
    s = summarize(run, draft_cost=0.1, n_boot=100)
    text = report_markdown(s)
    costs = _section(text, "Costs of the model calls")
    assert " ms" not in costs and "relative units" in costs
    assert "c = 0.100 (given: `draft_cost` / `--draft-cost`)" in costs
    assert "s = 1.000 (not given: assumed 1" in costs
    both = _section(report_markdown(summarize(run, draft_cost=0.1, score_cost=2.0, n_boot=50)),
                    "Costs of the model calls")
    assert "s = 2.000 (given: `score_cost` / `--score-cost`)" in both


def test_a_choice_at_the_edge_of_the_universe_is_flagged(run):
    U = TreeShape.branching(3, 2, 2)
    e = Estimate(1.0, 1.0, 1.0)

    def shape(*paths):
        return StaticShape(n=len(paths), paths=tuple(paths), tokens_per_call=e, speedup=e, node_values=(),
                           seconds=1.0)

    assert _universe_edge(shape((0,), (1,)), U, 20) == ()
    assert _universe_edge(shape((0,), (1,), (2,)), U, 20) == ("rank",)
    assert _universe_edge(shape((0,), (0, 0), (0, 0, 0)), U, 20) == ("depth",)
    assert _universe_edge(shape((0,), (1,)), U, 2) == ("size",)
    # cheap drafts choose the largest shape the universe holds: the report says so beside the choice
    s = summarize(run, draft_cost=0.01, n_boot=100)
    ch = s.trees.choice
    assert ch.fastest.n == len(ch.static) and "size" in ch.edge
    text = report_markdown(s)
    assert text.count("is at the edge of the recorded universe**") == 2  # the answer and the tree section
    assert "(the largest node budget recorded" in text and "`--tree-universe`" in text


def test_a_universe_holding_every_token_has_no_rank_edge(tmp_path):
    # the universe holds all V = 3 ranks under the root: a chosen tree using rank 2 could not take a rank 3, so
    # "a shape beyond it ... may be faster" would be false
    U = TreeShape.branching(3, 2, 2)
    e = Estimate(1.0, 1.0, 1.0)
    st = StaticShape(n=3, paths=((0,), (1,), (2,)), tokens_per_call=e, speedup=e, node_values=(), seconds=1.0)
    assert _universe_edge(st, U, 20, vocab=3) == ()
    assert _universe_edge(st, U, 20, vocab=4) == ("rank",)
    d, t = toy_pair(3, seed=2)
    profile([[i % 3, (i + 1) % 3] for i in range(8)], out=tmp_path / "r", draft=d, target=t, k_max=1, L_max=1,
            max_new_tokens=4, families=["token"], verifiers=["token"], tree_universe="branching(3,3)", progress=False)
    ch = summarize(tmp_path / "r", draft_cost=0.01, n_boot=50).trees.choice
    assert "rank" not in ch.edge


def test_the_draft_label_names_the_instruct_model():
    import otspec.__main__ as cli
    from otspec.decoding.real import DEFAULT_KEEP, draft_name

    assert draft_name(DEFAULT_KEEP) == "SmolLM2-135M-Instruct[24/30 layers, 13-18 skipped]"
    names = cli._model_names(*cli._pair("smollm2-skip", "smollm2"))
    assert names["draft"]["name"] == draft_name(DEFAULT_KEEP) and names["target"]["name"] == "SmolLM2-135M-Instruct"
