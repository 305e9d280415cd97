"""Speed-ups made for the default suite's time, pinned against the code they replace.

Khisti et al.'s selection (arXiv:2410.18234, canonical decomposition; :func:`otspec.khisti_verifier`) spreads each
set's unmatched mass over its tokens set by set in a Python loop (about 40% of a ``k = 3`` build on 48 tokens,
19,600 sets); it is now done for the sets of one size at once. The loop is kept here as the reference: the rows,
the sets and every value derived from them must be the same bits. The layering check's walk for function-level
imports (tests/test_layering.py) is now one walk of each tree: it must still find imports nested in methods and in
functions inside functions.
"""

from __future__ import annotations

import numpy as np
import pytest

from otspec import khisti_verifier
from otspec.multidraft._khisti import _spread_leftover
from otspec.otm._lp import membership_plan, set_weights


def _loop(select, sets_c, canon, w, q):
    """The per-set loop of khisti_verifier before (main at 614621c), verbatim but for its names."""
    sets = [tuple(sorted(canon[list(a)].tolist())) for a in sets_c]
    for i, s in enumerate(sets):
        left = max(w[i] - select[i].sum(), 0.0)
        members = list(s)
        share = q[members] if q[members].sum() > 0 else np.ones(len(members))
        select[i, members] += left * share / share.sum()
        tot = select[i].sum()
        if tot > 0:
            select[i] /= tot
        else:
            select[i, members[0]] = 1.0
    return sets


def _laws(seed: int):
    r = np.random.default_rng(seed)
    n = int(r.integers(2, 13))
    p, q = r.dirichlet(np.full(n, 0.4)), r.dirichlet(np.full(n, 0.4))
    kind = seed % 5
    if kind == 1:
        q[: n // 2] = 0.0  # q zero on whole sets: the even spread
    elif kind == 2:
        p[-1] = 0.0
    elif kind == 3:
        q = p.copy()
    elif kind == 4:
        q = np.roll(p, 1)
    return p / p.sum(), q / q.sum()


@pytest.mark.parametrize("seed", range(25))
def test_khisti_selection_is_the_loop_s_bit_for_bit(seed):
    p, q = _laws(seed)
    for k in (1, 2, 3, 5):
        canon = np.lexsort((q, p))
        sets_c, w = set_weights(p[canon], k)
        _, _, matched_c = membership_plan(sets_c, w, q[canon])
        want = np.empty_like(matched_c)
        want[:, canon] = matched_c
        got = want.copy()
        want_sets = _loop(want, sets_c, canon, w, q)
        assert _spread_leftover(got, sets_c, canon, w, q) == want_sets
        assert got.tobytes() == want.tobytes(), (seed, k)
        v = khisti_verifier(p, q, k)
        assert v._select.tobytes() == want.tobytes() and list(v._index) == want_sets


def test_the_rows_of_total_zero_and_big_sets_are_the_loop_s():
    # rows of total 0 (weight 0, nothing matched: the smallest token selected), sets of every size from 1 to 12
    # (sums of 8 entries and more: numpy's pairwise sum on a row, as on the loop's row), q zero on some sets
    r = np.random.default_rng(5)
    n = 14
    canon = r.permutation(n)
    sets_c = [tuple(sorted(r.choice(n, m, replace=False).tolist())) for m in list(range(1, 13)) * 6]
    w = r.dirichlet(np.ones(len(sets_c)))
    w[::5] = 0.0
    q = r.dirichlet(np.ones(n))
    q[:4] = 0.0
    select = r.random((len(sets_c), n)) * (r.random((len(sets_c), n)) < 0.5) * 1e-3
    select[::5] = 0.0
    want, got = select.copy(), select.copy()
    want_sets = _loop(want, sets_c, canon, w, q)
    assert _spread_leftover(got, sets_c, canon, w, q) == want_sets
    assert got.tobytes() == want.tobytes()
    assert (got[::5].max(axis=1) == 1.0).all()  # the zero rows took the branch


def test_a_changed_spread_is_seen():
    # the comparison above can fail: the unmatched mass spread evenly instead of by q changes the bits
    p, q = _laws(0)
    canon = np.lexsort((q, p))
    sets_c, w = set_weights(p[canon], 3)
    _, _, matched_c = membership_plan(sets_c, w, q[canon])
    base = np.empty_like(matched_c)
    base[:, canon] = matched_c
    want, got = base.copy(), base.copy()
    _loop(want, sets_c, canon, w, q)
    _spread_leftover(got, sets_c, canon, w, np.ones_like(q))
    assert got.tobytes() != want.tobytes()


def test_layering_finds_imports_nested_in_methods_and_functions(tmp_path):
    from tests.test_layering import _function_level_imports

    f = tmp_path / "m.py"
    f.write_text("from . import top\n"
                 "class C:\n    def m(self):\n        import otspec.x\n        return 1\n"
                 "def f():\n    def g():\n        from .y import z\n        return z\n    return g\n"
                 "async def h():\n    from otspec import w\n    import numpy\n"
                 "def k():\n    if True:\n        try:\n            import otspec.v\n        finally:\n            pass\n")
    assert _function_level_imports({"otspec.m": (f, False)}) == ["otspec.m:12", "otspec.m:17", "otspec.m:4",
                                                                 "otspec.m:8"]
