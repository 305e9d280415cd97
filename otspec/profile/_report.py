r"""A markdown report of a profile run, with its figures (PNG)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .._registry import get_verifier
from ._figures import (
    chosen_tree_size,
    plot_acceptance_vs_k,
    plot_chosen_tree,
    plot_speedup,
    plot_tokens_vs_L,
    plot_tree_speedup,
    plot_tree_tokens,
    position_set,
)
from ._overhead import BUDGET_ROW, CONTENDER_MARGIN, SPENT_ROW, UNTIMED, UNTIMED_PREFIX
from ._store import check_report_dest, write_atomic
from ._summary import (
    CHAIN_ENGINES,
    MIN_PERCENTILE_PROMPTS,
    MIN_RANKED_POSITIONS,
    NO_ENGINE,
    cost_inversions,
    sglang_flags,
    summarize,
)

__all__ = ["write_report", "report_markdown"]


#: What a table prints in place of an interval resting on one prompt (no bootstrap over prompts exists).
ONE_PROMPT = "n/a (1 prompt)"


def _fmt(e, spec=".3f") -> str:
    if not e.has_interval:
        return f"{e.value:{spec}} [{ONE_PROMPT}]"
    return f"{e.value:{spec}} [{e.lo:{spec}}, {e.hi:{spec}}]"


def _signed(e, spec=".3f") -> str:
    if not e.has_interval:
        return f"{e.value:+{spec}} [{ONE_PROMPT}]"
    return f"{e.value:+{spec}} [{e.lo:+{spec}}, {e.hi:+{spec}}]"


def _kl(e) -> str:
    """A KL divergence: infinite (no interval) where the output law misses some of the target's mass."""
    if e.value == float("inf"):
        return "inf (the output law misses target mass at some position)"
    return _fmt(e, ".4f")


def _percent(e) -> str:
    if e and not e.has_interval:
        return f"{100 * e.value:+.2f} % [{ONE_PROMPT}]"
    return f"{100 * e.value:+.2f} % [{100 * e.lo:+.2f}, {100 * e.hi:+.2f}]" if e else "-"


def _config(key) -> str:
    f, k, L = key
    return f"{f}, k = {k}, L = {L}"


def _every(n: int) -> str:
    """``every``, ``every 2nd``, ``every 32nd``, ``every 11th`` (profiled position)."""
    if n == 1:
        return "every"
    suffix = "th" if n % 100 in (11, 12, 13) else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"every {n}{suffix}"


def _positions(n: int) -> str:
    return f"{n} position" + ("" if n == 1 else "s")


def _set_title(ps, summary) -> str:
    if ps.name == "all":
        return f"all {_positions(ps.positions)} profiled"
    if summary.settings.get("subsample") == 1:
        return f"all {_positions(ps.positions)} profiled (every quantity at every position)"
    return (f"the {_positions(ps.positions)} of the subsample ({_every(summary.settings['subsample'])} profiled "
            "position)")


def _names_on(ps, which: str) -> list[str]:
    d = ps.tokens_per_call if which == "tau" else ps.acceptance
    return list(dict.fromkeys(key[0] for key in d))


def _where(c, summary) -> str:
    """The positions a configuration's values rest on, in words."""
    if c.positions == "held out":
        ch = summary.trees.choice
        return (f"the {_positions(ch.positions[1])} of the {ch.evaluate_prompts} odd-indexed prompts (held out: "
                "chosen on the even-indexed ones)")
    if c.kind == "tree":
        return f"all {_positions(summary.trees.positions)} profiled"
    return _set_title(summary.sets[c.positions], summary)


def _verdict(e) -> str:
    if not e.has_interval:
        return "no interval from one prompt"
    return ("faster than plain decoding" if e.lo > 1 else "slower than plain decoding" if e.hi < 1 else
            "not told apart from plain decoding at this sample size")


def _run_it(c) -> str:
    """``name`` with its verifier and engine settings, for a sentence."""
    return f"**{c.name}** (verifier: {c.verifier}" + (f"; engine settings: `{c.settings}`" if c.settings else "") + ")"


def _recommendation_lines(summary) -> list[str]:
    rec = summary.recommendation
    lines = ["## Recommendation", ""]
    configs = summary.configurations
    unranked = summary.trees.unranked if summary.trees is not None else ()
    if unranked:  # said before the ranking (or in its place): which trees it leaves out, and why
        ts = summary.trees
        lines += ["Not ranked, no prediction (a) (the calibration timed no tree decoder within `calibration_s`; "
                  "raising it would time them): " + "; ".join(
                      f"{name} (forward passes alone: {_fmt(ts.speedup_forward[name], '.2f')})" for name in unranked
                      if name in ts.speedup_forward) + ".", ""]
    if not configs:
        if unranked or any(ps.tokens_per_call for ps in summary.sets.values()):
            return lines + ["No lossless configuration has a prediction (a): this report cannot rank them (raise "
                            "`calibration_s` to time their decoders).", ""]
        return lines + ["No lossless scheme with tokens per call was profiled: nothing to recommend.", ""]
    clear = [c for c in configs if c.speedup.has_interval and c.speedup.lo > 1]
    best = configs[0]
    if clear:
        c = clear[0]
        lines += [f"Run {_run_it(c)}: predicted speed-up {_fmt(c.speedup, '.2f')} over plain decoding on "
                  f"{_where(c, summary)} (engines: {c.engines})."]
    elif not any(c.speedup.has_interval for c in configs):
        lines += [f"**Not decided: one prompt gives no interval**, so no configuration is shown faster or slower "
                  f"than plain decoding; the fastest point estimate, {best.name}, predicts "
                  f"{_fmt(best.speedup, '.2f')}. Profile more prompts before acting on it. The alternatives "
                  "follow, fastest first."]
    else:
        lines += [f"**Plain decoding is fastest on this device**: no profiled configuration's speed-up interval lies "
                  f"above 1; the fastest, {best.name}, predicts {_fmt(best.speedup, '.2f')} "
                  f"({_verdict(best.speedup)}). The best alternatives follow, fastest first."]
    top = clear[0] if clear else best
    shipped = [c for c in configs if not c.engines.startswith(NO_ENGINE)]
    if top.engines.startswith(NO_ENGINE) and shipped:
        c = shipped[0]
        it = "it" if clear else top.name  # after "plain decoding is fastest", "it" would read as plain decoding
        lines += ["", f"No serving engine ships {it}; the fastest that one does ({c.engines}): {_run_it(c)}, "
                  f"speed-up {_fmt(c.speedup, '.2f')} ({_verdict(c.speedup)})."]
    few = min(c.speedup.positions for c in configs)
    if few < MIN_RANKED_POSITIONS:
        lines += ["", f"Ranked on as few as {_positions(few)}, fewer than the {MIN_RANKED_POSITIONS} this report "
                  "needs to rank configurations (their order may be noise): profile more positions."]
    chosen = [c for c in (*configs[:1], *clear[:1]) if c.kind == "chosen tree"]
    ex = summary.trees.choice.export if chosen else None
    if ex:
        sg = ex["sglang"]
        lines += ["", "SGLang runs dynamic EAGLE-2 trees, not this static shape; its closest parameters are `"
                  + _sglang(sg) + "`" + (f", whose own value is {_fmt(ex['sglang_tokens_per_call'])} tokens per call "
                                         f"(held out, from {ex['sglang_source']})."
                                         if ex["sglang_tokens_per_call"] is not None else
                                         " (outside the recorded universe: no value).")]
    lines += ["", "Every lossless configuration profiled, fastest first, each on the positions named beside it "
              f"(speed-up = time per token of plain decoding / predicted time per token, with the costs "
              f"{_cost_source(summary)}; below 1 is slower than plain decoding). A configuration chosen on the "
              "same positions its value is reported on (the (k, L) schemes) is optimistic by the selection; a "
              "chosen tree is measured on prompts that did not choose it. " + (
                  "The speed-up is prediction (a), otspec's own decoder on this device (its work outside the forward "
                  "passes timed on real iterations); \"forward passes alone\" is prediction (b), what an engine "
                  "whose verification is fused into its forward pass could reach. Where (b) lies below (a), the "
                  "decoder's timed steps ran faster than the calibrated forward passes they contain: timing noise "
                  "of this device, which both predictions carry."
                  if summary.costs.decoder_measured else
                  "The run did not time the decoder's work outside the forward passes: both columns count the "
                  "forward passes alone."), "",
              "| rank | configuration | verifier | engine settings | engines | positions | tokens per call | "
              "speed-up | forward passes alone |", "|---|---|---|---|---|---|---|---|---|",
              "| baseline | plain decoding | - | - | every engine | - | 1 | 1 | 1 |"]
    short = {"all": "all", "subsample": "subsample", "held out": "held out"}
    for r, c in enumerate(configs, start=1):
        settings = ('`' + c.settings + '`') if c.settings and len(c.settings) <= MAX_CELL else \
            "see the tree section" if c.settings else "-"
        lines.append(f"| {r} | {c.name} | {c.verifier} | {settings} | "
                     f"{c.engines} | {short[c.positions]} ({_positions(c.speedup.positions)}) | "
                     f"{_fmt(c.tokens_per_call)} | {_fmt(c.speedup, '.2f')} | "
                     f"{_fmt(c.speedup_forward, '.2f') if c.speedup_forward is not None else '-'} |")
    lines.append("")
    ch = summary.trees.choice if summary.trees is not None else None
    if ch is not None and ch.fastest is not None and not any(c.kind == "chosen tree" for c in configs):
        lines += [f"Not ranked: the chosen static tree (n = {ch.fastest.n}), measured on {_positions(ch.positions[1])} "
                  f"of the held-out prompts only (fewer than the {MIN_RANKED_POSITIONS} needed to rank it beside the "
                  "others): its values are in the tree section; profile more prompts.", ""]
    if ch is not None and ch.edge:
        lines += [_edge_line(ch.edge, summary), ""]
    if rec is None:
        return lines
    ps = next((p for p in summary.sets.values() if p.recommendation is rec), None)
    where = _set_title(ps, summary) if ps is not None else f"{rec.positions} positions"
    lines += ["### The (k, L) schemes", "",
              f"Fastest: {_config(rec.best)}, speed-up {_fmt(rec.speedup, '.2f')} ({_verdict(rec.speedup)}), "
              f"{_fmt(rec.tokens_per_call)} tokens per target call, on {where}."]
    if rec.runner_up is not None:
        d = rec.difference
        lines += ["", f"Runner-up: {_config(rec.runner_up)}, speed-up {_fmt(rec.runner_up_speedup, '.2f')}; paired "
                  f"difference in speed-up, best - runner-up: {_signed(d)} (the same resamples on both sides"
                  + ("; an interval covering 0: the two are not told apart" if d.has_interval and d.lo <= 0 else "")
                  + ")."]
    if ps is not None and ps.positions < MIN_RANKED_POSITIONS:
        lines += ["", f"Ranked on {_positions(ps.positions)} only, fewer than the {MIN_RANKED_POSITIONS} this "
                  "report needs to rank schemes: profile more positions."]
    best_of = {}
    for key, sp in rec.ranking:
        best_of.setdefault(key[0], (key, sp))
    lines += ["", "Each scheme at its best (k, L), fastest first:", "",
              "| scheme | k | L | speed-up | engines |", "|---|---|---|---|---|"]
    for f, (key, sp) in best_of.items():
        lines.append(f"| {f} | {key[1]} | {key[2]} | {_fmt(sp, '.2f')} | {CHAIN_ENGINES.get(f, NO_ENGINE)} |")
    sub = summary.sets.get("subsample")
    unranked = [f for f in dict.fromkeys(f for f, _, _ in summary.tokens_per_call)
                if ps is not None and ps.name == "all" and f not in _names_on(ps, "tau") and get_verifier(f).lossless]
    if unranked and sub is not None:
        lines += ["", f"Not ranked: {', '.join(unranked)}, computed on {_positions(sub.positions)} only (the "
                  f"subsample; at least {MIN_RANKED_POSITIONS} are needed to rank them beside the others): profile "
                  "more positions or a smaller `subsample` (`--subsample`). Their values are in the subsample's "
                  "table below."]
    if "all" in summary.sets and ps is not None and ps.name != "all" and summary.sets["all"].recommendation:
        ra = summary.sets["all"].recommendation
        lines += ["", f"Among the schemes computed at every one of the {summary.sets['all'].positions} profiled "
                  f"positions ({', '.join(_names_on(summary.sets['all'], 'tau'))}): {_config(ra.best)}, speed-up "
                  f"{_fmt(ra.speedup, '.2f')}."]
    return lines + [""]


#: Longest engine settings a row of the ranking writes out (longer ones: in the tree section).
MAX_CELL = 120


def _sglang(sg: dict) -> str:
    return sglang_flags(sg)


def _edge_line(edge: tuple, summary) -> str:
    """The warning of a chosen tree at the edge of the recorded universe."""
    words = {"size": "the largest node budget recorded", "depth": "the universe's deepest level",
             "rank": "a child of the largest rank the universe holds under its parent"}
    return (f"**The chosen static tree (n = {summary.trees.choice.fastest.n}) is at the edge of the recorded "
            f"universe** ({'; '.join(words[e] for e in edge)}): a "
            "shape beyond it was not considered and may be faster. Record a larger universe (`--tree-universe`, "
            "`tree_universe=`) before acting on it.")


def _cost_source(summary) -> str:
    """The costs' source in a few words, for the sentences that use them."""
    c = summary.costs
    if c.source == "given":
        return "given as relative units (one target call of one token = 1), not measured"
    devs = ((summary.provenance or {}).get("machine") or {}).get("devices") or {}
    on = "".join(f"{r} on {d}; " for r, d in devs.items())
    if c.source == "measured":
        n = max((len(v) for key, v in (summary.timings or {}).items() if key[0] in ("target", "draft")), default=3)
        return f"measured by the run on its own device ({on}medians of up to {n} timings; spread, threads, load and " \
               "the calibration's repetitions in the costs' section)"
    if c.source == "timers":
        return f"from the run's timers ({on}no cost calibration; every target call costing the same)"
    return c.description


def _profiled_lines(summary) -> list[str]:
    s = summary.settings
    lines = ["## What was profiled", ""]
    sets = summary.sets
    every = [n for n in dict.fromkeys(f for f, _, _ in summary.tokens_per_call)
             if "all" in sets and n in _names_on(sets["all"], "tau")]
    sub = [n for n in dict.fromkeys(f for f, _, _ in summary.tokens_per_call) if n not in every]
    lines.append(f"- Tokens per call at every profiled position ({summary.positions}): "
                 f"{', '.join(every) if every else 'none'}.")
    if sub:
        n = sets["subsample"].positions if "subsample" in sets else 0
        lines.append(f"- Tokens per call at {_every(s['subsample'])} profiled position only ({_positions(n)}; "
                     f"they build a verifier per depth or per draft-tree node): {', '.join(sub)}.")
    acc_every = [v for v in dict.fromkeys(v for v, _, _ in summary.acceptance)
                 if "all" in sets and v in _names_on(sets["all"], "acc")]
    acc_sub = [v for v in dict.fromkeys(v for v, _, _ in summary.acceptance) if v not in acc_every]
    lines.append(f"- Acceptance per depth at every profiled position: {', '.join(acc_every) or 'none'}; at "
                 f"{_every(s['subsample'])}: {', '.join(acc_sub) or 'none'}.")
    lossy = [f for f in dict.fromkeys(f for f, _, _ in summary.tokens_per_call) if not get_verifier(f).lossless]
    if lossy:
        lines.append(f"- Lossy rules (their output does not follow the target; not recommended): {', '.join(lossy)}.")
    left: dict = {}
    for what in ("verifiers", "families"):
        for name, why in (summary.skipped.get(what) or {}).items():
            left.setdefault((name, why), []).append(what)
    for (name, why), whats in left.items():
        lines.append(f"- Left out ({', '.join(whats)}): {name} -- {why}")
    return lines + [""]


def _call_name(key) -> str:
    """A calibrated call in words: ``(model, rows, tokens per row)``."""
    name, k, m = key
    if name == "tree-target":
        return f"the target scoring a tree of {m - 1} node" + ("" if m == 2 else "s")
    if name == "draft":
        return f"a draft step on {k} row" + ("" if k == 1 else "s")
    return (f"the target scoring {k} row" + ("" if k == 1 else "s") + f" of {m} token" + ("" if m == 1 else "s"))


def _provenance_line(summary) -> str:
    """Device, threads, load and versions behind the costs (the run's manifest)."""
    prov = summary.provenance or {}
    mach = prov.get("machine") or {}
    pk = prov.get("packages") or {}
    vers = ", ".join(f"{p} {pk[p]}" for p in ("otspec", "torch") if pk.get(p)) or "not recorded"
    if not mach:
        return (f"Timed on: not recorded (a run written before device, threads and load were recorded); "
                f"versions: {vers}.")
    devs = mach.get("devices") or {}
    dev = ", ".join(f"{r} on {d}" for r, d in devs.items()) or "devices not recorded"
    load = mach.get("load_average")
    load = " / ".join(f"{x:.2f}" for x in load) + " (1, 5, 15 min)" if load else "not available"
    return (f"Timed on: {dev} ({mach.get('device_name') or 'unknown processor'}, {mach.get('cpu_count')} CPUs, "
            f"{mach.get('platform')}); torch threads {mach.get('torch_threads')}; load average when the run "
            f"started {load}; versions: {vers}.")


def _given_lines(summary) -> list[str]:
    """The costs of a summary whose costs were given (``draft_cost=`` / ``score_cost=``), as relative units."""
    c, s = summary.costs, summary.settings
    ov = summary.cost_overrides or {}
    d, sc = ov.get("draft_cost"), ov.get("score_cost")
    draft = (f"a draft step c = {c.draft[1]:.3f} (given: `draft_cost` / `--draft-cost`)" if d is not None else
             f"a draft step c = {c.draft[1]:.3f} (not given: the run's mean draft-step seconds over its mean "
             "target-call seconds, from its timers)")
    score = (f"the scoring call s = {c.target[(1, s['L_max'])]:.3f} (given: `score_cost` / `--score-cost`)"
             if sc is not None else
             f"the scoring call s = {c.target[(1, s['L_max'])]:.3f} (not given: assumed 1, every target call -- "
             "scoring k rows of L + 1 tokens, or a tree of n nodes -- costing one call of plain decoding whatever "
             "its size)")
    return ["## Costs of the model calls", "",
            "Costs given as relative units, not measured: one target call of plain decoding (one token) = 1 unit; "
            f"{draft}; {score}. An iteration of k blocks of L tokens costs L c + s units, a tree iteration one c "
            "per depth and one s; every speed-up in this report follows from these units.", ""]


def _spread(timings, key, plain) -> str:
    t = timings.get(key)
    if not t or len(t) < 2:
        return ""
    return f" ({min(t) / plain:.2f}-{max(t) / plain:.2f})"


def _fitted_sentence(c) -> str:
    """Which predictions (a) rest on the fitted line of a family's timed steps rather than on a step of their own."""
    n = len(c.overhead_fit)
    if not n:
        return ""
    return (" Every single-draft configuration (k = 1) of a lossless family was timed itself; "
            f"{n} other{'s' if n != 1 else ''} (k > 1, or the middle L of a lossy family) "
            f"{'take' if n != 1 else 'takes'} the decoder's work from a line a + b k (2L + 1) through the family's "
            "timed steps, the line's residual error added to the intervals.")


def _scheme_name(key) -> str:
    f, k, L = key
    return "plain decoding" if f == "plain" else f if ":" in f else f"{f} (k = {k}, L = {L})"  # a tree: its name


def _calibration_lines(summary) -> list[str]:
    """What the racing calibration timed how often, and what it left out and why (its budget, or a prediction (b)
    too low to contend), from the run's cost rows."""
    tm = summary.timings or {}
    steps = {(n.partition(":")[2], k, m): len(v) for (n, k, m), v in tm.items() if n.startswith("step:")}
    spent, budget = tm.get((SPENT_ROW, 0, 0)), tm.get((BUDGET_ROW, 0, 0))
    head = (f"The calibration took {spent[0]:.1f} s" if spent else "The calibration") + (
        f" of its budget of {budget[0]:g} s (`calibration_s`)" if budget else " (no budget)")
    if not steps:
        if any(n.startswith(UNTIMED_PREFIX) for n, _, _ in tm):
            return [head + ": the budget ran out before plain decoding's decodes, so the decoder's work outside the "
                    "forward passes was not timed and both predictions count the forward passes alone. Raise "
                    "`calibration_s` (`--calibration-s`) on a slow or busy device.", ""]
        return []
    full = max(steps.values())
    lines = [head + f": plain decoding and the contenders -- the configurations whose prediction (a) after one "
             f"timing was within {CONTENDER_MARGIN:.0%} of the best's, and the runner-up -- timed up to {full} "
             "times."]
    fewer = [f"{_scheme_name(key)}: {n}" for key, n in steps.items() if n < full]
    if fewer:
        lines[0] += (" Timed fewer times (not contenders, or cut short by the budget): " + "; ".join(fewer) + ". A "
                     "configuration timed once draws its intervals' timing scatter from the repeated timings' "
                     "deviations from their medians (a single timing's scatter, wider than a median's).")
    if not any(len(v) > 1 for key, v in tm.items() if key[0] in ("target", "draft", "tree-target", "step:plain")):
        lines[0] += (" No timing was repeated within the budget: the intervals carry no timing scatter (raise "
                     "`calibration_s`).")
    why = {"budget": "the budget ran out before it", "bound": f"its prediction (b), the forward passes alone, lay "
           f"below {1 - CONTENDER_MARGIN:.0%} of the best prediction (a)"}
    left = {}
    for (n, k, m), v in tm.items():
        if n.startswith(UNTIMED_PREFIX):
            left.setdefault(UNTIMED.get(v[0], "budget"), []).append(_scheme_name((n[len(UNTIMED_PREFIX):], k, m)))
    for reason, names in left.items():
        lines[0] += f" Not timed ({why[reason]}): {', '.join(names)}."
    if left:
        lines[0] += (" Their decoder's work is read off their family's line through its timed configurations; a "
                     "family with none timed has no prediction (a) and is not ranked.")
    trees = [nm for nms in left.values() for nm in nms if ":" in nm]
    if trees:
        timed_trees = [key for key in steps if ":" in key[0]]
        lines[0] += (" A tree family not timed takes the decoder's work of the timed tree families, interpolated in "
                     "the number of nodes." if timed_trees else " " + _untimed_trees_sentence(trees))
    return lines + [""]


def _untimed_trees_sentence(names) -> str:
    """Why the tree families ``names`` (none of them timed) have no prediction (a), and what would time them."""
    return (f"No tree family was timed ({', '.join(names)} left untimed): the trees have no prediction (a) and are not "
            "ranked (their speed-up from the forward passes alone, prediction (b), is in the tree section); raising "
            "`calibration_s` (`--calibration-s`) would time them.")


def _costs_lines(summary) -> list[str]:
    c = summary.costs
    s = summary.settings
    if c.source == "given":
        return _given_lines(summary)
    tm = summary.timings or {}
    lines = ["## Costs of the model calls", "", f"Source: {c.description}.", "", _provenance_line(summary), ""]
    plain = c.plain
    ptxt = f"{1e3 * plain:.3f} ms per target call of one token"
    if tm.get(("target", 1, 1)):
        t = tm[("target", 1, 1)]
        ptxt += (f" (the median of {len(t)} timings, {1e3 * min(t):.3f} to {1e3 * max(t):.3f} ms)" if len(t) > 1 else
                 " (timed once)")
    lines += [f"Plain decoding: {ptxt}.", ""]
    if tm:
        lines += ["Each cell: the median over plain decoding's median, and in parentheses the smallest and largest "
                  "of its timings on the same scale (the spread).", ""]
    if tm and all(len(v) < 2 for v in tm.values()):
        lines += ["**Every call was timed once**: no timing was repeated, so no timing scatter was measured and the "
                  "speed-ups' intervals carry the prompts' spread alone (narrower than the truth). Profile again "
                  "with a larger `calibration_s` on a quiet device.", ""]
    lines += ["| call | " + " | ".join(f"k = {k}" for k in range(1, s["k_max"] + 1)) + " |",
              "|---|" + "---|" * s["k_max"]]
    lines.append("| draft step on k rows (x plain) | " + " | ".join(
        f"{c.draft[k] / plain:.2f}{_spread(tm, ('draft', k, 1), plain)}" for k in range(1, s["k_max"] + 1)) + " |")
    for L in range(1, s["L_max"] + 1):
        lines.append(f"| target scoring k rows of {L + 1} tokens (x plain) | " + " | ".join(
            f"{c.target[(k, L)] / plain:.2f}{_spread(tm, ('target', k, L + 1), plain)}"
            for k in range(1, s["k_max"] + 1)) + " |")
    lines.append("")
    tree = sorted(key for key in tm if key[0] == "tree-target")
    rows = sorted(key for key in tm if key[0] == "draft" and key[1] > s["k_max"])
    if tree or rows:
        lines += ["The tree calls behind the draft trees' speed-ups (x plain; between the measured sizes the cost "
                  "model interpolates linearly):", "", "| call | median (spread) |", "|---|---|"]
        for key in tree + rows:
            lines.append(f"| {_call_name(key)} | {float(np.median(tm[key])) / plain:.2f}{_spread(tm, key, plain)} |")
        lines.append("")
    if c.decoder_measured:
        lines += ["Speed-ups are prediction (a), otspec's own decoder on this device: the forward passes above plus "
                  "the decoder's work beyond them, from whole steps timed on a few real iterations of every scheme "
                  f"(plain decoding: {1e3 * c.overhead_plain:.3f} ms per token beyond its forward pass). "
                  "Prediction (b), the forward passes alone (an engine whose verification is fused into its "
                  "forward pass), is `speedup_forward` in the summary." + _fitted_sentence(c), ""]
        lines += _calibration_lines(summary)
    else:
        lines += ["Speed-ups count the forward passes alone (the run did not time the decoder's work outside "
                  "them).", ""] + _calibration_lines(summary)
    inv = cost_inversions(tm)
    if inv:
        shown = "; ".join(f"{_call_name(b)} ({float(np.median(tm[b])) / plain:.2f}x plain) cheaper than "
                          f"{_call_name(a)} ({float(np.median(tm[a])) / plain:.2f}x)" for b, a in inv[:4])
        lines += [f"**The cost table is not monotone**: {shown}" + (f"; {len(inv) - 4} more" if len(inv) > 4 else "")
                  + ". The larger call was measured cheaper beyond both calls' spreads, which no "
                  "model computes: timing noise (a shared or busy device). The predictions use the monotone "
                  "envelope (every call at least as dear as any smaller one); the speed-ups, and the order of "
                  "configurations close to each other, inherit it; time the run again on a quiet device, or give "
                  "the costs (`--draft-cost`, `--score-cost`).", ""]
    return lines


def _tables_lines(summary) -> list[str]:
    s = summary.settings
    lines = []
    sets = [ps for ps in summary.sets.values() if ps.tokens_per_call or ps.acceptance]
    has_costly = any(ps.name == "subsample" and (set(_names_on(ps, "tau")) - set(
        _names_on(summary.sets.get("all", ps), "tau")) or set(_names_on(ps, "acc")) - set(
        _names_on(summary.sets.get("all", ps), "acc"))) for ps in sets)
    for ps in sets:
        if ps.name == "subsample" and not has_costly:
            continue
        title = _set_title(ps, summary)
        if ps.tokens_per_call:
            lines += [f"## Tokens per target call and predicted speed-up, on {title}", "",
                      "Every row of this table is computed on the same positions.", "",
                      "| scheme | k | L | tokens per call | speed-up |", "|---|---|---|---|---|"]
            for key, e in ps.tokens_per_call.items():
                lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {_fmt(e)} | {_fmt(ps.speedup[key], '.2f')} |")
            lines.append("")
        if ps.acceptance:
            lines += [f"## Mean acceptance per depth, on {title}", "",
                      "| verifier | k | " + " | ".join(f"depth {j}" for j in range(1, s["L_max"] + 1)) + " |",
                      "|---|---|" + "---|" * s["L_max"]]
            for v, k in dict.fromkeys((v, k) for v, k, _ in ps.acceptance):
                cells = [_fmt(ps.acceptance[(v, k, j)]) if (v, k, j) in ps.acceptance else "-"
                         for j in range(1, s["L_max"] + 1)]
                lines.append(f"| {v} | {k} | " + " | ".join(cells) + " |")
            lines.append("")
        if ps.gaps:
            lines += [f"Lossy rules, first depth, on {title}: total variation and KL(q || output) of the output "
                      "law.", "", "| verifier | k | TV | KL |", "|---|---|---|---|"]
            for (kind, v, k, j) in ps.gaps:
                if kind == "tv" and j == 1:
                    lines.append(f"| {v} | {k} | {_fmt(ps.gaps[('tv', v, k, 1)], '.4f')} | "
                                 f"{_kl(ps.gaps[('kl', v, k, 1)])} |")
            lines.append("")
    return lines


def _budgets(N: int) -> list[int]:
    """The node budgets a report lists: 1, 2, 3, 4, then about 1.5 times apart, and N."""
    out, x = [], 1
    while x <= N:
        out.append(x)
        x = x + 1 if x < 4 else int(round(x * 1.5))
    return sorted(set(out + [N]))


def _paths_text(paths, limit: int = 12) -> str:
    text = ", ".join("(" + ",".join(map(str, p)) + ")" for p in paths[:limit])
    return text + (f", ... ({len(paths)} paths)" if len(paths) > limit else "")


def _trees_lines(summary) -> list[str]:
    ts = summary.trees
    lines = [f"## Draft trees, on all {ts.positions} profiled positions", "",
             "Expected tokens per target call, 1 + E[tau | T] averaged over the drawn trees (deterministic trees: 1 + "
             "the sum of the target's path probabilities of their nodes), beside the (k, L) schemes on the same "
             "positions; speed-up from one iteration's seconds: a draft call per depth (on the nodes of that depth "
             "that get children) and one target call scoring the tree.", "",
             "| scheme | process | nodes | depth | tokens per call | speed-up | forward passes alone |",
             "|---|---|---|---|---|---|---|"]
    fw = {**ts.chains_speedup_forward, **ts.speedup_forward}
    rows = [(f["n"], name, f["process"], f["depth"], ts.tokens_per_call[name], ts.speedup[name], name)
            for name, f in ts.families.items()]
    rows += [(k * L, f"{f} (k = {k}, L = {L})", "k i.i.d. blocks", L, e, ts.chains_speedup[(f, k, L)], (f, k, L))
             for (f, k, L), e in ts.chains.items() if get_verifier(f).lossless]
    for n, name, proc, d, e, sp, key in sorted(rows, key=lambda r: (r[0], r[1])):
        lines.append(f"| {name} | {proc} | {n} | {d} | {_fmt(e)} | {_fmt(sp, '.2f')} | "
                     f"{_fmt(fw[key], '.2f') if key in fw else '-'} |")
    lines.append("")
    if ts.unranked:
        lines += [_untimed_trees_sentence(ts.unranked), ""]
    # the engine settings the answer's table left to this section (too long for a cell)
    long = [c for c in summary.configurations if c.kind == "tree" and c.settings and len(c.settings) > MAX_CELL]
    if long:
        lines += ["Engine settings of the families above:", ""] + [f"- {c.name}: `{c.settings}`" for c in long] + [""]
    ren = getattr(ts, "renewal", None) or {}
    routes = ts.along
    if ren:
        lines += ["Along the text: tokens per call of decoding these texts by the renewal estimator, from each "
                  "family's emission law along the text (how, in the last column). Palm: 1 + E[tau | T] at the "
                  "profiled positions weighted by their start probabilities; bias: the per-position average above "
                  "over the Palm average, minus 1.", "",
                  "| tree | nodes | depth | renewal | Palm | per-position bias | emission along the text |",
                  "|---|---|---|---|---|---|---|"]
        for name, e in ren.items():
            f, palm = ts.families[name], ts.palm.get(name)
            lines.append(f"| {name} | {f['n']} | {f['depth']} | {_fmt(e)} | {_fmt(palm) if palm else '-'} | "
                         f"{_percent(ts.position_bias.get(name))} | {routes[name][0]} |")
        lines.append("")
    missing = [(name, routes[name][1]) for name in ts.families if name not in ren and routes[name][1]]
    if missing:
        lines += ["No estimate along the text for: " + "; ".join(f"{name} ({why})" for name, why in missing) + ".",
                  ""]
    ch = ts.choice
    if ch is None:
        return lines + ([ts.note, ""] if ts.note else [])
    lines += [f"## Choosing a draft tree: chosen on the {ch.choose_prompts} even-indexed prompts ({ch.positions[0]} "
              f"positions), measured on the {ch.evaluate_prompts} odd-indexed ones ({ch.positions[1]})", "",
              "No value below is measured on the prompts that chose it.", ""]
    if ch.static:
        lines += ["Best static top-k shape for each node budget n: the n rank paths with the largest mean target path "
                  "probability on the choosing half (exact within the recorded universe of rank paths).", "",
                  "| nodes | tokens per call | speed-up | rank paths |", "|---|---|---|---|"]
        for n in _budgets(len(ch.static)):
            st = ch.static[n - 1]
            mark = " (fastest)" if st is ch.fastest else ""
            lines.append(f"| {n}{mark} | {_fmt(st.tokens_per_call)} | {_fmt(st.speedup, '.2f')} | "
                         f"{_paths_text(st.paths)} |")
        for name, d in ch.versus.items():
            sp = ch.heldout_speedup.get(name)
            lines.append(f"| {ts.families[name]['n']} ({name}) | {_fmt(ch.heldout[name])} | "
                         f"{_fmt(sp, '.2f') if sp else '-'} | the family itself; best static shape minus it, "
                         f"paired difference in tokens per call: {_signed(d)} |")
        if ch.fastest is not None and ch.fastest.n not in _budgets(len(ch.static)):
            st = ch.fastest
            lines.append(f"| {st.n} (fastest) | {_fmt(st.tokens_per_call)} | {_fmt(st.speedup, '.2f')} | "
                         f"{_paths_text(st.paths)} |")
        ex = ch.export
        if ch.fastest is None:  # no prediction (a) to choose by
            lines += ["", "**No device-aware choice**: no tree family's decoder was timed, so the shapes have no "
                      "prediction (a) to rank them by (raise `calibration_s`).", ""]
    if ch.static and ch.fastest is not None:
        sg = ex["sglang"]
        lines += ["", f"**Device-aware choice**: n = {ch.fastest.n} nodes, {_fmt(ch.fastest.tokens_per_call)} tokens "
                  f"per call, speed-up {_fmt(ch.fastest.speedup, '.2f')} (held out)."
                  + (" " + _edge_line(ch.edge, summary) if ch.edge else ""), "",
                  f"- medusa_choices: `{ex['medusa_choices']}`",
                  f"- SGLang (closest EAGLE-2 parameters): `--speculative-num-steps {sg['speculative_num_steps']} "
                  f"--speculative-eagle-topk {sg['speculative_eagle_topk']} --speculative-num-draft-tokens "
                  f"{sg['speculative_num_draft_tokens']}`"
                  + (f": EAGLE-2 there {_fmt(ex['sglang_tokens_per_call'])} tokens per call (held out, from "
                     f"{ex['sglang_source']})" if ex["sglang_tokens_per_call"] is not None else
                     ": not covered by the recorded universe")]
        if ex.get("closest_eagle2"):
            lines.append(f"- nearest profiled EAGLE-2 family: {ex['closest_eagle2']}, "
                         f"{_fmt(ex['closest_eagle2_tokens_per_call'])} tokens per call (held out)")
        lines.append("")
    if ch.sequoia:
        lines += [f"Sequoia's dynamic programme on the acceptance vector of {ch.sequoia_source} (choosing half: "
                  f"{', '.join(f'{a:.3f}' for a in ch.acceptance)}); predicted by its positional-acceptance "
                  "assumption, measured exactly from the recorded per-node acceptance (held out).", "",
                  "| nodes | predicted | measured | rank paths |", "|---|---|---|---|"]
        for sq in ch.sequoia:
            if sq.n in _budgets(ch.sequoia[-1].n):
                m = _fmt(sq.tokens_per_call) if sq.tokens_per_call is not None else "outside the recorded tree"
                lines.append(f"| {sq.n} | {sq.predicted:.3f} | {m} | {_paths_text(sq.paths)} |")
        lines.append("")
    if ch.eagle2:
        lines += ["EAGLE-2 grid (held out); chosen on the choosing half by predicted speed-up: " + (
                  f"**{ch.best_eagle2}**." if ch.best_eagle2 is not None else "none (no prediction (a))."), "",
                  "| family | tokens per call | speed-up |", "|---|---|---|"]
        for name, e in ch.eagle2.items():
            lines.append(f"| {name} | {_fmt(e)} | {_fmt(ch.eagle2_speedup[name], '.2f')} |")
        lines.append("")
    return lines


#: How the report names the tree verifiers in sentences.
_RULE_NAMES = {"specinfer": "SpecInfer's rule", "sequoia": "Sequoia's rule", "traversal": "Traversal Verification",
               "spectr-tree": "The SpecTr tree rule", "target-only": "The target-only rule"}


def _bound_lines(summary) -> list[str]:
    """The sampled-tree families' verifiers against the upper bound on every lossless verifier, on the same
    positions (:class:`otspec.profile._summary.TreeBoundSummary`)."""
    bounds = getattr(summary.trees, "bounds", None) or {}
    if not bounds:
        return []
    budget = next(iter(bounds.values())).budget
    lines = ["## How far the tree verifiers are from the best possible", "",
             "At every subsampled position, an upper bound B on the expected accepted draft tokens of every lossless "
             "verifier of each sampled tree family (the bound of docs/theory/trees.rst, 'An upper bound at any "
             "vocabulary': B >= OPT_c >= E[tau] of any verifier, averaged over the drawn trees), computed from the "
             f"draft's and the target's laws with up to {budget} prefixes expanded per family and position (the "
             "context and its children of largest min(Q, pi), scored in one tree-attention call per model); the "
             "remainder is what the "
             "budget left open (the bound stays an upper bound). Value: E[tau | T] of the drawn trees, accepted draft "
             "tokens per call, on the same positions; share: value / bound, a lower bound on the share of the best "
             "possible verifier's value (on one drawn tree E[tau | T] may exceed B: B bounds the mean over trees, so "
             "a share's interval stops at 100 % and a gap's at 0, though the estimate on a few drawn trees may not); "
             "pi: whether the probability that a path is drafted was exact (draws without replacement by their "
             "exact laws, to a relative 1e-12) or only bounded above.",
             "", "| scheme | positions | value | bound | gap | share of the bound | mean remainder | pi |",
             "|---|---|---|---|---|---|---|---|"]
    for name, b in bounds.items():
        lines.append(f"| {name} | {b.positions} | {_fmt(b.value)} | {_fmt(b.bound)} | {_fmt(b.gap)} | "
                     f"{_share(b.share)} | {b.remainder:.2g} | {'exact' if b.pi_exact else 'bounded'} |")
    lines.append("")
    for b in bounds.values():
        rule = _RULE_NAMES.get(b.verifier, f"The rule {b.verifier!r}")
        text = (f"- {rule} reaches {_share(b.share)} of what any verifier could on these trees ({b.family}, "
                f"{b.positions} positions; budget {b.budget} prefixes, {b.expanded:.1f} expanded on average, mean "
                f"remainder {b.remainder:.2g}).")
        if not b.pi_exact:
            text += (" The probability that a path is drafted is only bounded here (the exact law of a draw of "
                     "rank >= 2 without replacement failed its checks at some position and its upper bound was "
                     "used), so the share is a lower bound on the true share.")
        lines.append(text)
    return lines + [""]


def _share(e) -> str:
    """A share as a percentage with its interval."""
    if not e.has_interval:
        return f"{100 * e.value:.0f} % [{ONE_PROMPT}]"
    return f"{100 * e.value:.0f} % [{100 * e.lo:.0f}, {100 * e.hi:.0f}]"


def report_markdown(summary, *, figures=(), left_out=()) -> str:
    r"""The report's markdown text: the recommendation first, then what was profiled, the costs, and the tables.

    Every table holds estimates computed on one set of positions, named in its title (all profiled
    positions, or the subsample where the costly schemes were computed): a scheme's mean is never set beside
    another's computed on other positions.

    Parameters
    ----------
    summary : ProfileSummary
    figures : sequence of str, keyword-only
        File names of figures to link.
    left_out : sequence of str, keyword-only
        Lines saying which figures were left out and why (drawn on too few positions to rank).

    Returns
    -------
    str
    """
    s = summary.settings
    sub = f", subsample: {_every(s['subsample'])} profiled position" if s.get("subsample") else ""
    lines = [
        "# Profile of a draft/target pair",
        "",
        f"Draft: {summary.models['draft']['name']}; target: {summary.models['target']['name']} "
        f"(V = {summary.models['target']['vocab_size']}). {summary.prompts} prompt"
        f"{'' if summary.prompts == 1 else 's'}, {summary.positions} profiled position"
        f"{'' if summary.positions == 1 else 's'}{sub}; k_max = {s['k_max']}, L_max = {s['L_max']}, context path: "
        f"{s['context']}, temperature "
        f"{s['temperature']}, top-k {s['top_k']}, top-p {s['top_p']}. Intervals: 95 % bootstrap over prompts "
        f"(on fewer than {MIN_PERCENTILE_PROMPTS} prompts, widened to at least Student's interval on the bootstrap "
        f"standard error), each inside its quantity's range (a probability or a share in [0, 1], tokens per call in "
        f"[1, L + 1], a gap to a bound >= 0); an estimate resting on one prompt has none (\"{ONE_PROMPT}\").",
        "",
    ]
    missing = (summary.provenance or {}).get("missing_shards") or ()
    if missing:
        lines += [f"**An unfinished run**: {len(missing)} of its {summary.provenance['shards']} shards are not written "
                  f"({', '.join(missing)}); every estimate rests on the prompts of the others. Run `profile` again "
                  "with the same arguments to finish it.", ""]
    lines += _recommendation_lines(summary)
    lines += _profiled_lines(summary)
    lines += _costs_lines(summary)
    lines += _tables_lines(summary)
    if getattr(summary, "trees", None) is not None:
        lines += _trees_lines(summary)
        lines += _bound_lines(summary)
    if summary.renewal:
        lines += ["## Tokens per call, renewal estimator along the text", "",
                  "Renewal: tokens per call of decoding these texts (T / expected calls); Palm: the profiled "
                  "positions weighted by their start probabilities (the long-run tokens per call, and the tokens a decode "
                  "of these texts emits per call, the last iteration's tokens past T included); bias: the "
                  "per-position average over the Palm average, minus 1 (docs/theory/profile.rst). Computed along "
                  "the whole text of every prompt.", "",
                  "| scheme | k | L | renewal | Palm | per-position bias |", "|---|---|---|---|---|---|"]
        for (f, k, L), e in summary.renewal.items():
            palm, bias = summary.palm.get((f, k, L)), summary.position_bias.get((f, k, L))
            lines.append(f"| {f} | {k} | {L} | {_fmt(e)} | {_fmt(palm) if palm else '-'} | {_percent(bias)} |")
        if summary.renewal_differences:
            lines += ["", "| scheme | k | L | minus | difference in renewal tokens per call |", "|---|---|---|---|---|"]
            for ((f, k, L), (r, _, _)), e in summary.renewal_differences.items():
                lines.append(f"| {f} | {k} | {L} | {r} | {_signed(e)} |")
        lines.append("")
    if summary.differences:
        lines += ["## Paired differences of tokens per call", "",
                  "Both sides on the same positions (the subsample when either is computed there only).", "",
                  "| scheme | k | L | minus | positions | difference in tokens per call |", "|---|---|---|---|---|---|"]
        for ((f, k, L), (r, rk, _)), e in summary.differences.items():
            lines.append(f"| {f} | {k} | {L} | {r} (k = {rk}) | {e.positions} | {_signed(e)} |")
        lines.append("")
    if figures or left_out:
        lines += ["## Figures", ""] + [f"![{Path(f).stem}]({f})" for f in figures] + ([""] if figures else [])
        lines += [f"- {t}" for t in left_out] + ([""] if left_out else [])
    return "\n".join(lines).rstrip("\n") + "\n"


def _draw_panels(path: Path, title: str, items: list, draw, *, size=(5.0, 3.8), cols: int = 3) -> None:
    """One PNG of ``len(items)`` panels (at most ``cols`` a row), ``draw(ax, item)`` each; the title wrapped to the
    figure's width and the bounding box fitted to everything drawn (titles, legends outside the axes)."""
    import textwrap

    import matplotlib.pyplot as plt

    cols = min(cols, len(items))
    rows = -(-len(items) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(size[0] * cols, size[1] * rows), squeeze=False)
    for ax, item in zip(axes.flat, items):
        draw(ax, item)
    for ax in list(axes.flat)[len(items):]:
        ax.set_visible(False)
    fig.suptitle("\n".join(textwrap.wrap(title, width=int(14 * size[0] * cols))), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100, bbox_inches="tight", pad_inches=0.15, metadata={"Software": None})
    plt.close(fig)


#: Every figure a report may draw.
FIGURES = ("acceptance_vs_k.png", "tokens_vs_L.png", "speedup.png", "trees_tokens.png", "trees_speedup.png",
           "trees_heldout.png", "tree_chosen.png")


def _too_few(what: str, n: int) -> str:
    return (f"{what}: left out, as they would rest on {_positions(n)} only (fewer than the {MIN_RANKED_POSITIONS} "
            "this report needs to rank; profile more positions).")


def _figures(summary, dest: Path) -> tuple[list, list]:
    """Draw the report's figures: ``(file names, lines saying which were left out and why)``."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    names, left = [], []
    ps = position_set(summary)
    st = summary.settings
    depths = sorted({j for _, _, j in ps.acceptance})
    ks = sorted({k for _, k, _ in ps.tokens_per_call})
    fams = list(dict.fromkeys(f for f, _, _ in ps.speedup))
    where = _set_title(ps, summary)
    panels = (
        ("acceptance_vs_k.png", "Mean acceptance against k, per depth", depths,
         lambda ax, j: plot_acceptance_vs_k(summary, depth=j, positions=ps.name, ax=ax)),
        ("tokens_vs_L.png", "Tokens per target call against L, per number of drafts k", ks,
         lambda ax, k: plot_tokens_vs_L(summary, k=k, positions=ps.name, ax=ax)),
        ("speedup.png", "Predicted speed-up over plain decoding, per scheme (framed: its best k, L)", fams,
         lambda ax, f: plot_speedup(summary, family=f, positions=ps.name, ax=ax)),
    )
    if not (ps.acceptance or ps.tokens_per_call):
        pass  # no (k, L) quantity on these positions (every scheme on the subsample only, or none): nothing to draw
    elif ps.positions < MIN_RANKED_POSITIONS:
        left.append(_too_few("The (k, L) figures (acceptance_vs_k.png, tokens_vs_L.png, speedup.png), on the "
                             "recommendation's positions", ps.positions))
    else:
        for fname, title, items, draw in panels:
            if items:
                _draw_panels(dest / fname, f"{title}: {st['k_max']} drafts at most, on {where}", items, draw,
                             size=(5.6, 3.8) if fname != "speedup.png" else (4.6, 3.6))
                names.append(fname)
    ts = summary.trees
    if ts is not None and ts.tokens_per_call:
        if ts.positions < MIN_RANKED_POSITIONS:
            left.append(_too_few("The tree figures on all profiled positions (trees_tokens.png, trees_speedup.png)",
                                 ts.positions))
        else:
            for fname, draw in (("trees_tokens.png", plot_tree_tokens), ("trees_speedup.png", plot_tree_speedup)):
                _draw_panels(dest / fname, "Draft trees beside the (k, L) schemes", [None],
                             lambda ax, _, draw=draw: draw(summary, positions="all", ax=ax), size=(6.4, 4.4))
                names.append(fname)
    ch = ts.choice if ts is not None else None
    if ch is not None and ch.static:
        if ch.positions[1] < MIN_RANKED_POSITIONS:
            left.append(_too_few("The held-out tree figures (trees_heldout.png, tree_chosen.png)", ch.positions[1]))
        else:
            _draw_panels(dest / "trees_heldout.png", "Draft trees and the best static shape of every size, held out",
                         ["tokens", "speedup"],
                         lambda ax, w: (plot_tree_tokens if w == "tokens" else plot_tree_speedup)(
                             summary, positions="held out", ax=ax), size=(6.4, 4.4), cols=1)
            names.append("trees_heldout.png")
            _draw_panels(dest / "tree_chosen.png", "The chosen draft tree", [None],
                         lambda ax, _: plot_chosen_tree(summary, ax=ax), size=chosen_tree_size(summary))
            names.append("tree_chosen.png")
    return names, left


def write_report(out, *, dest=None, figures: bool = True, **summary_options) -> Path:
    r"""Write ``report.md`` and its figures for a run.

    The figures (PNG): ``acceptance_vs_k.png``, ``tokens_vs_L.png`` and ``speedup.png`` on the positions the
    recommendation ranks; with trees, ``trees_tokens.png`` and ``trees_speedup.png`` on every profiled
    position, ``trees_heldout.png`` and ``tree_chosen.png`` on the held-out prompts. A figure whose positions
    are fewer than :data:`~otspec.profile._summary.MIN_RANKED_POSITIONS` is left out, and the report says so
    (a figure of an earlier report of the same name is removed with it).

    .. math::

        \text{run folder} \mapsto \text{summary} \mapsto \text{markdown} + \text{figures}.

    Parameters
    ----------
    out : str or path
        The run's folder.
    dest : str or path, optional
        Where to write (default: ``out``).
    figures : bool, keyword-only
        Draw the PNG figures (matplotlib).
    **summary_options
        Passed to :func:`summarize` (``draft_cost``, ``score_cost``, ``reference``, ...).

    Returns
    -------
    pathlib.Path
        The report's path.

    Raises
    ------
    ValueError
        ``out`` holds no run, or ``dest`` holds another run (its report and figures are left as they are).
    """
    check_report_dest(out, dest)
    summary = summarize(out, **summary_options)
    dest = Path(out if dest is None else dest)
    dest.mkdir(parents=True, exist_ok=True)
    names, left = _figures(summary, dest) if figures else ([], [])
    if figures and (dest / "report.md").is_file():
        for stale in FIGURES:
            if stale not in names and (dest / stale).is_file():
                (dest / stale).unlink()
    path = dest / "report.md"
    write_atomic(path, report_markdown(summary, figures=names, left_out=left).encode())
    return path
