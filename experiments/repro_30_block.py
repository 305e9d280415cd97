"""Block verification (Optimal Block-Level Draft Verification): Figure 2, Theorems 1-2, Tables 2-4 shape.

Every value is computed by otspec's exact functions: expected lengths by
enumeration of the draft block (``otspec.block.expected_length``), Sun et al.'s (arXiv:2403.10444)
closed forms (``theorem1_length``, ``theorem2_length``, the Bernoulli sums),
the block OT LP (``ot_optimum``, HiGHS) and the lossless check
(``check_lossless``). Counting convention: E[tau] = accepted draft tokens;
Sun et al.'s (arXiv:2403.10444) Bernoulli sums start at i = 0 and so count E[tau] + 1 (tokens per
iteration, the correction/bonus token included); Figure 2 is drawn in the
arXiv:2403.10444's convention and the CSV gives both.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _report import Row, Section, fmt, fmt_error, save_figure, write_csv  # noqa: E402

TITLE = "Block verification: token vs block, exact over whole draft blocks"

PAPER = (
    "Sun, Ro, Beirami, Suresh, \"Optimal Block-Level Draft Verification for Accelerating Speculative Decoding\", "
    "arXiv:2403.10444 v1"
)
NAMES = ("token", "block-onestep", "block")


def _figure2(out: Path, sec: Section) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from otspec.block import bernoulli_block_length, bernoulli_token_length
    from otspec.plotting.block import figure2_data, plot_figure2

    q, ps, L_max = 0.75, (0.25, 0.5, 0.6), 12
    d = figure2_data(q, ps, L_max)
    fig, ax = plt.subplots(figsize=(7.2, 5.0))
    plot_figure2(data=d, ax=ax, include_bonus=True)
    sec.figures.append(save_figure(fig, out / "block_figure2.png", dpi=130))

    csv_rows = []
    closed_err = 0.0
    for i, p in enumerate(d.ps):
        for j, L in enumerate(d.Ls):
            for n in NAMES:
                v = float(d.lengths[n][i, j])
                if n == "token":
                    cf = bernoulli_token_length(p, q, int(L))
                elif n == "block":
                    cf = bernoulli_block_length(p, q, int(L))
                else:
                    cf = float("nan")  # no closed form printed for the one-step variant
                if not np.isnan(cf):
                    closed_err = max(closed_err, abs(cf - v))
                csv_rows.append([q, f"{p:g}", int(L), n, v, v + 1.0, cf])
    write_csv(
        out / "block_figure2.csv",
        ["q", "p", "L", "verifier", "E_tau_accepted_draft_tokens", "E_tau_plus_1_tokens_per_target_call", "closed_form_E_tau"],
        csv_rows,
    )

    tok, one, blk = (d.lengths[n] for n in NAMES)
    gaps = blk - tok
    grows = bool(np.all(np.diff(gaps, axis=1) > 0))
    strict = bool(np.all(gaps[:, 1:] > 0)) and bool(np.allclose(gaps[:, 0], 0.0, atol=1e-15))
    ordered = bool(np.all(tok <= one + 1e-12) and np.all(one <= blk + 1e-12))
    sec.rows.append(Row(
        "Fig. 2 closed forms (sums from i=0 minus 1) vs enumeration, q=0.75, p in {0.25,0.5,0.6}, L<=12",
        "Σ(1-TV)^i (token), Σ(1-TV(Bin)) (block)",
        f"max |diff| = {fmt_error(closed_err)}",
        "matches" if closed_err < 1e-12 else "differs: closed form and enumeration disagree",
    ))
    sec.rows.append(Row(
        "Fig. 2 shape: block > token for p != q, gap grows with L",
        "strict improvement for p != q; gap increases with L",
        f"strict for L>=2: {strict}; gap increasing: {grows}; token <= one-step <= block: {ordered}",
        "shape matches" if (grows and strict and ordered) else "differs: see CSV",
    ))
    j = int(np.flatnonzero(d.Ls == 8)[0])
    for i, p in enumerate(d.ps):
        sec.rows.append(Row(
            f"Fig. 2 value, p={p:g}, L=8: E[τ]+1 token / one-step / block",
            "curves only (no printed values)",
            f"{fmt(tok[i, j] + 1)} / {fmt(one[i, j] + 1)} / {fmt(blk[i, j] + 1)}",
            "reported: the paper shows curves only",
        ))


def _toy_anchor(sec: Section) -> None:
    from otspec.block import check_lossless, expected_length, ot_optimum
    from otspec.models import MemorylessModel

    s, b = MemorylessModel([2 / 3, 1 / 3]), MemorylessModel([1 / 3, 2 / 3])
    got = [expected_length(s, b, 2, n) for n in NAMES]
    lp = ot_optimum(s, b, 2).value
    err = max(abs(g - e) for g, e in zip(got, (10 / 9, 11 / 9, 12 / 9)))
    sec.rows.append(Row(
        "Toy anchor: draft (2/3,1/3), target (1/3,2/3), L=2; E[τ] token / one-step / block (LP)",
        "10/9 / 11/9 / 12/9 (by hand; docs/guide/block.rst)",
        f"{got[0] * 9:.12f}/9 / {got[1] * 9:.12f}/9 / {got[2] * 9:.12f}/9 (LP {lp * 9:.9f}/9)",
        "matches" if err < 1e-14 and abs(lp - 12 / 9) < 1e-9 else "differs",
    ))
    lossless = max(check_lossless(s, b, 2, n).max_error for n in NAMES)
    sec.rows.append(Row(
        "Toy anchor: output law (L+1 tokens) vs target joint law, all three verifiers",
        "lossless (Lemma 2)",
        f"max error {fmt_error(lossless)}",
        "matches" if lossless < 1e-12 else "differs",
    ))


def _theorems(sec: Section) -> None:
    from otspec.block import (
        check_lossless,
        expected_length,
        ot_optimum,
        theorem1_length,
        theorem2_length,
    )
    from otspec.models import random_markov_model, random_table_model

    rng = np.random.default_rng(2024)
    t1_err = t2_err = lp_err = loss = 0.0
    order_ok = True
    n_cases = n_lp = 0
    for case in range(60):
        V = int(rng.integers(2, 5))
        L = int(rng.integers(1, 5 if V <= 3 else 4))
        c = float(rng.choice([0.1, 0.5, 1.0, 5.0]))
        if case % 2:
            s = random_table_model(V, L + 1, concentration=c, rng=rng)
            b = random_table_model(V, L + 1, concentration=c, rng=rng)
        else:
            s = random_markov_model(V, int(rng.integers(0, 3)), concentration=c, rng=rng)
            b = random_markov_model(V, int(rng.integers(0, 3)), concentration=c, rng=rng)
        lens = [expected_length(s, b, L, n) for n in NAMES]
        t1_err = max(t1_err, abs(lens[2] - theorem1_length(s, b, L)))
        t2_err = max(t2_err, abs(lens[0] - theorem2_length(s, b, L)))
        order_ok &= lens[0] <= lens[1] + 1e-12 <= lens[2] + 2e-12
        loss = max(loss, max(check_lossless(s, b, L, n).max_error for n in NAMES))
        n_cases += 1
        if V ** (2 * L) <= 5000:
            res = ot_optimum(s, b, L)
            lp_err = max(lp_err, abs(res.value - lens[2]))
            n_lp += 1
    sec.rows.append(Row(
        f"Theorem 1: E[τ] of BlockVerify (enumeration) vs Σ_ℓ Σ min(M_s, M_b) ({n_cases} random tables/Markov, V<=4, L<=4)",
        "equal (eq. 6)", f"max |diff| = {fmt_error(t1_err)}", "matches" if t1_err < 1e-12 else "differs"))
    sec.rows.append(Row(
        "Theorem 2: E[τ] of TokenVerify (enumeration) vs Σ_ℓ Σ Π min(conditionals)",
        "equal (eq. 7)", f"max |diff| = {fmt_error(t2_err)}", "matches" if t2_err < 1e-12 else "differs"))
    sec.rows.append(Row(
        f"Theorem 1 optimality: block OT LP (HiGHS, {n_lp} cases with V^(2L) <= 5000) vs BlockVerify",
        "BlockVerify attains the LP optimum", f"max |diff| = {fmt_error(lp_err)}",
        "matches" if lp_err < 1e-9 else "differs"))
    sec.rows.append(Row(
        "Ordering token <= one-step <= block; lossless output law (L+1 tokens) for all three",
        "Lemma 2 (lossless); block optimal",
        f"ordering holds: {order_ok}; max law error {fmt_error(loss)}",
        "matches" if order_ok and loss < 1e-12 else "differs"))


def _tables_shape(out: Path, sec: Section) -> None:
    """Tables 2-4 are LLM measurements; here the same statistic on synthetic Markov pairs."""
    from otspec.block import expected_length
    from otspec.models import MarkovModel, random_markov_model

    rng = np.random.default_rng(7)
    V, eps, reps = 4, 0.35, 4
    rows = []
    for rep in range(reps):
        b = random_markov_model(V, 1, concentration=0.3, rng=rng)
        nz = random_markov_model(V, 1, concentration=0.3, rng=rng)
        s = MarkovModel((1 - eps) * b.transition + eps * nz.transition,
                        initial=[(1 - eps) * b.initial[0] + eps * nz.initial[0]])
        for L in (4, 6, 8):
            e = {n: expected_length(s, b, L, n, include_bonus=True) for n in NAMES}
            rows.append((rep, L, e["token"], e["block-onestep"], e["block"]))
    arr = np.array(rows)
    write_csv(
        out / "block_tables_synthetic.csv",
        ["pair", "L", "block_efficiency_token", "block_efficiency_onestep", "block_efficiency_block_v1"],
        [[int(r[0]), int(r[1])] + [float(x) for x in r[2:]] for r in rows],
    )
    paper = {4: "+0.17..+0.78 %", 6: "+0.89..+1.93 %", 8: "+1.48..+2.83 %"}
    gains = {}
    for L in (4, 6, 8):
        m = arr[arr[:, 1] == L]
        g1 = 100 * np.mean(m[:, 3] / m[:, 2] - 1)
        g2 = 100 * np.mean(m[:, 4] / m[:, 2] - 1)
        gains[L] = g1
        sec.rows.append(Row(
            f"Tables 3/4/2 analogue, L={L}: block-efficiency gain over TokenVerify "
            f"(synthetic V={V} Markov pairs, token efficiency {np.mean(m[:, 2]):.2f})",
            f"{paper[L]} (7 LLM datasets)",
            f"one-step +{g1:.2f} %, v1 +{g2:.2f} %",
            "differs: synthetic V=4 sources, not the paper's LLMs (only the sign and growth with L compare)",
        ))
    grows = gains[4] < gains[6] < gains[8] and gains[4] > 0
    sec.rows.append(Row(
        "Tables 2-4 shape: gain positive and growing with L",
        "positive, grows from L=4 to L=8",
        f"one-step gains {gains[4]:.2f} < {gains[6]:.2f} < {gains[8]:.2f} %",
        "shape matches" if grows else "differs: gain does not grow with L here",
    ))


def run(out: Path) -> Section:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    sec = Section(
        title=TITLE,
        source=f"{PAPER}: Theorems 1-2, Algorithms 2-3, Figure 2, Tables 2-4; docs/guide/block.rst",
        notes=(
            "Counts: E[τ] is the number of accepted draft tokens; Sun et al.'s (arXiv:2403.10444) Bernoulli sums start at "
            "i = 0 and count E[τ] + 1 (tokens per iteration, the correction/bonus token included). "
            "Figure 2 is drawn in Sun et al.'s (arXiv:2403.10444) convention (E[τ] + 1); `block_figure2.csv` gives both. "
            "Verifiers: TokenVerify (Alg. 2), one-step BlockVerify (published variant, one correction "
            "token), v1 BlockVerify (Alg. 3 with multi-token residual; attains the block-OT optimum). "
            "The paper does not list Figure 2's p values; we use p = 0.25, 0.5, 0.6 with q = 0.75."
        ),
    )
    _toy_anchor(sec)
    _theorems(sec)
    _figure2(out, sec)
    _tables_shape(out, sec)
    return sec


if __name__ == "__main__":  # pragma: no cover
    o = Path(sys.argv[1] if len(sys.argv) > 1 else "results")
    print(run(o).to_markdown())
