"""Draft trees on the real pair (SmolLM2-135M-Instruct, draft = 24 of its 30 layers): which tree, measured exactly.

A profile (``otspec.profile`` with ``trees=``) along target-sampled continuations of chat prompts: at every
position the same contexts as the ``(k, L)`` schemes, a handful of draft-tree families drafted (one draft
call per depth) and scored (one target call with a tree mask), each family's exact expected accepted
tokens given the drawn tree recorded -- Medusa-style static top-k trees, EAGLE-2's dynamic trees (SGLang's
parameters), SpecInfer's i.i.d. trees and Sequoia's trees drawn without replacement -- plus the target's
path probability (and the draft's probability of its last token) of every rank path of a top-k universe. The choice of a tree is made on the even-indexed prompts and measured on
the odd-indexed ones: the best static top-k shape of every size (exact within the universe: the rank paths
of largest mean target path probability), Sequoia's dynamic-programme shape from its acceptance vector
(predicted by its positional-acceptance assumption, measured exactly from the recorded per-node
acceptance), and the EAGLE-2 grid. Sampling: temperature 1 with top-k 50 on both models.

Every number is an exact expectation given the drawn trees, averaged over positions with a 95 % bootstrap
interval over prompts (fixed seeds); no wall time enters the report or ``results/trees_real.json`` (the
speed-up needs the device's call costs: ``python -m otspec report`` on a profile run gives it).
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _chat_prompts import CHAT_PROMPTS, chat_ids  # noqa: E402
from _report import Row, Section, fmt, save_figure  # noqa: E402
from repro_60_decoding import agrees, decode_check, run_real_pair  # noqa: E402

TITLE = "Draft trees on the real pair"

#: 16 chat prompts x 8 profiled positions: the even-indexed 8 choose, the odd-indexed 8 measure.
PROMPTS = CHAT_PROMPTS[:16]
#: The tree families: Medusa-like top-k trees, EAGLE-2 (SGLang's num_steps, topk, num_draft_tokens), SpecInfer's
#: i.i.d. trees, Sequoia's trees without replacement; the universe covers EAGLE-2 with topk 2 to depth 3, so
#: that family rebuilt from the recorded universe is checked against its own recorded value (two routes).
TREES = ("topk:branching(4,2)", "topk:chains(1,4)", "eagle2:3,2,6", "eagle2:4,4,12", "iid:branching(4,2):specinfer",
         "wor:branching(4,2,2):sequoia")
PROFILE = dict(
    k_max=1, L_max=4, max_new_tokens=8, temperature=1.0, top_k=50, seed=0, shard_size=8, batch_size=8, subsample=0,
    verifiers=("token",), families=("token", "block-onestep"), renewal=(), trees=TREES,
    tree_universe="branching(4,3,2)",
)
#: Tolerance of the two routes to EAGLE-2's value: the universe and the EAGLE-2 tree score the same paths in
#: different batched calls of the float32 models, whose laws agree to about 1e-6 relative (on exact models, as
#: the toy pair of the tests, the two routes agree to 1e-12).
POSTHOC_TOL = 1e-4
#: Node budgets of the static shapes listed in the report.
BUDGETS = (1, 2, 4, 8, 12, 16, 24, 32)
#: Tree families decoded for real to check the prediction (static, sampled, EAGLE-2), by their profile names: the
#: decoder takes each family's own shape and process, and its verifier (target-only on deterministic trees).
CHECKS = ("topk:branching(4,2)", "iid:branching(4,2)/specinfer", "eagle2:4,4,12")
#: The check decodes: one per prompt on the first 8 prompts, as many tokens as the profile's paths, the profile's
#: sampling.
DECODE = dict(prompts=8, max_new_tokens=8, temperature=1.0, top_k=50, seed=2000)


def _r(x, d: int = 6):
    return None if x is None or not math.isfinite(x) else round(float(x), d)


#: The gap of every tree verifier to the upper bound on any verifier (otspec.tree.bound), per sampled family:
#: (family label, shape, process, verifiers). SpecTr's tree rule with the optimal token verifier on i.i.d. trees.
GAP_FAMILIES = (
    ("iid:branching(4,2)", (4, 2), "iid", ("specinfer", "spectr-tree")),
    ("wor:branching(4,2,2)", (4, 2, 2), "wor", ("sequoia", "traversal")),
)
#: Contexts of the gap: the first GAP_PROMPTS prompts, at the prompt's end and after GAP_STEP target-sampled tokens
#: (temperature 1, untruncated laws: the bound and the verifiers read the same laws); GAP_DRAWS trees per context.
#: Each path's laws are scored once per context, in one tree-attention call per bound frontier and per depth of
#: all the context's drawn trees (88 calls of each model, 5,242 scored nodes): 58-64 s of CPU on the project's
#: 2-core machine (81-142 s of wall time at load averages of 4-5), where one call per drawn node (513 calls, 6,823
#: nodes) took 136 s of CPU (187-396 s of wall time at 3-6); the numbers agree to 2e-6 (the float32 models round
#: with the batch they score in).
GAP_PROMPTS = 4
GAP_STEP = 4
GAP_DRAWS = 4
#: Expanded prefixes per context and family (64 per model call).
GAP_BUDGET = 256
GAP_SEED = 3000
#: The union bound's largest slack where it can be checked: max B* - OPT_c over the enumerable cases of
#: results/trees/bound.csv (experiments/repro_90_trees.py, every prefix expanded, 2026-11-28; 37 cases per process,
#: V = 3-8, Pi(T) exact: every node's draws enumerated without replacement). The verdict on the real pair reads it:
#: a gap to B* whose interval lies above it (and above the budget's remainder) is not the bound's slack as far as it
#: was ever measured.
UNION_SLACK = {"iid": 0.022, "wor": 0.057}


class _ContextLaws:
    """The draft's and the target's laws at token paths after one context, each path scored once: the paths not
    yet in ``memo`` in one tree-attention call of each model (``laws``, a ``_TreeAttentionLaws``). What
    ``otspec.tree.bound`` reads (``paths -> (P, Q)`` and ``calls``), shared with the drawn trees' laws."""

    def __init__(self, laws, memo: dict):
        self.laws, self.memo, self.calls, self.vocab_size = laws, memo, 0, laws.models[0].vocab_size

    def prefetch(self, paths) -> None:
        new = list(dict.fromkeys(tuple(s) for s in paths if tuple(s) not in self.memo))
        if new:
            self.calls += 1
            P, Q = self.laws(new)
            for s, p, q in zip(new, P, Q):
                self.memo[s] = (p, q)

    def __call__(self, paths):
        self.prefetch(paths)
        return (np.stack([self.memo[tuple(s)][0] for s in paths]), np.stack([self.memo[tuple(s)][1] for s in paths]))


class _LawsAt:
    """The ``next_dist`` view of one model of a :class:`_ContextLaws` (0 draft, 1 target)."""

    def __init__(self, laws: _ContextLaws, which: int):
        self.laws, self.which, self.vocab_size = laws, which, laws.vocab_size

    def prefetch(self, paths) -> None:
        self.laws.prefetch(paths)

    def next_dist(self, path):
        self.prefetch([path])
        return self.laws.memo[tuple(path)][self.which]


def _bound(shape, process, laws: _ContextLaws, method: str = "paths"):
    """``otspec.tree.bound(shape, draft, target, process=process, prefix=c, budget=GAP_BUDGET, method=method)`` on
    the laws of context ``c`` (the same recursion and order of expansion, 64 prefixes per frontier), every path's
    laws read once for both families, both methods and the drawn trees."""
    from otspec.tree._bound import DEFAULT_BOUND_BATCH, _sampled, _Slots
    from otspec.tree._bound_union import union_bound
    from otspec.tree._process import as_tree_shape, validate_process

    shape = as_tree_shape(shape, process)
    run = union_bound if method == "union" else _sampled
    return run(_Slots(shape), validate_process(process, shape), laws, GAP_BUDGET, DEFAULT_BOUND_BATCH)


def _draw_trees(draws, dm, rng) -> list:
    """The trees of ``sample_tree(shape, dm, process=process, rng=rng)`` called once per ``(shape, process)`` of
    ``draws`` in turn -- the very same tokens, ``rng`` left in the same state -- with the draft laws of one depth
    of every tree read in one tree-attention call (``dm.prefetch``) instead of one call per node.

    Every draw of :func:`otspec.tree.draw_children` takes one uniform per i.i.d. child and ``max(ranks) + 1`` per
    node drawn without replacement, a number fixed by the shape: tree ``i`` draws from a copy of ``rng`` advanced
    by the uniforms of the trees before it, and its copy must end where the next one starts (checked)."""
    import copy

    from otspec.models import next_law
    from otspec.tree import DraftTree
    from otspec.tree._process import _child_groups, draw_children

    plans, gens, starts = [], [], []
    for shape, process in draws:
        groups = _child_groups(shape)
        if any(shape.depth[a] > shape.depth[b] for (a, _, _), (b, _, _) in zip(groups, groups[1:])):
            raise ValueError("the shape's nodes must come in order of depth")
        plans.append((shape, process, groups))
        gens.append(copy.deepcopy(rng))
        starts.append(rng.bit_generator.state)
        rng.random(sum(len(r) if process == "iid" else max(r) + 1 for _, _, r in groups))
    tokens = [np.full(shape.n + 1, -1, dtype=np.int64) for shape, _, _ in plans]
    paths = [[()] * (shape.n + 1) for shape, _, _ in plans]
    D = max(int(shape.max_depth) for shape, _, _ in plans)
    for d in range(D + 1):
        dm.prefetch([paths[t][i] for t, (shape, _, _) in enumerate(plans) for i in range(shape.n + 1)
                     if shape.depth[i] == d])
        for t, (shape, process, groups) in enumerate(plans):
            for par, ch, ranks in groups:
                if shape.depth[par] == d:
                    law = next_law(dm, paths[t][par], dm.vocab_size, "draft")
                    for c_, x in zip(ch, draw_children(law, ranks, process, gens[t], path=paths[t][par])):
                        tokens[t][c_] = x
                        paths[t][c_] = paths[t][par] + (int(x),)
    for t, g in enumerate(gens):
        end = starts[t + 1] if t + 1 < len(gens) else rng.bit_generator.state
        if g.bit_generator.state != end:
            raise RuntimeError("a tree took another number of uniforms than its shape fixes")
    return [DraftTree(shape, shape.parents, tok) for (shape, _, _), tok in zip(plans, tokens)]


def verifier_gaps(tok, draft, target, prompts=PROMPTS[:GAP_PROMPTS]) -> dict:
    """Per sampled family and verifier: the mean over contexts of the bound B (any lossless verifier's best on the
    family's trees, an upper bound) minus the verifier's exact E[tau | T] averaged over drawn trees, with a 95 %
    bootstrap interval over prompts; the budget's remaining slack (the bound's remainder) beside it. The same with
    the union bound B* <= B (``method="union"``, the same expanded prefixes)."""
    from otspec.tree import TreeShape, make_tree_verifier, tree_laws
    from otspec.tree._bound import _TreeAttentionLaws

    rng = np.random.default_rng(GAP_SEED)
    per = {label: {"bound": [], "bound_union": [], "remainder": [], "pi_exact": True, "union_exact": True,
                   **{v: [] for v in vs}}
           for label, _, _, vs in GAP_FAMILIES}
    shapes = {label: TreeShape.branching(*br) for label, br, _, _ in GAP_FAMILIES}
    owner = []
    for pi_, text in enumerate(prompts):
        ctx = chat_ids(tok, text)
        for step in (0, GAP_STEP):
            c = list(ctx)
            for _ in range(step):          # target-sampled continuation, temperature 1 (the target's law alone)
                Q = target.score_tree(target.new_state(), np.array([-1]), np.array([-1]), pending=np.array(c))
                c.append(int(rng.choice(Q.shape[1], p=Q[0] / Q[0].sum())))
            owner.append(pi_)
            calls = _TreeAttentionLaws(draft, target, c)
            laws = _ContextLaws(calls, {})
            dm, tm = _LawsAt(laws, 0), _LawsAt(laws, 1)
            for label, _, process, _vs in GAP_FAMILIES:
                b = _bound(shapes[label], process, laws)
                per[label]["bound"].append(b.value)
                per[label]["remainder"].append(b.remainder)
                per[label]["pi_exact"] &= b.pi_exact
                u = _bound(shapes[label], process, laws, "union")
                per[label]["bound_union"].append(u.value)
                per[label]["union_exact"] &= u.pi_exact
            calls.check_later()            # laws left on an accelerator: their bad-row flags read once here
            # every family's GAP_DRAWS trees, in the order of one sample_tree call after the other
            trees = iter(_draw_trees([(shapes[label], process) for label, _, process, _ in GAP_FAMILIES
                                      for _ in range(GAP_DRAWS)], dm, rng))
            for label, _, _process, vs in GAP_FAMILIES:
                # one verifier per context: its token verifiers memoised by (p, q, k) across the draws
                vers = {v: make_tree_verifier(v, token_verifier="optimal") if v == "spectr-tree" else
                        make_tree_verifier(v) for v in vs}
                vals = {v: [] for v in vs}
                for _ in range(GAP_DRAWS):
                    T = next(trees)
                    P, Q = tree_laws(T, dm, tm)
                    for v in vs:
                        vals[v].append(vers[v].expected_accepted(T, P, Q, validate=False))
                for v in vs:
                    per[label][v].append(float(np.mean(vals[v])))
    owner = np.array(owner)
    out = {}
    for label, _, _process, vs in GAP_FAMILIES:
        d = per[label]
        B = np.array(d["bound"])
        Bu = np.array(d["bound_union"])
        one = np.ones_like(B)
        fam = {"bound": _over_prompts(B, one, owner), "bound_union": _over_prompts(Bu, one, owner),
               "union_pi_exact": bool(d["union_exact"]), "process": _process,
               "remainder_mean": _r(float(np.mean(d["remainder"]))),
               "remainder_max": _r(float(np.max(d["remainder"]))), "pi_exact": bool(d["pi_exact"]),
               "budget": GAP_BUDGET, "contexts": int(B.size), "draws_per_context": GAP_DRAWS, "verifiers": {}}
        for v in vs:
            x = np.array(d[v])
            # every verifier here is lossless: B >= B* >= OPT_c >= E[tau] at each context (the mean over its drawn
            # trees), so the gaps' parameters are >= 0 and the shares' in [0, 1] (a context's mean over 4 drawn trees
            # may exceed the bound; the intervals stay in the range)
            fam["verifiers"][v] = {"value": _over_prompts(x, one, owner),
                                   "gap": _over_prompts(B - x, one, owner, difference=True, lower=0.0),
                                   "share": _over_prompts(x, B, owner, lower=0.0, upper=1.0),
                                   "gap_union": _over_prompts(Bu - x, one, owner, difference=True, lower=0.0),
                                   "share_union": _over_prompts(x, Bu, owner, lower=0.0, upper=1.0)}
        out[label] = fam
    return out


def _over_prompts(num, den, owner, n_boot: int = 2000, seed: int = 0, difference: bool = False,
                  lower: float = -np.inf, upper: float = np.inf) -> dict:
    """sum(num) / sum(den) over contexts, with the profile's 95 % bootstrap interval over prompts (``owner``: each
    context's prompt): a mean over contexts with ``den`` = 1, the share of the bound reached with ``den`` = B;
    ``difference``: ``num`` holds differences (a gap to a bound), whose interval is on their own scale; ``lower``,
    ``upper``: the quantity's range (a share on the logit scale, every end inside it)."""
    from otspec.profile._summary import _ratio_estimate, _resample

    ids = np.unique(owner)
    S = np.array([num[owner == g].sum() for g in ids])
    C = np.array([den[owner == g].sum() for g in ids])
    return _est(_ratio_estimate(S, C, _resample(len(ids), n_boot, seed), int(num.size), difference=difference,
                                lower=lower, upper=upper))

def _est(e) -> dict | None:
    return None if e is None else {"value": _r(e.value), "lo": _r(e.lo), "hi": _r(e.hi), "positions": e.positions}


def _posthoc_check(out, plan) -> dict:
    """EAGLE-2 rebuilt from the recorded universe at every position, against its recorded value (two routes)."""
    from otspec.profile import read_table
    from otspec.profile._trees import eagle2_from_universe
    from otspec.tree import TreeShape

    t = read_table(out).to_pandas()
    U = plan.universe.n
    res = {}
    for f in plan.eagle2:
        box = TreeShape.branching(*([f.shape.top_k] * f.shape.depth))
        if not set(box.paths) <= set(plan.index):
            continue  # a proposal may lie outside the universe
        rec = t[(t.kind == "tree") & (t.name == f.label)].set_index(["prompt", "pos"]).value
        worst, covered = 0.0, 0
        for (p, pos), v in rec.items():
            at = t[(t.prompt == p) & (t.pos == pos)]
            P, Q = np.ones(U + 1), np.ones(U + 1)
            q, dr = at[at.kind == "treeq"], at[at.kind == "treep"]
            Q[q.j.to_numpy()] = q.value.to_numpy()
            P[dr.j.to_numpy()] = dr.value.to_numpy()  # the draft's probability of each node's token
            post = eagle2_from_universe(f.shape, plan.universe, plan.index, P, Q)
            if post is not None:
                covered += 1
                worst = max(worst, abs(post - v))
        res[f.label] = {"positions": int(len(rec)), "covered": covered, "max_abs_difference": worst}
    return res


def run_all(fig_dir: Path | None = None) -> dict:
    """The profile, the choice, the check decodes; with ``fig_dir``, the figures written there (exact values only)."""
    import torch

    from otspec.decoding import smollm2_pair
    from otspec.profile import profile, summarize

    torch.set_num_threads(1)
    tok, target, draft = smollm2_pair(device="cpu", threads=1)
    prompts = [chat_ids(tok, t) for t in PROMPTS]
    with tempfile.TemporaryDirectory() as out:
        run = profile(prompts, out=out, draft=draft, target=target, progress=False, **PROFILE)
        s = summarize(out, draft_cost=0.0, score_cost=1.0)  # costs given: nothing here depends on wall time
        check = _posthoc_check(out, run.settings.tree_plan)
    ts, ch = s.trees, s.trees.choice
    figures = _figures(s, fig_dir) if fig_dir is not None else []
    checks = []
    for name in CHECKS:
        fam = run.settings.tree_plan.family_of(name)
        got = decode_check(tok, draft, target, PROMPTS[:DECODE["prompts"]], seed=DECODE["seed"],
                           tree=fam.shape, process=fam.process,
                           verifier=fam.verifiers[fam.names().index(name)] if fam.verifiers else "target-only",
                           max_new_tokens=DECODE["max_new_tokens"], temperature=DECODE["temperature"],
                           top_k=DECODE["top_k"])
        pred, ren = ts.tokens_per_call[name], ts.renewal.get(name)
        extra = {}
        if ren is not None:  # T / E[calls]: the tokens per call of decodes of T tokens, none made past T
            kept = {"tokens_per_call": got["tokens_kept_per_call"], "half_width": got["kept_half_width"]}
            extra = {"renewal": _est(ren), "agrees_renewal": agrees(ren, kept)}
        # the Palm average E[T + overshoot] / E[calls] is what a decoder drafting whole trees to the end emits per
        # call; otspec's decoder drafts only the levels left in its last iterations (no overshoot), so the real
        # decodes are checked against the renewal estimate, and the Palm average is reported along the text only
        checks.append({"family": name, **got, "predicted": _est(pred), "agrees": agrees(pred, got), **extra})
    gaps = verifier_gaps(tok, draft, target)
    return {
        "pair": {"target": target.name, "draft": draft.name},
        "profile_settings": run.settings.to_dict(),
        "prompts": len(prompts),
        "positions": ts.positions,
        "trees": {name: dict(ts.families[name], tokens_per_call=_est(e)) for name, e in ts.tokens_per_call.items()},
        "chains": {f"{f} k={k} L={L}": _est(e) for (f, k, L), e in ts.chains.items()},
        "choice": {
            "choose_prompts": ch.choose_prompts, "evaluate_prompts": ch.evaluate_prompts,
            "positions": list(ch.positions),
            "static": [{"n": st.n, "medusa_choices": st.medusa_choices, "tokens_per_call": _est(st.tokens_per_call),
                        "node_values": [_r(v) for v in st.node_values]} for st in ch.static],
            "acceptance": [_r(a) for a in ch.acceptance], "sequoia_source": ch.sequoia_source,
            "sequoia": [{"n": q.n, "medusa_choices": [list(p) for p in q.paths], "predicted": _r(q.predicted),
                         "tokens_per_call": _est(q.tokens_per_call)} for q in ch.sequoia],
            "eagle2": {k: _est(e) for k, e in ch.eagle2.items()},
            "heldout": {k: _est(e) for k, e in ch.heldout.items()},
            "versus": {k: _est(e) for k, e in ch.versus.items()},
        },
        "eagle2_from_universe": check,
        "palm": {name: {"renewal": _est(ts.renewal.get(name)), "palm": _est(e),
                        "position_bias": _est(ts.position_bias.get(name)), "route": ts.along[name][0]}
                 for name, e in ts.palm.items()},
        "no_renewal": {name: why for name, (route, why) in ts.along.items() if route is None},
        "decode_settings": dict(DECODE),
        "checks": checks,
        "figures": figures,
        "bound_gaps": gaps,
    }


def _figures(summary, out: Path) -> list[str]:
    """Tokens per call against tree size per family, and the chosen tree with each node's held-out acceptance."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    from otspec.profile import plot_chosen_tree, plot_tree_tokens
    from otspec.profile._figures import chosen_tree_size

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    names = []
    for fname, draw, size in (("trees_real_tokens.png", plot_tree_tokens, (9.0, 4.2)),  # room for the legend
                              ("trees_real_chosen.png", plot_chosen_tree, chosen_tree_size(summary))):
        fig, ax = plt.subplots(figsize=size)
        draw(summary, ax=ax)
        names.append(save_figure(fig, out / fname, dpi=100))
    return names


def _new_section() -> Section:
    return Section(
        title=TITLE,
        source=("Cai et al., Medusa, arXiv:2401.10774, §2.1.2 (static trees of top-k candidates); Li et al., EAGLE-2, "
                "arXiv:2406.16858, §4 (dynamic trees); Miao et al., SpecInfer, arXiv:2305.09781, §4; Chen et al., "
                "Sequoia, arXiv:2402.12374, §3 (acceptance vector, dynamic programme, sampling without replacement); "
                "the profile: docs/guide/trees_profile.rst"),
    )


def run(out: Path) -> Section:
    return run_real_pair(out, new_section=_new_section, what="real-pair trees", records="trees_real.json",
                         run_all=run_all, section=section)


def _ci(e) -> str:
    return f"{fmt(e['value'], 3)} [{fmt(e['lo'], 3)}, {fmt(e['hi'], 3)}]"


def _justify_row(label: str, fam: dict) -> Row:
    """"Does the gap justify a better tree verifier?", decided by the union bound B* (B where B* is absent).

    The rule: B* >= OPT_c >= every lossless verifier at any budget, so the upper end of the 95 % interval of B*
    minus the best rule bounds what any better verifier could add (up to sampling). The gap counts as real only where
    its whole interval lies above the bound's slack as far as it is known: the union bound's largest B* - OPT_c on
    the enumerable cases (:data:`UNION_SLACK`) plus what the budget left open of the paths bound on these contexts
    (its mean remainder; the budget's share of B*'s own slack is not bounded separately, and this is the measure of
    what the unexpanded prefixes can hold). Otherwise it is within the bound's slack: not shown to be improvable."""
    best, g = max(fam["verifiers"].items(), key=lambda kv: kv[1]["value"]["value"])
    worst = min(v["value"]["value"] for v in fam["verifiers"].values())
    union = fam.get("bound_union") is not None
    gap = g["gap_union"] if union else g["gap"]
    known = UNION_SLACK[fam.get("process", label.split(":")[0])] if union else 0.15
    slack = known + fam["remainder_mean"]
    name = "B*" if union else "B"
    text = (f"the best rule here, {best}, accepts {g['value']['value'] - worst:.3f} more than the worst on the same "
            f"trees; it is {_ci(gap)} below {name}" + (f" (and {_ci(g['gap'])} below B)" if union else "")
            + f"; {name} exceeds OPT_c by at most {known:.3f} on the enumerable cases of results/trees/bound.csv, and "
            f"the budget left {fam['remainder_mean']:.3f} of B open: slack {slack:.3f}")
    if gap["lo"] > slack:
        verdict = (f"yes, as far as the bound's slack is known: the gap's interval lies above {slack:.3f} (the "
                   f"largest slack measured where OPT_c is computable, plus the budget's remainder; the slack on this "
                   f"pair itself is not proven smaller): a better verifier may add up to {gap['hi']:.3f} accepted "
                   f"tokens per call")
    else:
        verdict = (f"within the bound's slack ({slack:.3f}): not shown to be improvable; any better verifier adds at "
                   f"most {gap['hi']:.3f} accepted tokens per call (95 % upper end)")
    return Row(f"{label}: does the gap justify a better tree verifier?",
               "- (no paper bounds the best verifier of these trees)", text, verdict)


def _gap_rows(res: dict) -> list[Row]:
    """The rows of the verifiers' gaps to the bounds B and B* (``res["bound_gaps"]``), then the verdicts."""
    rows: list = []
    for label, fam in res.get("bound_gaps", {}).items():
        union = fam.get("bound_union")
        rows.append(Row(
            f"{label}: the upper bounds on any lossless verifier (otspec.tree.bound, budget {fam['budget']} expanded "
            f"prefixes per context; {fam['contexts']} contexts): B (paths) and B* (union of root paths)",
            "-",
            f"B {_ci(fam['bound'])}" + (f", B* {_ci(union)}" if union else "") + " accepted tokens; the budget left "
            f"at most {fmt(fam['remainder_mean'], 3)} of B on average (largest {fmt(fam['remainder_max'], 3)}) open"
            + ("" if fam["pi_exact"] else "; pi bounded above for draws of rank >= 2")
            + ("" if not union or fam["union_pi_exact"] else "; B*: the union's probability bounded above (draws "
               "without replacement)"),
            "measured (exact laws)"))
        for v, g in fam["verifiers"].items():
            rows.append(Row(
                f"{label}, {v}: E[tau] and its gap to the bounds ({fam['draws_per_context']} drawn trees per context)",
                "-",
                f"{_ci(g['value'])}; gap to B {_ci(g['gap'])}, share of B reached "
                f"{100 * g['share']['value']:.1f} % [{100 * g['share']['lo']:.1f}, {100 * g['share']['hi']:.1f}]"
                + (f"; gap to B* {_ci(g['gap_union'])}, share of B* reached {100 * g['share_union']['value']:.1f} % "
                   f"[{100 * g['share_union']['lo']:.1f}, {100 * g['share_union']['hi']:.1f}]" if union else ""),
                "measured (exact laws)"))
    for label, fam in res.get("bound_gaps", {}).items():
        rows.append(_justify_row(label, fam))
    return rows


def section(res: dict) -> Section:
    """The report section of a :func:`run_all` result."""
    sec = _new_section()
    ch = res["choice"]
    sec.notes = (
        f"Target {res['pair']['target']}; draft {res['pair']['draft']}. {res['prompts']} chat prompts, "
        f"{res['positions']} positions along target-sampled continuations, temperature 1, top-k 50, CPU. Tokens per "
        "call = 1 + the exact expected accepted tokens given the drawn tree, averaged over positions; 95 % "
        f"bootstrap intervals over prompts. Choice on the {ch['choose_prompts']} even-indexed prompts, every value "
        f"of a chosen tree measured on the {ch['evaluate_prompts']} odd-indexed ones. Top-k universe: "
        f"{res['profile_settings']['tree_universe']}. Check decodes: one real tree decode per prompt on the first "
        f"{res['decode_settings']['prompts']} prompts (tokens per call with a 95 % interval over prompts), agreement "
        "= within the combined 95 % intervals; the renewal estimate along the text is T / E[calls], the tokens kept "
        "per call of decodes of T tokens (what otspec's decoder makes: its last iterations draft only the levels "
        "left), the Palm average the tokens emitted per call by a decoder that drafts whole trees to the end (the "
        "last iteration's overshoot counted): docs/theory/profile.rst. What a tree costs on a device (the cost curve: one tree call on n "
        "nodes against decoding steps, CPU and GPU) is measured, not regenerated here (wall times): "
        "docs/perf/trees.rst; a profile's own report predicts speed-ups from its measured costs. Full records: "
        "trees_real.json."
    )
    if res.get("no_renewal"):
        sec.notes += " No renewal estimate along the text for " + "; ".join(
            f"{name} ({why})" for name, why in res["no_renewal"].items()) + "."
    sec.figures.extend(res.get("figures", []))
    for name, f in res["trees"].items():
        sec.rows.append(Row(f"tokens per call, {name} ({f['n']} nodes)", "-", _ci(f["tokens_per_call"]),
                            "measured (profile)"))
    for key, e in res["chains"].items():
        sec.rows.append(Row(f"tokens per call, {key} (same positions)", "-", _ci(e), "measured (profile)"))
    static = {st["n"]: st for st in ch["static"]}
    for n in BUDGETS:
        st = static.get(n)
        if st is None:
            continue
        shape = json.dumps(st["medusa_choices"], separators=(",", ":"))
        sec.rows.append(Row(f"best static top-k shape, n = {n} (held out)", "-",
                            f"{_ci(st['tokens_per_call'])}; {shape if len(shape) <= 80 else shape[:77] + '...'}",
                            "measured (profile)"))
    for name, d in ch["versus"].items():
        n = res["trees"][name]["n"]
        sec.rows.append(Row(f"best static {n}-node shape minus {name} (held out, paired)",
                            "at least as good (chosen on the other prompts)",
                            f"{d['value']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}] (family {_ci(ch['heldout'][name])})",
                            "shape matches" if d["hi"] >= 0 else "differs: the held-out best shape is worse"))
    for q in ch["sequoia"]:
        if q["n"] not in BUDGETS:
            continue
        meas = q["tokens_per_call"]
        sec.rows.append(Row(f"Sequoia's shape, n = {q['n']} ({ch['sequoia_source']})",
                            f"predicted {fmt(q['predicted'], 3)}",
                            _ci(meas) + f" (gap {q['predicted'] - meas['value']:+.3f})" if meas else "outside the tree",
                            "measured (profile)"))
    for name, e in ch["eagle2"].items():
        sec.rows.append(Row(f"EAGLE-2 {name.split(':')[1]} (held out)", "-", _ci(e), "measured (profile)"))
    for name, r in res.get("palm", {}).items():
        b = r["position_bias"]
        sec.rows.append(Row(f"{name}: renewal and Palm average along the text ({r['route']})",
                            f"per-position average {_ci(res['trees'][name]['tokens_per_call'])}",
                            f"renewal {_ci(r['renewal'])}, Palm {_ci(r['palm'])}, per-position bias "
                            f"{100 * b['value']:+.2f} % [{100 * b['lo']:+.2f}, {100 * b['hi']:+.2f}]",
                            "measured (profile)"))
    sec.rows.extend(_gap_rows(res))
    for c in res.get("checks", ()):
        p = c["predicted"]
        sec.rows.append(Row(f"real decoding with {c['family']}: tokens per call ({c['prompts']} prompts x "
                            f"{res['decode_settings']['max_new_tokens']} tokens, {c['iterations']} target calls)",
                            f"the profile's prediction {_ci(p)}",
                            f"{fmt(c['tokens_per_call'], 3)} +- {fmt(c['half_width'], 3)}",
                            "matches (within the combined 95 % intervals)" if c["agrees"] else
                            "differs: outside the combined 95 % intervals"))
        if "renewal" in c:
            sec.rows.append(Row(f"real decoding with {c['family']}: tokens per call (none made past T: the last "
                                "iterations draft only the levels left) against the renewal estimate along the text",
                                f"renewal {_ci(c['renewal'])}",
                                f"{fmt(c['tokens_kept_per_call'], 3)} +- {fmt(c['kept_half_width'], 3)}",
                                "matches (within the combined 95 % intervals)" if c["agrees_renewal"] else
                                "differs: outside the combined 95 % intervals"))
    for name, c in res["eagle2_from_universe"].items():
        ok = c["covered"] == c["positions"] and c["max_abs_difference"] <= POSTHOC_TOL
        sec.rows.append(Row(f"{name}: rebuilt from the recorded universe = recorded",
                            f"equal to float32 rounding (<= {POSTHOC_TOL:g})",
                            f"{c['covered']}/{c['positions']} positions covered, max difference "
                            f"{c['max_abs_difference']:.1e}",
                            "matches" if ok else ("differs: not covered" if c["covered"] < c["positions"] else
                                                  "differs: the two routes disagree")))
    return sec
