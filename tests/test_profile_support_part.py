"""A subsampled position's support read with its other values (otspec.profile._quantities.support_part).

The host copy of a position's laws for the verifiers built per node (:attr:`otspec.profile._quantities.Builds.host`)
is restricted to the tokens with mass (:func:`otspec.profile._quantities.support_to_host`): the columns used to
take one host read of their own, and now come with the position's batched quantities, gathered on the device to a
fixed width; when ties keep more tokens than that width the old read is the fallback. Every value stays bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from otspec.profile._quantities import (  # noqa: E402
    Builds,
    depth_quantities,
    drop_null_columns,
    expected_accepted,
    needs_host,
    read_parts,
    support_part,
    support_to_host,
    support_width,
)
from otspec.profile._settings import ProfileSettings  # noqa: E402


def _laws(seed: int, k: int, L: int, V: int, keep: int | None):
    """Random ``(k, L, V)`` and ``(k, L + 1, V)`` float64 laws, each row on ``keep`` random tokens (all: None)."""
    rng = np.random.default_rng(seed)

    def rows(n):
        w = rng.random((n, V)) + 0.01
        if keep is not None:
            for r in range(n):
                w[r, rng.permutation(V)[keep:]] = 0.0
        return w / w.sum(axis=1, keepdims=True)

    return rows(k * L).reshape(k, L, V), rows(k * (L + 1)).reshape(k, L + 1, V)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("keep,width", [(2, None), (1, None), (None, None), (3, 5), (2, 40)])
def test_the_support_read_in_advance_gives_the_host_copy_bit_for_bit(seed, keep, width):
    # numpy's drop_null_columns is the independent route; the two-read route of support_to_host the old one
    k, L, V = 3, 2, 40
    P, Q = _laws(seed, k, L, V, keep)
    X = np.stack([[int(np.flatnonzero(P[r, j])[0]) for j in range(L)] for r in range(k)])
    Pt, Qt = torch.from_numpy(P.copy()), torch.from_numpy(Q.copy())
    b = Builds(X, Pt, Qt, {})
    w = support_width(keep, Pt, Qt) if width is None else width
    n = int(((P > 0).reshape(-1, V).any(0) | (Q > 0).reshape(-1, V).any(0)).sum())
    read_parts([support_part(b, w)])
    assert (b._cols is not None) == (n <= w)  # more tokens than the width: nothing kept (the fallback reads them)
    got = b.host
    old = support_to_host(Pt, Qt, X)
    ref = drop_null_columns(P, Q, X)
    for a, o, r in zip(got, old, ref):
        assert a.dtype == o.dtype == r.dtype and a.shape == o.shape == r.shape
        assert np.array_equal(a, o) and np.array_equal(a, r)
    assert torch.equal(Pt, torch.from_numpy(P)) and torch.equal(Qt, torch.from_numpy(Q))  # inputs untouched


def test_the_width_is_top_k_times_the_rows_at_most_the_vocabulary():
    P, Q = torch.zeros(4, 3, 100, dtype=torch.float64), torch.zeros(4, 4, 100, dtype=torch.float64)
    assert support_width(None, P, Q) == 100
    assert support_width(2, P, Q) == 2 * (12 + 16)
    assert support_width(5, P, Q) == 100


VERIFIERS = ("token", "kseq", "multiround", "optimal", "lp", "greedy-drafts", "top-k", "khisti", "typical",
             "without-replacement")
FAMILIES = ("token", "kseq", "multiround", "optimal", "khisti", "typical", "block", "block-onestep")


@pytest.mark.parametrize("kind,name", [("acc", n) for n in VERIFIERS] + [("tau", n) for n in FAMILIES])
def test_needs_host_names_the_quantities_that_make_the_host_copy(kind, name):
    # the rule is a guess about what the quantities do; here it is checked against what they do: the host copy
    # made (Builds._host) exactly when needs_host says so
    k_max, L, V = 2, 2, 12
    s = ProfileSettings(k_max=k_max, L_max=L, max_new_tokens=1, verifiers=["token"], families=["token"])
    P, Q = _laws(0, k_max, L, V, 4)
    X = np.stack([[int(np.flatnonzero(P[r, j])[0]) for j in range(L)] for r in range(k_max)])
    b = Builds(X, torch.from_numpy(P), torch.from_numpy(Q), {})
    if kind == "acc":
        depth_quantities(name, s.ks(name), b, L)
        rule = needs_host([name], [], s.ks, {}, k_max)
    else:
        for k in s.ks(name):
            expected_accepted(name, k, b, L)
        rule = needs_host([], [name], s.ks, {}, k_max)
    assert rule == (b._host is not None)
