"""The union bound B* in ``experiments/repro_65_trees_real.py``: its bound on the shared laws is
``otspec.tree.bound(..., method="union")``, and the verdict "does the gap justify a better tree verifier?" follows
the stated rule (real only where the interval of B* - best rule lies above B*'s known slack plus the budget's
remainder; the interval's upper end is what any better verifier could add)."""

from __future__ import annotations

import pytest

from otspec.tree import TreeShape, bound
from tests.experiment import load_experiment

pytest.importorskip("torch")

EXACT = 1e-12


@pytest.fixture(scope="module")
def gaps():
    return load_experiment("repro_65_trees_real")


def test_union_bound_on_the_shared_laws_is_the_union_bound(gaps):
    import torch

    from otspec.decoding import CallableLM
    from otspec.tree._bound import _TreeAttentionLaws

    V = 9
    gen = torch.Generator().manual_seed(1)
    Wd = torch.randn(V, V, generator=gen, dtype=torch.float64)
    Wt = torch.randn(V, V, generator=gen, dtype=torch.float64)
    draft, target = CallableLM(lambda ids: Wd[ids], V), CallableLM(lambda ids: Wt[ids], V)
    ctx = [2, 4, 0]
    laws = gaps._ContextLaws(_TreeAttentionLaws(draft, target, ctx), {})
    for label, br, process, _vs in gaps.GAP_FAMILIES:
        shape = TreeShape.branching(*br)
        a = gaps._bound(shape, process, laws, "union")
        b = bound(shape, draft, target, process=process, prefix=ctx, budget=gaps.GAP_BUDGET, method="union")
        p = gaps._bound(shape, process, laws)
        assert a.method == "union" and a.n_expanded == b.n_expanded and a.pi_exact == b.pi_exact, label
        assert abs(a.value - b.value) <= EXACT, label
        assert a.value <= p.value


def _fam(process, gap_lo, gap_hi, remainder):
    est = {"value": 1.0, "lo": 0.9, "hi": 1.1, "positions": 8}
    g = {"value": (gap_lo + gap_hi) / 2, "lo": gap_lo, "hi": gap_hi, "positions": 8}
    ver = {"value": {"value": 1.3, "lo": 1.2, "hi": 1.4, "positions": 8}, "gap": dict(g, lo=gap_lo + 0.05),
           "share": est, "gap_union": g, "share_union": est}
    worse = dict(ver, value={"value": 1.0, "lo": 0.9, "hi": 1.1, "positions": 8})
    return {"bound": est, "bound_union": est, "union_pi_exact": False, "process": process, "remainder_mean": remainder,
            "remainder_max": remainder, "pi_exact": True, "budget": 256, "contexts": 8, "draws_per_context": 4,
            "verifiers": {"best": ver, "worst": worse}}


@pytest.mark.parametrize("process", ["iid", "wor"])
def test_the_verdict_is_decided_by_b_star_and_the_known_slack(gaps, process):
    slack = gaps.UNION_SLACK[process]
    rem = 0.02
    yes = gaps._justify_row(f"{process}:x", _fam(process, slack + rem + 0.01, 0.5, rem))
    assert yes.verdict.startswith("yes") and "0.500" in yes.verdict and "best" in yes.ours
    no = gaps._justify_row(f"{process}:x", _fam(process, slack + rem - 0.01, 0.5, rem))
    assert no.verdict.startswith("within the bound's slack") and "at most 0.500" in no.verdict
    # both bounds in the row's text
    assert "below B*" in no.ours and "below B)" in no.ours


def test_gap_rows_show_both_bounds_and_end_with_the_verdicts(gaps):
    res = {"bound_gaps": {"iid:branching(4,2)": _fam("iid", 0.1, 0.3, 0.01),
                          "wor:branching(4,2,2)": _fam("wor", 0.01, 0.3, 0.2)}}
    rows = gaps._gap_rows(res)
    assert len(rows) == 2 * (1 + 2) + 2
    assert "B 1.000 [0.900, 1.100], B* 1.000 [0.900, 1.100]" in rows[0].ours
    assert "gap to B*" in rows[1].ours and "share of B* reached" in rows[1].ours
    assert rows[-2].verdict.startswith("yes") and rows[-1].verdict.startswith("within")
    # a result written before B* (no union fields): the rows of B alone, the verdict by B
    old = _fam("iid", 0.1, 0.3, 0.01)
    del old["bound_union"]
    rows = gaps._gap_rows({"bound_gaps": {"iid:branching(4,2)": old}})
    assert "B*" not in rows[0].ours and "below B;" in rows[-1].ours


def test_union_slack_is_the_recorded_tables_largest_on_the_safe_side(gaps):
    """``UNION_SLACK`` is B* - OPT_c's largest value per process in results/trees/bound.csv, rounded up to 3
    decimals: a regenerated table that moves it fails here."""
    import csv
    from pathlib import Path

    table = Path(__file__).resolve().parents[1] / "results" / "trees" / "bound.csv"
    with table.open() as fh:
        rows = [r for r in csv.DictReader(fh) if r["process"] in ("iid", "wor")]
    for process in ("iid", "wor"):
        largest = max(float(r["bound_union"]) - float(r["opt_c"]) for r in rows if r["process"] == process)
        assert largest <= gaps.UNION_SLACK[process] < largest + 1e-3, process
