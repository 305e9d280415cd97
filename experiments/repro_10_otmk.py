"""Reproduction: OTM-k closed forms (SpecTr eq. 10, App. B.1) and the tightness of Lemma 3."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np
from _report import Row, Section, fmt_error, write_csv

import otspec
from otspec.closed_form import bernoulli_alpha_k, uniform_alpha_k

TITLE = "OTM-k: exact alpha_k, closed forms and Lemma 3"


def _uniform_pair(d_p, d_q):
    n = max(d_p, d_q)
    p = np.zeros(n)
    q = np.zeros(n)
    p[:d_p] = 1.0 / d_p
    q[:d_q] = 1.0 / d_q
    return p, q


def run(out: Path) -> Section:
    sec = Section(
        title=TITLE,
        source="SpecTr (arXiv:2310.15141 v2): eq. (4), eq. (9) / Lemma 3, eq. (10), Appendix B.1",
        notes=(
            "The paper prints formulas, not numbers, for these objects; each row compares the paper's "
            "formula (evaluated exactly in rationals) with otspec's sort-based `alpha_k` and the HiGHS LP. "
            "Tolerance for 'matches': 1e-12 against the exact rational value (1e-9 for the LP, its re-check tolerance)."
        ),
    )
    table = []
    for qb in (Fraction(1, 10), Fraction(3, 4)):
        for k in (1, 2, 4, 8):
            exact = bernoulli_alpha_k(Fraction(1, 4), qb, k)
            p = np.array([0.75, 0.25])
            q = np.array([1 - float(qb), float(qb)])
            ours = otspec.alpha_k(p, q, k)
            lp = otspec.otm_lp(p, q, k).alpha
            ok = abs(ours - float(exact)) <= 1e-12 and abs(lp - float(exact)) <= 1e-9
            table.append(("bernoulli", f"p=Ber(1/4), q=Ber({qb})", k, str(exact), float(exact), ours, lp))
            sec.rows.append(
                Row(
                    f"eq. (10), p=Ber(1/4), q=Ber({qb}), k={k}",
                    f"{exact} = {float(exact):.6f}",
                    f"{ours:.6f} (LP {lp:.6f})",
                    "matches" if ok else "differs: see CSV",
                )
            )
    for d_q in (10, 30, 60, 120):
        for k in (1, 2, 4, 8):
            exact = uniform_alpha_k(120, d_q, k, exact=True)
            p, q = _uniform_pair(120, d_q)
            ours = otspec.alpha_k(p, q, k)
            table.append(("uniform", f"p=U(120), q=U({d_q})", k, str(exact), float(exact), ours, float("nan")))
            if k in (2, 8):
                ok = abs(ours - float(exact)) <= 1e-12
                sec.rows.append(
                    Row(
                        f"App. B.1, p=U(120), q=U({d_q}), k={k}",
                        f"1-(1-1/r)^k = {float(exact):.6f}",
                        f"{ours:.6f}",
                        "matches" if ok else "differs: see CSV",
                    )
                )
    # Lemma 3 tightness and closed form vs LP on random instances
    rng = np.random.default_rng(2023)
    gap_ub = gap_lp = 0.0
    n_cases = 200
    for _ in range(n_cases):
        n = int(rng.integers(2, 5))
        k = int(rng.integers(1, 4))
        p = rng.dirichlet(np.full(n, 0.7))
        q = rng.dirichlet(np.full(n, 0.7))
        a = otspec.alpha_k(p, q, k)
        gap_ub = max(gap_ub, abs(otspec.alpha_k_upper_bound(p, q, k) - a))
        gap_lp = max(gap_lp, abs(otspec.otm_lp(p, q, k).alpha - a))
    sec.rows.append(
        Row(
            f"Lemma 3 upper bound vs alpha_k, {n_cases} random pairs (n<=4, k<=3)",
            "tight on the App. B examples (paper, §A.1)",
            f"max |bound - alpha_k| = {fmt_error(gap_ub)}",
            "matches (tight on every case; proved tight in docs/theory)" if gap_ub <= 1e-12 else "differs",
        )
    )
    sec.rows.append(
        Row(
            f"closed form vs LP (eq. 4), same {n_cases} pairs",
            "LP optimum",
            f"max |exact - LP| = {fmt_error(gap_lp)}",
            "matches" if gap_lp <= 1e-9 else "differs",
        )
    )
    write_csv(
        out / "otmk_closed_forms.csv",
        ["family", "pair", "k", "paper_formula_exact", "paper_formula_float", "otspec_alpha_k", "otspec_lp"],
        table,
    )
    sec.notes += "\n\nValues: `otmk_closed_forms.csv`."
    return sec
