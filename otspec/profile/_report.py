r"""A markdown report of a profile run, with its figures (PNG)."""

from __future__ import annotations

from pathlib import Path

from .._registry import get_verifier
from ._figures import (
    plot_acceptance_vs_k,
    plot_chosen_tree,
    plot_speedup,
    plot_tokens_vs_L,
    plot_tree_speedup,
    plot_tree_tokens,
    position_set,
)
from ._store import write_atomic
from ._summary import MIN_RANKED_POSITIONS, summarize

__all__ = ["write_report", "report_markdown"]


def _fmt(e, spec=".3f") -> str:
    return f"{e.value:{spec}} [{e.lo:{spec}}, {e.hi:{spec}}]"


def _signed(e, spec=".3f") -> str:
    return f"{e.value:+{spec}} [{e.lo:+{spec}}, {e.hi:+{spec}}]"


def _percent(e) -> str:
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


def _recommendation_lines(summary) -> list[str]:
    rec = summary.recommendation
    costs = summary.costs
    lines = ["## Recommendation", ""]
    if rec is None:
        return lines + ["No lossless scheme with tokens per call was profiled: nothing to recommend.", ""]
    ps = next((p for p in summary.sets.values() if p.recommendation is rec), None)
    where = _set_title(ps, summary) if ps is not None else f"{rec.positions} positions"
    verdict = ("faster than plain decoding" if rec.speedup.lo > 1 else
               "slower than plain decoding" if rec.speedup.hi < 1 else
               "not distinguishable from plain decoding at this sample size")
    lines += [
        f"**{_config(rec.best)}**: predicted speed-up {_fmt(rec.speedup, '.2f')} over plain decoding "
        f"({verdict}), {_fmt(rec.tokens_per_call)} tokens per target call, on {where}.",
    ]
    if rec.runner_up is not None:
        lines += ["", f"Runner-up: {_config(rec.runner_up)}, speed-up {_fmt(rec.runner_up_speedup, '.2f')}; paired "
                  f"difference best - runner-up {_signed(rec.difference)} (the same resamples on both sides"
                  + ("; an interval covering 0: the two are not told apart" if rec.difference.lo <= 0 else "") + ")."]
    lines += ["", f"Speed-up = time of plain decoding per token / predicted time per token, with the costs "
              f"{costs.description}. Below 1 is slower than plain decoding. Lossless schemes only; the best is "
              "chosen on the same positions its value is reported on, so its value is optimistic by the "
              "selection (compare the runner-up's interval).", "",
              "| rank | scheme | k | L | tokens per call | speed-up |", "|---|---|---|---|---|---|",
              "| baseline | plain decoding | - | 0 | 1 | 1 |"]
    tokens = (ps.tokens_per_call if ps is not None else summary.tokens_per_call)
    for r, (key, sp) in enumerate(rec.ranking[:5], start=1):
        lines.append(f"| {r} | {key[0]} | {key[1]} | {key[2]} | {_fmt(tokens[key])} | {_fmt(sp, '.2f')} |")
    best_of = {}
    for key, sp in rec.ranking:
        best_of.setdefault(key[0], (key, sp))
    lines += ["", "Each scheme at its best (k, L), fastest first:", "",
              "| scheme | k | L | speed-up |", "|---|---|---|---|"]
    for f, (key, sp) in best_of.items():
        lines.append(f"| {f} | {key[1]} | {key[2]} | {_fmt(sp, '.2f')} |")
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


def _costs_lines(summary) -> list[str]:
    c = summary.costs
    s = summary.settings
    lines = ["## Costs of the model calls", "", f"Source: {c.description}.", "",
             f"Plain decoding: {1e3 * c.plain:.3f} ms per target call of one token.", "",
             "| call | " + " | ".join(f"k = {k}" for k in range(1, s["k_max"] + 1)) + " |",
             "|---|" + "---|" * s["k_max"]]
    lines.append("| draft step on k rows (x plain) | " + " | ".join(
        f"{c.draft[k] / c.plain:.2f}" for k in range(1, s["k_max"] + 1)) + " |")
    for L in range(1, s["L_max"] + 1):
        lines.append(f"| target scoring k rows of {L + 1} tokens (x plain) | " + " | ".join(
            f"{c.target[(k, L)] / c.plain:.2f}" for k in range(1, s["k_max"] + 1)) + " |")
    lines.append("")
    if getattr(c, "decoder_measured", False):
        lines += ["Speed-ups are prediction (a), otspec's own decoder on this device: the forward passes above plus "
                  "the decoder's work beyond them, from whole steps timed on a few real iterations of every scheme "
                  f"(plain decoding: {1e3 * c.overhead_plain:.3f} ms per token beyond its forward pass). "
                  "Prediction (b), the forward passes alone (an engine whose verification is fused into its "
                  "forward pass), is `speedup_forward` in the summary.", ""]
    else:
        lines += ["Speed-ups count the forward passes alone (the run did not time the decoder's work outside "
                  "them).", ""]
    for v in getattr(c, "violations", ()):
        lines.append(f"- Warning: {v}; predicted from the monotone envelope instead.")
    return lines + [""] if getattr(c, "violations", ()) else lines


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
                                 f"{_fmt(ps.gaps[('kl', v, k, 1)], '.4f')} |")
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
             "| scheme | process | nodes | depth | tokens per call | speed-up |", "|---|---|---|---|---|---|"]
    rows = [(f["n"], name, f["process"], f["depth"], ts.tokens_per_call[name], ts.speedup[name])
            for name, f in ts.families.items()]
    rows += [(k * L, f"{f} (k = {k}, L = {L})", "k i.i.d. blocks", L, e, ts.chains_speedup[(f, k, L)])
             for (f, k, L), e in ts.chains.items() if get_verifier(f).lossless]
    for n, name, proc, d, e, sp in sorted(rows, key=lambda r: (r[0], r[1])):
        lines.append(f"| {name} | {proc} | {n} | {d} | {_fmt(e)} | {_fmt(sp, '.2f')} |")
    lines.append("")
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
            lines.append(f"| {ts.families[name]['n']} ({name}) | {_fmt(ch.heldout[name])} | - | the family itself; "
                         f"best static shape minus it: {_signed(d)} |")
        if ch.fastest is not None and ch.fastest.n not in _budgets(len(ch.static)):
            st = ch.fastest
            lines.append(f"| {st.n} (fastest) | {_fmt(st.tokens_per_call)} | {_fmt(st.speedup, '.2f')} | "
                         f"{_paths_text(st.paths)} |")
        ex = ch.export
        sg = ex["sglang"]
        lines += ["", f"**Device-aware choice**: n = {ch.fastest.n} nodes, {_fmt(ch.fastest.tokens_per_call)} tokens "
                  f"per call, speed-up {_fmt(ch.fastest.speedup, '.2f')} (held out).", "",
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
        lines += ["EAGLE-2 grid (held out); chosen on the choosing half by predicted speed-up: "
                  f"**{ch.best_eagle2}**.", "", "| family | tokens per call | speed-up |", "|---|---|---|"]
        for name, e in ch.eagle2.items():
            lines.append(f"| {name} | {_fmt(e)} | {_fmt(ch.eagle2_speedup[name], '.2f')} |")
        lines.append("")
    return lines


def report_markdown(summary, *, figures=()) -> str:
    r"""The report's markdown text: the recommendation first, then what was profiled, the costs, and the tables.

    Every table holds estimates computed on one set of positions, named in its title (all profiled
    positions, or the subsample where the costly schemes were computed): a scheme's mean is never set beside
    another's computed on other positions.

    Parameters
    ----------
    summary : ProfileSummary
    figures : sequence of str, keyword-only
        File names of figures to link.

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
        f"(V = {summary.models['target']['vocab_size']}). {summary.prompts} prompts, {summary.positions} profiled "
        f"positions{sub}; k_max = {s['k_max']}, L_max = {s['L_max']}, context path: {s['context']}, temperature "
        f"{s['temperature']}, top-k {s['top_k']}, top-p {s['top_p']}. Intervals: 95 % bootstrap over prompts.",
        "",
    ]
    lines += _recommendation_lines(summary)
    lines += _profiled_lines(summary)
    lines += _costs_lines(summary)
    lines += _tables_lines(summary)
    if getattr(summary, "trees", None) is not None:
        lines += _trees_lines(summary)
    if summary.renewal:
        lines += ["## Tokens per call, renewal estimator along the text", "",
                  "Renewal: tokens per call of decoding these texts (T / expected calls); Palm: the profiled "
                  "positions weighted by their start probabilities (the long-run tokens per call); bias: the "
                  "per-position average over the Palm average, minus 1 (docs/theory/profile.rst). Computed along "
                  "the whole text of every prompt.", "",
                  "| scheme | k | L | renewal | Palm | per-position bias |", "|---|---|---|---|---|---|"]
        for (f, k, L), e in summary.renewal.items():
            palm, bias = summary.palm.get((f, k, L)), summary.position_bias.get((f, k, L))
            lines.append(f"| {f} | {k} | {L} | {_fmt(e)} | {_fmt(palm) if palm else '-'} | {_percent(bias)} |")
        if summary.renewal_differences:
            lines += ["", "| scheme | k | L | minus | renewal difference |", "|---|---|---|---|---|"]
            for ((f, k, L), (r, _, _)), e in summary.renewal_differences.items():
                lines.append(f"| {f} | {k} | {L} | {r} | {_signed(e)} |")
        lines.append("")
    if summary.differences:
        lines += ["## Paired differences of tokens per call", "",
                  "Both sides on the same positions (the subsample when either is computed there only).", "",
                  "| scheme | k | L | minus | positions | difference |", "|---|---|---|---|---|---|"]
        for ((f, k, L), (r, rk, _)), e in summary.differences.items():
            lines.append(f"| {f} | {k} | {L} | {r} (k = {rk}) | {e.positions} | {_signed(e)} |")
        lines.append("")
    if figures:
        lines += ["## Figures", ""] + [f"![{Path(f).stem}]({f})" for f in figures] + [""]
    return "\n".join(lines).rstrip("\n") + "\n"


def _draw_panels(path: Path, title: str, items: list, draw) -> None:
    """One PNG of ``len(items)`` panels (at most 3 a row), ``draw(ax, item)`` each."""
    import matplotlib.pyplot as plt

    cols = min(3, len(items))
    rows = -(-len(items) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.6 * rows), squeeze=False)
    for ax, item in zip(axes.flat, items):
        draw(ax, item)
    for ax in list(axes.flat)[len(items):]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90, metadata={"Software": None})
    plt.close(fig)


def write_report(out, *, dest=None, figures: bool = True, **summary_options) -> Path:
    r"""Write ``report.md`` (and ``acceptance_vs_k.png``, ``tokens_vs_L.png``, ``speedup.png``) for a run.

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
        ``out`` holds no run.
    """
    summary = summarize(out, **summary_options)
    dest = Path(out if dest is None else dest)
    dest.mkdir(parents=True, exist_ok=True)
    names = []
    if figures:
        import matplotlib

        matplotlib.use("Agg", force=False)
        ps = position_set(summary)
        st = summary.settings
        depths = sorted({j for _, _, j in ps.acceptance})
        ks = sorted({k for _, k, _ in ps.tokens_per_call})
        fams = list(dict.fromkeys(f for f, _, _ in ps.speedup))
        panels = (
            ("acceptance_vs_k.png", "Mean acceptance against k, per depth", depths,
             lambda ax, j: plot_acceptance_vs_k(summary, depth=j, positions=ps.name, ax=ax)),
            ("tokens_vs_L.png", "Tokens per target call against L, per number of drafts k", ks,
             lambda ax, k: plot_tokens_vs_L(summary, k=k, positions=ps.name, ax=ax)),
            ("speedup.png", "Predicted speed-up over plain decoding, per scheme (framed: its best k, L)", fams,
             lambda ax, f: plot_speedup(summary, family=f, positions=ps.name, ax=ax)),
        )
        for fname, title, items, draw in panels:
            if items:
                _draw_panels(dest / fname, f"{title} -- {st['k_max']} drafts at most, {_set_title(ps, summary)}",
                             items, draw)
                names.append(fname)
        ts = summary.trees
        if ts is not None and ts.tokens_per_call:
            for fname, draw in (("trees_tokens.png", plot_tree_tokens), ("trees_speedup.png", plot_tree_speedup)):
                _draw_panels(dest / fname, "Draft trees beside the (k, L) schemes", [None],
                             lambda ax, _, draw=draw: draw(summary, ax=ax))
                names.append(fname)
        if ts is not None and ts.choice is not None and ts.choice.fastest is not None:
            _draw_panels(dest / "tree_chosen.png", "The chosen draft tree", [None],
                         lambda ax, _: plot_chosen_tree(summary, ax=ax))
            names.append("tree_chosen.png")
    path = dest / "report.md"
    write_atomic(path, report_markdown(summary, figures=names).encode())
    return path
