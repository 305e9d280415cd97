"""Reproduction: SpecTr's token-level multi-draft comparisons (OTM-k, k-Seq, multi-round).

SpecTr, arXiv:2310.15141 v2, Appendix B, Figures 4, 5, 6 and B.2; conference
version (NeurIPS 2023) Figure 3 (acceptance against the target's b for several k).
Every plotted value comes from otspec's exact functions (alpha_k by one sort,
KSeq.acceptance at the exact rho*, MultiRound.acceptance), never from a
re-typed formula; the paper's formulas appear only in the comparison columns.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from _report import ROUNDOFF, Row, Section, fmt_argmax, fmt_error, save_figure, write_csv

import otspec
from otspec.closed_form import bernoulli_alpha_k, lemma3_constant, uniform_alpha_k

TITLE = "SpecTr token-level verifiers: OTM-k vs k-Seq vs multi-round (Figs. 4-6, conf. Fig. 3)"

P_BER = 0.25
KS_BER = list(range(1, 11))
D_UNIF = 120
DQS = (5, 10, 20, 40, 60, 120)
KS_UNIF = list(range(1, 31))
KS_CONF = (1, 2, 4, 8)
BS_CONF = np.linspace(0.0, 1.0, 201)
TOL = 1e-12


def _write_csv(path: Path, header, rows):
    write_csv(path, header, rows)


def run(out: Path) -> Section:
    import matplotlib

    matplotlib.use("Agg")
    from otspec.plotting.multidraft import (
        acceptance_curves,
        bernoulli_pair,
        plot_acceptance_vs_b,
        plot_spectr_fig4,
        plot_spectr_fig5,
        plot_spectr_fig6,
        uniform_pair,
    )

    out = Path(out)
    sec = Section(
        title=TITLE,
        source=(
            "SpecTr, arXiv:2310.15141 v2,: Algorithm 2, Theorem 1, Lemma 4, App. B (Figs. 4, 5), B.2, "
            "B.3 (Fig. 6); conference version (NeurIPS 2023): Fig. 3, App. D.1"
        ),
        notes=(
            "The papers print no numbers for these figures, only their descriptions; each row states the "
            "described shape or formula and what otspec computes. k-Seq is run at the exact rho* "
            "(`kseq_rho_star`, one sort) and its acceptance is the exact P(Y in S(X)), checked by enumeration "
            "in the test suite. Fig. 5's target sizes d_q are not printed in SpecTr (arXiv:2310.15141); we use "
            f"d_q in {DQS}. Tables: `spectr_fig4.csv`, `spectr_fig5.csv`, `spectr_fig6.csv`, "
            "`spectr_conf_fig3.csv`."
        ),
    )

    # ------------------------------------------------------------------ Figure 4
    bs4 = (0.1, 0.25, 0.75, 1.0)
    rows4 = []
    curves4 = {}
    for b in bs4:
        p, q = bernoulli_pair(P_BER, b)
        c = acceptance_curves(p, q, KS_BER, ("otm", "kseq"))
        curves4[b] = c
        for j, k in enumerate(KS_BER):
            rows4.append((b, k, float(c.values["otm"][j]), float(c.values["kseq"][j]), otspec.kseq_rho_star(p, q, k)))
    _write_csv(out / "spectr_fig4.csv", ["b", "k", "otm_alpha_k", "kseq_acceptance", "kseq_rho_star"], rows4)
    ax = plot_spectr_fig4(bs=bs4, ks=KS_BER)
    save_figure(ax.figure, out / "spectr_fig4.png", dpi=130)
    sec.figures.append("spectr_fig4.png")

    # closed form (eq. 10) vs the plotted OTM curve
    err10 = max(abs(r[2] - float(bernoulli_alpha_k(P_BER, r[0], r[1]))) for r in rows4)
    sec.rows.append(
        Row("Fig. 4: OTM-k curve vs eq. (10)", "eq. (10) closed form", f"max |diff| = {fmt_error(err10)}",
            "matches" if err10 <= TOL else "differs: see CSV")
    )
    c = curves4[0.25]
    one = max(np.max(np.abs(1 - c.values["otm"])), np.max(np.abs(1 - c.values["kseq"])))
    sec.rows.append(
        Row("Fig. 4, b = 0.25 (p = q)", "acceptance always one for both", f"max |1 - acc| = {fmt_error(one)}",
            "matches" if one <= TOL else "differs")
    )
    for b in (0.1, 0.75):
        c = curves4[b]
        gap = c.values["otm"] - c.values["kseq"]
        jmax = next(j for j, g in enumerate(gap) if g >= gap.max() - ROUNDOFF)
        mono = bool(np.all(np.diff(c.values["otm"]) >= -TOL) and np.all(np.diff(c.values["kseq"]) >= -TOL))
        reach = int(c.ks[np.argmax(c.values["otm"] >= 1 - TOL)]) if np.any(c.values["otm"] >= 1 - TOL) else None
        sec.rows.append(
            Row(
                f"Fig. 4, b = {b}",
                "both increase with k before reaching one; k-Seq worse than OTM-k",
                f"{fmt_argmax(gap, c.ks, what='gap', at='k')} (OTM {c.values['otm'][jmax]:.4f}, "
                f"k-Seq {c.values['kseq'][jmax]:.4f}); OTM reaches 1 at k = {reach}, k-Seq only in the limit "
                f"({c.values['kseq'][-1]:.4f} at k = {c.ks[-1]}); "
                f"non-decreasing: {mono}",
                "shape matches" if (gap.max() > 1e-3 and gap.min() >= -TOL and mono) else "differs: see CSV",
            )
        )
    c = curves4[1.0]
    same = float(np.max(np.abs(c.values["otm"] - c.values["kseq"])))
    sec.rows.append(
        Row("Fig. 4, b = 1", "the two algorithms have the same performance", f"max |OTM - k-Seq| = {fmt_error(same)}",
            "matches" if same <= TOL else "differs")
    )

    # ------------------------------------------------------------------ Figure 5 and B.2
    rows5 = []
    worst_cf = worst_ks = worst_rho = 0.0
    for dq in DQS:
        p, q = uniform_pair(D_UNIF, dq)
        c = acceptance_curves(p, q, KS_UNIF, ("otm", "kseq"))
        r = D_UNIF / dq
        for j, k in enumerate(KS_UNIF):
            cf = uniform_alpha_k(D_UNIF, dq, k)
            rho = otspec.kseq_rho_star(p, q, k)
            rho_paper = r * (1 - (1 - 1 / r) ** k)
            a, ks_ = float(c.values["otm"][j]), float(c.values["kseq"][j])
            rows5.append((dq, k, a, ks_, cf, rho, rho_paper))
            worst_cf = max(worst_cf, abs(a - cf))
            worst_ks = max(worst_ks, abs(a - ks_))
            worst_rho = max(worst_rho, abs(rho - rho_paper) / rho_paper)
    _write_csv(
        out / "spectr_fig5.csv",
        ["d_q", "k", "otm_alpha_k", "kseq_acceptance", "closed_form_1-(1-1/r)^k", "kseq_rho_star", "paper_rho_star_r(1-(1-1/r)^k)"],
        rows5,
    )
    ax = plot_spectr_fig5(d=D_UNIF, d_qs=DQS, ks=KS_UNIF)
    save_figure(ax.figure, out / "spectr_fig5.png", dpi=130)
    sec.figures.append("spectr_fig5.png")
    sec.rows.append(
        Row("Fig. 5: alpha_k(U(120), U(d_q)) vs App. B.1", "1 - (1 - 1/r)^k, r = 120/d_q", f"max |diff| = {fmt_error(worst_cf)}",
            "matches" if worst_cf <= TOL else "differs: see CSV")
    )
    mono5 = all(
        np.all(np.diff([r_[2] for r_ in rows5 if r_[0] == dq]) >= -TOL) for dq in DQS
    )
    last = {r_[0]: r_[2] for r_ in rows5 if r_[1] == KS_UNIF[-1]}
    sec.rows.append(
        Row(
            "Fig. 5: shape",
            "all curves increase monotonically and tend to one (Lemma 1)",
            f"non-decreasing: {mono5}; alpha_{KS_UNIF[-1]} = "
            + ", ".join(f"{last[dq]:.3f} (d_q={dq})" for dq in DQS),
            "shape matches" if mono5 else "differs",
        )
    )
    sec.rows.append(
        Row("App. B.2: k-Seq optimal on uniform pairs", "alpha(k-Seq at rho*) = alpha_k", f"max |diff| = {fmt_error(worst_ks)}",
            "matches" if worst_ks <= TOL else "differs: see CSV")
    )
    sec.rows.append(
        Row("App. B.2: rho* for uniform pairs", "rho* = r (1 - (1 - 1/r)^k)", f"max rel. diff = {fmt_error(worst_rho)}",
            "matches" if worst_rho <= TOL else "differs: see CSV")
    )

    # ------------------------------------------------------------------ Figure 6
    bs6 = (0.1, 0.75, 1.0)
    rows6 = []
    ordered = True
    for b in bs6 + (0.25,):
        p, q = bernoulli_pair(P_BER, b)
        c = acceptance_curves(p, q, KS_BER, ("otm", "kseq", "multiround"))
        o, s, m = c.values["otm"], c.values["kseq"], c.values["multiround"]
        for j, k in enumerate(KS_BER):
            rows6.append((b, k, float(o[j]), float(s[j]), float(m[j])))
        if b != 0.25:
            ordered &= bool(np.all(o >= s - TOL) and np.all(s >= m - TOL))
        if b == 0.25:
            all_one = float(max(np.max(np.abs(1 - o)), np.max(np.abs(1 - s)), np.max(np.abs(1 - m))))
    _write_csv(out / "spectr_fig6.csv", ["b", "k", "otm_alpha_k", "kseq_acceptance", "multiround_acceptance"], rows6)
    ax = plot_spectr_fig6(bs=bs6, ks=KS_BER)
    save_figure(ax.figure, out / "spectr_fig6.png", dpi=130)
    sec.figures.append("spectr_fig6.png")
    detail = []
    for b in bs6:
        sub = [r_ for r_ in rows6 if r_[0] == b]
        detail.append(f"b={b}: " + fmt_argmax([r_[3] - r_[4] for r_ in sub], [r_[1] for r_ in sub],
                                               what="k-Seq - multi-round gap", at="k"))
    sec.rows.append(
        Row(
            "Fig. 6 (App. B.3)",
            "OTM-k >= k-Seq >= multi-round (k-Seq outperforms multi-round on these examples)",
            f"ordered at every k: {ordered}; " + "; ".join(detail),
            "shape matches" if ordered else "differs: see CSV",
        )
    )
    sec.rows.append(
        Row("Fig. 6, b = 0.25", "all three accept with probability one (omitted from the plot)",
            f"max |1 - acc| = {fmt_error(all_one)}", "matches" if all_one <= TOL else "differs")
    )

    # ------------------------------------------------------------------ conference Figure 3
    rows3 = []
    vals3 = {}
    for k in KS_CONF:
        o = np.empty(BS_CONF.shape[0])
        for i, b in enumerate(BS_CONF):
            p, q = bernoulli_pair(P_BER, float(b))
            c = acceptance_curves(p, q, [k], ("otm", "kseq", "multiround"))
            o[i] = c.values["otm"][0]
            rows3.append((float(b), k, float(c.values["otm"][0]), float(c.values["kseq"][0]), float(c.values["multiround"][0])))
        vals3[k] = o
    _write_csv(out / "spectr_conf_fig3.csv", ["b", "k", "otm_alpha_k", "kseq_acceptance", "multiround_acceptance"], rows3)
    ax = plot_acceptance_vs_b(p=P_BER, ks=KS_CONF, bs=BS_CONF)
    save_figure(ax.figure, out / "spectr_conf_fig3.png", dpi=130)
    sec.figures.append("spectr_conf_fig3.png")
    ax = plot_acceptance_vs_b(p=P_BER, ks=(2, 4), bs=BS_CONF, methods=("otm", "kseq", "multiround"))
    ax.set_title(f"OTM-k, k-Seq, multi-round vs b; p = Ber({P_BER:g}) (extra)")
    save_figure(ax.figure, out / "spectr_conf_fig3_methods.png", dpi=130)
    sec.figures.append("spectr_conf_fig3_methods.png")
    frac8 = float(np.mean(vals3[8] >= 1 - TOL))
    frac1 = float(np.mean(vals3[1] >= 1 - TOL))
    tv = float(np.max(np.abs(vals3[1] - (1 - np.abs(BS_CONF - P_BER)))))
    sec.rows.append(
        Row(
            "conf. Fig. 3, k = 8",
            "for most values of q the acceptance probability is one",
            f"alpha_8 = 1 on {100 * frac8:.1f}% of the b grid (k = 1: {100 * frac1:.1f}%)",
            "shape matches" if frac8 > 0.8 else "differs",
        )
    )
    sec.rows.append(
        Row(
            "conf. Fig. 3, k = 1",
            "depends on how close p and q are: 1 - TV = 1 - |b - 0.25|",
            f"max |alpha_1 - (1 - |b - 0.25|)| = {fmt_error(tv)}",
            "matches" if tv <= TOL else "differs",
        )
    )

    # ------------------------------------------------------------------ Theorem 1 on random pairs
    rng = np.random.default_rng(2024)
    worst_ratio = np.inf
    worst_slack = np.inf
    n_cases = 300
    for _ in range(n_cases):
        n = int(rng.integers(2, 50))
        k = int(rng.integers(2, 16))
        p = rng.dirichlet(np.full(n, 0.5))
        q = rng.dirichlet(np.full(n, 0.5))
        a = float(otspec.alpha_k(p, q, k))
        acc = otspec.kseq(p, q, k).acceptance()
        if a > 0:
            worst_ratio = min(worst_ratio, acc / a)
            worst_slack = min(worst_slack, acc / a - lemma3_constant(k))
    # beyond the paper: rho* maximises p_acc, but the exact acceptance can be larger at rho > rho*
    rows_best = []
    gain_best = (0.0, None, None, None, None)
    for b in (0.1, 0.75):
        p, q = bernoulli_pair(P_BER, b)
        rmax = float(np.max(q[p > 0] / p[p > 0]))
        for k in KS_BER:
            rs = otspec.kseq_rho_star(p, q, k)
            grid = np.linspace(rs, max(rs, rmax) * 1.5, 601)
            accs = np.array([otspec.kseq(p, q, k, rho=float(r)).acceptance() for r in grid])
            # the smallest grid rho within 1e-12 of the best: where the acceptance is flat in rho (k = 1)
            # a plain argmax picks among rounding-level ties, which changes from run to run
            i = int(np.flatnonzero(accs >= accs.max() - 1e-12)[0])
            rows_best.append((b, k, rs, float(accs[0]), float(grid[i]), float(accs[i]),
                              float(otspec.alpha_k(p, q, k))))
            if accs[i] - accs[0] > gain_best[0]:
                gain_best = (float(accs[i] - accs[0]), b, k, float(grid[i]), float(accs[0]))
    _write_csv(out / "kseq_best_rho.csv",
               ["b", "k", "rho_star", "acceptance_at_rho_star", "best_rho_on_grid", "best_acceptance", "otm_alpha_k"],
               rows_best)
    g, bb, kk, rr, a0 = gain_best
    sec.rows.append(
        Row(
            "k-Seq: exact acceptance over rho >= rho* (Bernoulli b = 0.1, 0.75; 601-point grid)",
            "Theorem 1 picks rho* (largest p_acc = 1 - (1-beta)^k)",
            f"exact P(Y in S(X)) is larger above rho*: +{g:.4f} at b={bb}, k={kk} (rho={rr:.3f} vs "
            f"rho*; {a0:.4f} -> {a0 + g:.4f}); `kseq_best_rho.csv`",
            "beyond the paper: p_acc is only a lower bound on the exact acceptance for rho > rho*",
        )
    )

    # beyond the paper's Bernoulli examples: k-Seq against multi-round on random pairs
    worst_mr = -np.inf
    for _ in range(n_cases):
        n = int(rng.integers(2, 50))
        k = int(rng.integers(2, 16))
        p = rng.dirichlet(np.full(n, 0.5))
        q = rng.dirichlet(np.full(n, 0.5))
        worst_mr = max(worst_mr, otspec.multiround(p, q, k).acceptance() - otspec.kseq(p, q, k).acceptance())
    sec.rows.append(
        Row(
            f"App. B.3 beyond Bernoulli: {n_cases} Dirichlet(0.5) pairs (n < 50, 2 <= k < 16)",
            "k-Seq outperforms multi-round (shown on Bernoulli examples only)",
            f"max (multi-round - k-Seq) = {fmt_error(worst_mr)}",
            "matches (k-Seq >= multi-round on every pair)" if worst_mr <= TOL else "differs: multi-round wins on some pairs",
        )
    )
    sec.rows.append(
        Row(
            f"Theorem 1 on {n_cases} Dirichlet(0.5) pairs (n < 50, 2 <= k < 16)",
            "alpha(k-Seq) >= (1 - (1-1/k)^k) alpha_k >= (1 - 1/e) alpha_k",
            f"min alpha(k-Seq)/alpha_k = {worst_ratio:.4f}; min slack over the k-dependent bound = {worst_slack:.4f}",
            "matches" if worst_slack >= -TOL else "differs",
        )
    )
    return sec
