r"""A markdown report of a profile run, with its figures (PNG)."""

from __future__ import annotations

from pathlib import Path

from ._figures import plot_acceptance_vs_k, plot_speedup, plot_tokens_vs_L
from ._store import write_atomic
from ._summary import summarize

__all__ = ["write_report", "report_markdown"]


def _fmt(e, spec=".3f") -> str:
    return f"{e.value:{spec}} [{e.lo:{spec}}, {e.hi:{spec}}]"


def report_markdown(summary, *, figures=()) -> str:
    r"""The report's markdown text: settings, acceptance per depth, tokens per call, paired differences, speed-ups.

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
    lines = [
        "# Profile of a draft/target pair",
        "",
        f"Draft: {summary.models['draft']['name']}; target: {summary.models['target']['name']} "
        f"(V = {summary.models['target']['vocab_size']}). {summary.prompts} prompts, {summary.positions} profiled "
        f"positions; k_max = {s['k_max']}, L_max = {s['L_max']}, context path: {s['context']}, temperature "
        f"{s['temperature']}, top-k {s['top_k']}, top-p {s['top_p']}. Intervals: 95 % bootstrap over prompts.",
        "",
        "## Mean acceptance per depth",
        "",
        "| verifier | k | " + " | ".join(f"depth {j}" for j in range(1, s["L_max"] + 1)) + " |",
        "|---|---|" + "---|" * s["L_max"],
    ]
    for v, k in dict.fromkeys((v, k) for v, k, _ in summary.acceptance):
        cells = [_fmt(summary.acceptance[(v, k, j)]) if (v, k, j) in summary.acceptance else "-"
                 for j in range(1, s["L_max"] + 1)]
        lines.append(f"| {v} | {k} | " + " | ".join(cells) + " |")
    if summary.gaps:
        lines += ["", "Lossy rules, first depth: total variation and KL(q || output) of the output law.", "",
                  "| verifier | k | TV | KL |", "|---|---|---|---|"]
        for (kind, v, k, j) in summary.gaps:
            if kind == "tv" and j == 1:
                lines.append(f"| {v} | {k} | {_fmt(summary.gaps[('tv', v, k, 1)], '.4f')} | "
                             f"{_fmt(summary.gaps[('kl', v, k, 1)], '.4f')} |")
    lines += ["", "## Tokens per target call and predicted speed-up", "",
              f"Cost model: draft step / target call c = {summary.draft_cost:.3f}, scoring L + 1 tokens s = "
              f"{summary.score_cost:.2f} target calls.", "",
              "| scheme | k | L | tokens per call | speed-up |", "|---|---|---|---|---|"]
    for (f, k, L), e in summary.tokens_per_call.items():
        lines.append(f"| {f} | {k} | {L} | {_fmt(e)} | {summary.speedup[(f, k, L)]:.2f} |")
    if summary.renewal:
        lines += ["", "## Tokens per call, renewal estimator along the text", "",
                  "Renewal: tokens per call of decoding these texts (T / expected calls); Palm: the profiled "
                  "positions weighted by their start probabilities (the long-run tokens per call); bias: the "
                  "per-position average over the Palm average, minus 1 (docs/theory/profile.rst).", "",
                  "| scheme | k | L | renewal | Palm | per-position bias |", "|---|---|---|---|---|---|"]
        for (f, k, L), e in summary.renewal.items():
            palm, bias = summary.palm.get((f, k, L)), summary.position_bias.get((f, k, L))
            b = f"{100 * bias.value:+.2f} % [{100 * bias.lo:+.2f}, {100 * bias.hi:+.2f}]" if bias else "-"
            lines.append(f"| {f} | {k} | {L} | {_fmt(e)} | {_fmt(palm) if palm else '-'} | {b} |")
        if summary.renewal_differences:
            lines += ["", "| scheme | k | L | minus | renewal difference |", "|---|---|---|---|---|"]
            for ((f, k, L), (r, _, _)), e in summary.renewal_differences.items():
                lines.append(f"| {f} | {k} | {L} | {r} | {e.value:+.3f} [{e.lo:+.3f}, {e.hi:+.3f}] |")
    if summary.differences:
        lines += ["", "## Paired differences of tokens per call", "",
                  "| scheme | k | L | minus | difference |", "|---|---|---|---|---|"]
        for ((f, k, L), (r, _, _)), e in summary.differences.items():
            lines.append(f"| {f} | {k} | {L} | {r} | {e.value:+.3f} [{e.lo:+.3f}, {e.hi:+.3f}] |")
    if figures:
        lines += ["", "## Figures", ""] + [f"![{Path(f).stem}]({f})" for f in figures]
    return "\n".join(lines) + "\n"


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
        import matplotlib.pyplot as plt


        fam = "optimal" if any(f == "optimal" for f, _, _ in summary.speedup) else next(iter(summary.speedup), None)
        for fname, draw in (("acceptance_vs_k.png", lambda ax: plot_acceptance_vs_k(summary, ax=ax)),
                            ("tokens_vs_L.png", lambda ax: plot_tokens_vs_L(summary, ax=ax)),
                            ("speedup.png", (lambda ax: plot_speedup(summary, family=fam, ax=ax)) if fam else None)):
            if draw is None or (fname == "acceptance_vs_k.png" and not summary.acceptance):
                continue
            fig, ax = plt.subplots(figsize=(6.5, 4.2))
            draw(ax)
            fig.savefig(dest / fname, dpi=100, bbox_inches="tight", metadata={"Software": None})
            plt.close(fig)
            names.append(fname)
    path = dest / "report.md"
    write_atomic(path, report_markdown(summary, figures=names).encode())
    return path
