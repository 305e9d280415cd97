"""The upper bound on every lossless tree verifier in a profile: the rows against otspec.tree.bound at the same
context, against every verifier's exact value, one call per model, switched off, the summary, the report and bad
input."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from scipy import stats

torch = pytest.importorskip("torch")
pytest.importorskip("pyarrow")

import otspec.__main__ as cli  # noqa: E402
from otspec.models import MarkovModel  # noqa: E402
from otspec.profile import ProfileSettings, profile, read_table, summarize, toy_pair, write_report  # noqa: E402
from otspec.profile._store import read_manifest  # noqa: E402
from otspec.profile._summary import MIN_PERCENTILE_PROMPTS  # noqa: E402
from otspec.profile._tree_bound import BOUND_KIND, MAX_PROFILE_BOUND_BUDGET  # noqa: E402
from otspec.profile._trees import resolve_trees  # noqa: E402
from otspec.tree import bound, value  # noqa: E402

#: Prompts with their reference texts: the contexts of a ``context="reference"`` run are known in advance.
ITEMS = [{"input_ids": [0, 1], "reference_ids": [2, 3, 1]}, {"input_ids": [3], "reference_ids": [0, 0, 2]},
         {"input_ids": [1, 2, 3], "reference_ids": [3, 1, 0]}, {"input_ids": [2], "reference_ids": [1, 2, 2]}]
RUN = dict(k_max=1, L_max=2, max_new_tokens=3, verifiers=["token"], families=["token"], renewal=(),
           context="reference", subsample=1, shard_size=2, progress=False)


def _softmax(W: np.ndarray) -> np.ndarray:
    e = np.exp(W - W.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _context(item, pos: int) -> tuple:
    return tuple(item["input_ids"]) + tuple(item["reference_ids"][:pos])


def _bounds(out) -> dict:
    """``(prompt, pos, label) -> [value, remainder, pi_exact, n_expanded]`` from a run's bound rows."""
    t = read_table(out).to_pandas()
    got: dict = {}
    for r in t[t.kind == BOUND_KIND].itertuples():
        got.setdefault((r.prompt, r.pos, r.name), [None] * 4)[r.j - 1] = r.value
    return got


def _frame(out, *, drop=(BOUND_KIND,)):
    t = read_table(out).to_pandas()
    return t[~t.kind.isin(drop)].sort_values(["prompt", "pos", "kind", "name", "k", "j", "m"]).reset_index(drop=True)


# --------------------------------------------------------------------------- the rows are otspec.tree.bound's
@pytest.mark.parametrize(("V", "budget", "batch_size"), [(20, 6, 1), (20, 6, 2), (4, 64, 2)])
def test_rows_equal_tree_bound_at_the_same_context(tmp_path, V, budget, batch_size):
    draft, target = toy_pair(V, seed=7, closeness=0.6)
    trees = ["iid:branching(3,2):specinfer", "wor:branching(2,2):sequoia"]
    items = [{"input_ids": [x % V for x in it["input_ids"]], "reference_ids": it["reference_ids"]} for it in ITEMS]
    profile(items, out=tmp_path, draft=draft, target=target, trees=trees, bound_budget=budget,
            batch_size=batch_size, **RUN)
    got = _bounds(tmp_path)
    plan = resolve_trees(trees)
    assert len(got) == len(items) * RUN["max_new_tokens"] * len(plan.sampled)  # every position (subsample=1)
    remainders = []
    for (prompt, pos, label), (val, rem, exact, n) in got.items():
        f = next(f for f in plan.sampled if f.label == label)
        n = int(n)
        assert 1 <= n <= budget
        if V > budget:  # the context has more children than the budget: it is spent whole
            assert n == budget
        ref = bound(f.shape, draft, target, process=f.process, prefix=_context(items[prompt], pos), budget=n,
                    batch=n)
        assert ref.n_calls == 2 and ref.n_expanded == n  # the context, then its frontier in one call
        assert val == pytest.approx(ref.value, abs=1e-12, rel=0)
        assert rem == pytest.approx(ref.remainder, abs=1e-12, rel=0)
        assert exact == float(ref.pi_exact)
        remainders.append(rem)
    if V > budget:
        assert max(remainders) > 0  # a budget that leaves something open, checked too
    else:
        assert max(remainders) == 0


def test_one_call_per_model_and_subsampled_position(tmp_path, monkeypatch):
    """The draft scores trees only for the bound: one call per subsampled position of a batch, two families."""
    draft, target = toy_pair(6, seed=2)
    calls = []
    real = type(draft).tree_logits

    def counted(self, *a, **k):
        if self is draft:
            calls.append(a[1].shape)
        return real(self, *a, **k)

    monkeypatch.setattr(type(draft), "tree_logits", counted)
    profile([it["input_ids"] for it in ITEMS], out=tmp_path, draft=draft, target=target,
            trees=["iid:branching(2,2)", "wor:branching(2,1)"], bound_budget=5, batch_size=4,
            **dict(RUN, context="sample", subsample=2, shard_size=4))
    got = _bounds(tmp_path)
    # every position of the batch has a subsampled prompt (subsample 2, prompts 0..3): one call each
    assert len(calls) == RUN["max_new_tokens"]
    assert all(shape[0] == len(ITEMS) for shape in calls)
    taken = {(p, pos) for p, pos, _ in got}
    assert taken == {(p, pos) for p in range(4) for pos in range(3) if (p + pos) % 2 == 0}


# --------------------------------------------------------------------------- above every verifier
def test_bound_is_above_every_verifiers_exact_value(tmp_path):
    """At every position the bound is at least each verifier's exact E[tau] averaged over the drawn trees (on one
    drawn tree, E[tau | T] may exceed it: the bound holds for the mean over trees)."""
    draft, target = toy_pair(4, seed=4, closeness=0.7)
    trees = ["iid:branching(2,1):specinfer,target-only", "wor:branching(2,1):sequoia,traversal"]
    profile(ITEMS, out=tmp_path, draft=draft, target=target, trees=trees, bound_budget=64, **RUN)
    Pm, Qm = MarkovModel(_softmax(draft.fn.table)), MarkovModel(_softmax(target.fn.table))
    plan = resolve_trees(trees)
    got = _bounds(tmp_path)
    checked = 0
    for (prompt, pos, label), (val, rem, exact, _n) in got.items():
        assert rem == 0 and exact == 1.0  # complete at V = 4: the exact B
        f = next(f for f in plan.sampled if f.label == label)
        for v in f.verifiers:
            tau = value(f.shape, Pm, Qm, process=f.process, verifier=v, prefix=_context(ITEMS[prompt], pos))
            assert tau <= val + 1e-12
            checked += 1
    assert checked == len(ITEMS) * 3 * 4


# --------------------------------------------------------------------------- off
def test_budget_zero_turns_it_off_and_changes_nothing_else(tmp_path):
    draft, target = toy_pair(6, seed=1)
    trees = ["iid:branching(2,2)", "wor:branching(2,1):sequoia"]
    profile(ITEMS, out=tmp_path / "on", draft=draft, target=target, trees=trees, bound_budget=8, **RUN)
    profile(ITEMS, out=tmp_path / "off", draft=draft, target=target, trees=trees, bound_budget=0, **RUN)
    on, off = _frame(tmp_path / "on"), _frame(tmp_path / "off", drop=())
    assert _bounds(tmp_path / "on") and not _bounds(tmp_path / "off")
    assert len(on) == len(off) > 0
    assert (on == off).all().all()  # the same contexts, trees and values
    assert read_manifest(tmp_path / "on")["settings"]["bound_budget"] == 8
    assert "bound_budget" not in read_manifest(tmp_path / "off")["settings"]  # the manifest of runs before it
    # resumed with another budget: refused, naming it
    with pytest.raises(ValueError, match=r"bound_budget: 8 there, 16 here"):
        profile(ITEMS, out=tmp_path / "on", draft=draft, target=target, trees=trees, bound_budget=16, **RUN)
    # no sampled family, or no subsample: nothing to bound, nothing in the manifest
    assert "bound_budget" not in ProfileSettings(trees=["topk:branching(2)"]).to_dict()
    assert "bound_budget" not in ProfileSettings(trees=trees, subsample=0).to_dict()


# --------------------------------------------------------------------------- summary and report
@pytest.fixture(scope="module")
def bound_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bound")
    draft, target = toy_pair(5, seed=3)
    items = ITEMS + [{"input_ids": [4, 0], "reference_ids": [1, 4, 3]}, {"input_ids": [0], "reference_ids": [3, 3, 4]}]
    profile(items, out=out, draft=draft, target=target, trees=["iid:branching(2,2)", "wor:branching(2,2)"],
            bound_budget=4, **dict(RUN, subsample=2))
    return out


def test_summary_shares_over_prompts(bound_run):
    n_boot, seed = 300, 5
    ts = summarize(bound_run, n_boot=n_boot, seed=seed).trees
    assert set(ts.bounds) == {"iid:branching(2,2)/specinfer", "wor:branching(2,2)/sequoia",
                              "wor:branching(2,2)/traversal"}
    t = read_table(bound_run).to_pandas()
    B = t[(t.kind == BOUND_KIND) & (t.j == 1)].set_index(["prompt", "pos", "name"]).value
    prompts = np.sort(t.prompt.unique())
    N = len(prompts)
    W = np.random.default_rng(seed).multinomial(N, np.full(N, 1.0 / N), size=n_boot).astype(np.float64)
    for name, b in ts.bounds.items():
        label = name.rsplit("/", 1)[0]
        tau = t[(t.kind == "tree") & (t.name == name)]
        SE, SB, C = np.zeros(N), np.zeros(N), np.zeros(N)
        for r in tau.itertuples():
            if (r.prompt, r.pos, label) in B.index:  # the same positions
                i = int(np.searchsorted(prompts, r.prompt))
                SE[i] += r.value
                SB[i] += B[(r.prompt, r.pos, label)]
                C[i] += 1
        assert b.positions == int(C.sum()) == len(B.xs(label, level="name"))
        assert b.budget == 4 and b.verifier == name.rsplit("/", 1)[1]
        # each quantity's range (the trees have depth 2; every verifier lossless): share in [0, 1], value in
        # [0, 2], bound >= 0, gap >= 0 (a difference: Student's on its own scale)
        for est, num, den, (a, c), diff in ((b.share, SE, SB, (0.0, 1.0), False), (b.value, SE, C, (0.0, 2.0), False),
                                            (b.bound, SB, C, (0.0, np.inf), False), (b.gap, SB - SE, C, (0.0, np.inf), True)):
            assert est.value == pytest.approx(num.sum() / den.sum(), abs=1e-12)
            with np.errstate(invalid="ignore", divide="ignore"):
                res = (W @ num) / (W @ den)
            lo, hi = np.nanpercentile(res, [2.5, 97.5])
            if N < MIN_PERCENTILE_PROMPTS:  # few prompts: at least Student's interval on the bootstrap's standard error
                fin = res[np.isfinite(res)]
                q = stats.t.ppf(0.975, N - 1) * np.sqrt(N / (N - 1))
                if not diff and np.isfinite(c) and a < est.value < c:  # logit: the delta method's standard error
                    u = (est.value - a) / (c - a)
                    z, h = np.log(u / (1 - u)), q * np.std(fin, ddof=1) / ((c - a) * u * (1 - u))
                    lo = min(lo, a + (c - a) / (1 + np.exp(h - z)))
                    hi = max(hi, a + (c - a) / (1 + np.exp(-h - z)))
                elif not diff and est.value > 0 and fin.min() > 0:  # a positive estimate: on the log scale
                    h = q * np.std(np.log(fin), ddof=1)
                    lo, hi = min(lo, est.value * np.exp(-h)), max(hi, est.value * np.exp(h))
                else:
                    h = q * np.std(fin, ddof=1)
                    lo, hi = min(lo, est.value - h), max(hi, est.value + h)
            lo, hi = np.clip([lo, hi], a, c)  # the ends inside the range
            assert (est.lo, est.hi) == pytest.approx((lo, hi), abs=1e-12)
            assert est.prompts == N
        assert b.gap.value == pytest.approx(b.bound.value - b.value.value, abs=1e-12)


def test_report_says_what_share_each_rule_reaches(bound_run, tmp_path):
    text = write_report(bound_run, dest=tmp_path, figures=False).read_text()
    assert "## How far the tree verifiers are from the best possible" in text
    assert re.search(r"SpecInfer's rule reaches \d+ % \[\d+, \d+\] of what any verifier could on these trees "
                     r"\(iid:branching\(2,2\), \d+ positions; budget 4 prefixes", text), text
    assert re.search(r"Sequoia's rule reaches \d+ % \[\d+, \d+\]", text)
    assert re.search(r"Traversal Verification reaches \d+ % \[\d+, \d+\]", text)
    assert "lower bound on the true share" not in text  # pi exact at V = 5


def test_report_says_when_pi_is_only_bounded(tmp_path, monkeypatch):
    """Ranks >= 2 drawn without replacement at a vocabulary too large to enumerate the draws: pi is exact (the
    exponential race); where their laws are only bounded above (the race turned off), the report says so."""
    import otspec.tree._bound as tb

    draft, target = toy_pair(200, seed=1)
    items = [{"input_ids": [1, 2], "reference_ids": [3, 4]}, {"input_ids": [5], "reference_ids": [6, 7]}]
    profile(items, out=tmp_path / "e", draft=draft, target=target, trees=["wor:branching(3,1):sequoia"],
            bound_budget=8, **dict(RUN, max_new_tokens=2))
    assert all(v[2] == 1.0 for v in _bounds(tmp_path / "e").values())
    assert "lower bound on the true share" not in write_report(tmp_path / "e", figures=False).read_text()
    monkeypatch.setattr(tb, "_WOR_RACE", False)
    profile(items, out=tmp_path / "r", draft=draft, target=target, trees=["wor:branching(3,1):sequoia"],
            bound_budget=8, **dict(RUN, max_new_tokens=2))
    got = _bounds(tmp_path / "r")
    assert got and all(v[2] == 0.0 for v in got.values())
    b = summarize(tmp_path / "r", n_boot=50).trees.bounds["wor:branching(3,1)/sequoia"]
    assert not b.pi_exact
    text = write_report(tmp_path / "r", figures=False).read_text()
    assert re.search(r"Sequoia's rule reaches \d+ % \[\d+, \d+\] of what any verifier could on these trees "
                     r"\(wor:branching\(3,1\).*so the share is a lower bound on the true share\.", text), text


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(("budget", "err", "match"), [
    (-1, ValueError, r"`bound_budget` must be an integer >= 0, got -1"),
    (MAX_PROFILE_BOUND_BUDGET + 1, ValueError, r"`bound_budget` must be at most 1024 .*got 1025"),
    (8.0, TypeError, r"`bound_budget` must be an integer, got the float 8.0"),
    (True, TypeError, r"`bound_budget` must be an integer, got bool"),
    ("8", TypeError, r"`bound_budget` must be an integer, got str"),
])
def test_bad_budget_refused(budget, err, match):
    with pytest.raises(err, match=match):
        ProfileSettings(trees=["iid:branching(2,2)"], bound_budget=budget)


def test_budgets_above_one_calls_limits_refused():
    trees = ["iid:branching(2,2)", "wor:branching(2,2)", "iid:chains(2,2)"]
    with pytest.raises(ValueError, match=r"`bound_budget` = 1000 with 3 sampled tree families scores up to 2998 nodes"):
        ProfileSettings(trees=trees, bound_budget=1000)
    s = ProfileSettings(trees=trees, bound_budget=1024 // 3)
    with pytest.raises(ValueError, match=r"`bound_budget` = 341 at a vocabulary of 262144 tokens .* use "
                                         r"`bound_budget` <= 256"):
        s.for_vocabulary(262_144)
    assert s.for_vocabulary(1000).bound_budget == 341  # kept through the vocabulary's resolution
    assert ProfileSettings(trees=trees, bound_budget=0).for_vocabulary(1000).bound_budget == 0


def test_command_line_refuses_a_bad_budget_before_loading(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cli, "_load_pair", lambda *a, **k: pytest.fail("a model was loaded"))
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"input_ids": [0]}) + "\n")
    base = ["profile", "--draft", "toy:4", "--target", "toy:4", "--prompts", str(f), "--out", str(tmp_path / "r"),
            "--trees", "iid:branching(2,2)"]
    assert cli.main(base + ["--bound-budget", "-3"]) == 2
    assert capsys.readouterr().err.startswith("error: `--bound-budget` must be an integer >= 0, got -3")
    assert not (tmp_path / "r").exists()


def test_command_line_prints_and_records_the_bound(tmp_path, capsys):
    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps({"input_ids": p}) + "\n" for p in ([0, 1], [2])))
    args = ["profile", "--draft", "toy:4", "--target", "toy:4", "--prompts", str(f), "--out", str(tmp_path / "r"),
            "--k-max", "1", "--L-max", "1", "--max-new-tokens", "2", "--families", "token", "--verifiers", "token",
            "--no-progress", "--subsample", "1", "--trees", "iid:branching(2,1)", "--bound-budget", "3"]
    assert cli.main(args) == 0
    assert ("the subsample, draft trees: the bound on every lossless verifier of iid:branching(2,1) "
            "(--bound-budget 3)") in capsys.readouterr().out
    assert len(_bounds(tmp_path / "r")) == 4


@pytest.mark.slow  # about 20 s: the profile's cost calibration and overhead iterations on transformers models
def test_transformers_pair_left_padded_batch(tmp_path):
    """A tiny Llama pair (KV cache, tree mask, prompts of unequal lengths in one left-padded batch): the rows
    against otspec.tree.bound on the same models at the same contexts (float32 logits scored in other calls:
    1e-5)."""
    pytest.importorskip("transformers")
    from tests.toy_lm import tiny_llama

    draft, target = tiny_llama(0), tiny_llama(1)
    items = [{"input_ids": [3, 1, 4, 1, 5], "reference_ids": [9, 2]}, {"input_ids": [9, 2], "reference_ids": [6, 5]}]
    trees = ["iid:branching(2,2):specinfer", "wor:branching(2,1):sequoia"]
    profile(items, out=tmp_path, draft=draft, target=target, trees=trees, bound_budget=5, batch_size=2,
            **dict(RUN, max_new_tokens=2))
    plan = resolve_trees(trees)
    got = _bounds(tmp_path)
    assert len(got) == 2 * 2 * 2
    for (prompt, pos, label), (val, rem, exact, n) in got.items():
        f = next(f for f in plan.sampled if f.label == label)
        ref = bound(f.shape, draft, target, process=f.process, prefix=_context(items[prompt], pos), budget=int(n),
                    batch=int(n))
        assert int(n) == 5 and exact == float(ref.pi_exact)
        assert val == pytest.approx(ref.value, abs=1e-5) and rem == pytest.approx(ref.remainder, abs=1e-5)
