r"""The one pass of the exponential race: uncovered mass of every prefix at a set of log-time nodes.

For tokens ``p`` in prefix order, nodes :math:`t_m` (ascending) and draft
counts ``ks``, one pass adds to ``out[j, l]``

.. math::

    \sum_m P\big(N_j(t_m) < k_l\big)\; c_j t_m\, e^{-c_j t_m},

with :math:`N_j(t)` the number of the first ``j`` tokens arrived by ``t``
(token ``x`` arrives at :math:`E_x / p(x)`, :math:`E_x \sim \mathrm{Exp}(1)`)
and :math:`c_j` the mass after them. The count law is a truncated
Poisson-binomial recursion, one token at a time; each update is written as
``s[i] += (s[i-1] - s[i]) * move`` with ``move = 1 - exp(-p t)``, so its
rounding is relative to the small correction, not to the state (no
systematic drift over tens of thousands of equal masses). A node whose
:math:`P(N_j < \max k)` falls below ``DEAD`` stays below it for every later
prefix (the count only grows), so it leaves the pass.

Plain Python on scalars, compiled by numba when installed (the ``fast``
extra); without numba the same pass runs vectorised over the nodes with
numpy (:func:`race_pass_np`). Both give the same values up to the last bits
of ``exp``/``expm1``.
"""

from __future__ import annotations

import math

import numpy as np

from .._jit import compile_in

#: A node whose P(N < max k) is below this is dropped (its terms are below DEAD * weight).
DEAD = 1e-30
#: ``1 - exp(-x)`` rounds to 1 in float64 beyond this.
_SURE = 37.5
#: Below this, ``1 - exp(-x)`` by its Taylor polynomial (relative error < 1e-20).
_SMALL = 1e-4


def _move(x):
    """``1 - exp(-x)`` for ``x >= 0`` (the chance a token of mass ``p`` has arrived by ``t``, ``x = p t``)."""
    if x < _SMALL:
        return x * (1.0 - 0.5 * x * (1.0 - x / 3.0 * (1.0 - 0.25 * x)))
    if x > _SURE:
        return 1.0
    return -math.expm1(-x)


def race_pass(p, c, t, ks, rows, j_stop, coarse, cut, out_all, out_coarse):
    """Add the node sums of prefixes ``j < j_stop`` with ``rows[j]`` to ``out_all`` (and coarse nodes to ``out_coarse``).

    ``c[j]`` is the mass after the first ``j`` tokens; nodes with
    ``c[j] t > cut`` are skipped for prefix ``j`` (weight below
    ``cut * exp(-cut)``). :math:`P(N < k)` is summed from the count law at
    each use (a running difference would lose its relative accuracy where
    it is small). Returns the number of (token, node) updates done.
    """
    n = p.shape[0]
    M = t.shape[0]
    L = ks.shape[0]
    K = ks[L - 1]
    st = np.zeros((M, K))
    for m in range(M):
        st[m, 0] = 1.0
    hi = M
    work = 0
    for j in range(j_stop):
        if rows[j]:
            cj = c[j]
            for m in range(hi):
                y = cj * t[m]
                if y > cut:
                    break
                w = y * math.exp(-y)
                acc = 0.0
                l = 0
                for i in range(K):
                    acc += st[m, i]
                    while l < L and ks[l] == i + 1:
                        out_all[j, l] += acc * w
                        if coarse[m]:
                            out_coarse[j, l] += acc * w
                        l += 1
        if j < n and p[j] > 0.0:
            pj = p[j]
            for m in range(hi):
                mv = _move(pj * t[m])
                for i in range(K - 1, 0, -1):
                    st[m, i] += (st[m, i - 1] - st[m, i]) * mv
                st[m, 0] -= st[m, 0] * mv
            work += hi
            while hi > 0:
                s = 0.0
                for i in range(K):
                    s += st[hi - 1, i]
                if s >= DEAD:
                    break
                hi -= 1
    return work


def race_pass_np(p, c, t, ks, rows, j_stop, coarse, cut, out_all, out_coarse, chunk=128):
    """:func:`race_pass` vectorised over the nodes with numpy (the route without numba), ``chunk`` tokens at a time."""
    n = p.shape[0]
    M = t.shape[0]
    L = ks.shape[0]
    K = int(ks[-1])
    st = np.zeros((K, M))  # st[i, m] = P(N = i) at node m
    st[0] = 1.0
    hi = M
    work = 0
    buf = np.zeros((chunk, L, M))
    tmp = np.empty((max(K - 1, 1), M))
    for j0 in range(0, j_stop, chunk):
        j1 = min(j0 + chunk, j_stop)
        hi0 = hi
        mv = -np.expm1(-np.outer(p[j0:min(j1, n)], t[:hi0]))
        for j in range(j0, j1):
            b = j - j0
            if rows[j]:
                for l in range(L):
                    np.sum(st[: ks[l], :hi0], axis=0, out=buf[b, l, :hi0])
            if j < n and p[j] > 0.0:
                s = st[:, :hi0]
                if K > 1:
                    d = tmp[:, :hi0]
                    np.subtract(s[:-1], s[1:], out=d)
                    d *= mv[b]
                    s[1:] += d
                s[0] -= s[0] * mv[b]
                work += hi0
        alive = np.flatnonzero(st[:, :hi0].sum(axis=0) >= DEAD)
        hi = int(alive[-1]) + 1 if alive.size else 0
        sel = np.flatnonzero(rows[j0:j1])
        if sel.size:
            y = c[j0 + sel, None] * t[None, :hi0]
            w = np.where(y <= cut, y * np.exp(-np.minimum(y, cut)), 0.0)
            out_all[j0 + sel] += np.einsum("bm,blm->bl", w, buf[sel, :, :hi0])
            if coarse[:hi0].any():
                cm = coarse[:hi0]
                out_coarse[j0 + sel] += np.einsum("bm,blm->bl", w[:, cm], buf[sel, :, :hi0][:, :, cm])
    return work


#: The plain-Python pass (scalar loops; slow, the compiled one's source).
race_pass_py = race_pass
#: Whether the pass is compiled by numba (the ``fast`` extra); otherwise the numpy pass runs.
JIT = compile_in(globals(), ("_move", "race_pass"))
if not JIT:  # pragma: no cover
    race_pass = race_pass_np
