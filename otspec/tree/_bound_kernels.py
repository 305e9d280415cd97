r"""Fused kernels of :func:`otspec.tree.bound` on the host: one pass per law row instead of dozens of whole-array passes.

The row kernels, one call per expanded prefix, each reading the prefix's draft and target rows where they are
(no stacked copy of a frontier):

* :func:`iid_row`: the i.i.d. recursion
  :math:`f(v) = 1 - \prod_c (1 - p\, f(c))` for every child token (the
  slots' classes given as a flat program, :func:`iid_program`,
  :data:`BLOCK` columns at a time, :func:`iid_block`), the minimum with the
  target's path probability and every row sum the bound needs (the exact
  level, the caps of the lower depths), over :data:`BLOCK` lanes
  (:func:`lane_total`); the sums alone (the last expanded depth) by
  :func:`iid_row_sums`, :math:`\pi` only where a lower bound leaves the
  minimum open;
* :func:`wor_row_stats`: what the draws without replacement need of a draft
  row, from one read of it (the support, the most likely tokens, the second
  draw's sums, the exponential race's power sums of the tail,
  :func:`race_moments_row`);
* :func:`wor_row_decide`: a row of the last expanded depth up to the race
  in one call: :func:`wor_row_last` (the entries a lower bound on
  :math:`\pi` decides, the draft's head and second draw's sums in the same
  pass), then, with entries left, :func:`wor_row_recheck` and, with entries
  still left, the race's power sums (:func:`wor_row_sums`);
* :func:`wor_row`: the laws of the draws of every used rank (rank 0
  :math:`p`, rank 1 the closed form, ranks :math:`r \ge 2` the exact law of
  the exponential race, their Taylor coefficients combined by the slots'
  weights before the sum) combined into :math:`\pi` and the expected slot
  counts, the minimum with the target's path probability and the row sums;
* :func:`rest_row`: a row with candidates above the last expanded depth, once
  they are chosen: the caps of the lower depths summed over the children that
  are not candidates (what the bound adds for them, with no subtraction).

The block kernels (a frontier's ``(m, V)`` block): :func:`iid_pi_kernel`,
:func:`second_draw_t` and :func:`wor_pi_kernel` (ranks :math:`r \ge 2` also
by the stated upper bound in a row the race refused), for the block route
(rows enumerated or refused by the race, the bounded draws, the paths of
:func:`otspec.tree._bound._root_path_probability`); :func:`race_moments` and
:func:`race_rows`, the race's work per row (the quadrature in :math:`\log t`
for the head's laws and the tail's Taylor coefficients), shared by every
route; :func:`race_rows_weighted` the same with the ranks' laws combined by
slot weights inside the quadrature (the last expanded depth).

Plain Python on scalars, compiled by numba when installed (the ``fast`` extra,
:data:`JIT`). The entries (:math:`\pi`, the minima) are the vectorised numpy
route's operations in its order (IEEE arithmetic, no contraction into fused
multiply-adds): bit for bit for i.i.d. children; without replacement the row
kernels combine the ranks' race laws before the sum (within a relative 1e-12).
The row sums are summed over lanes (numpy: pairwise), within about 1e-13.
"""

from __future__ import annotations

import numpy as np

from .._jit import compile_in

#: Columns of a row evaluated together (buffers that stay in the L1 cache; the loops over them vectorise).
BLOCK = 256
#: The draft probability at which the row kernels take the slope of a concave lower bound on pi (entries above it
#: get pi itself).
SLOPE_AT = 1e-3
#: The least value of the lower bound :math:`c \min(p_x, S)` at which :func:`iid_row_sums` decides an entry by it
#: (below it only a zero target is decided): above it every rounding of :math:`\pi_x`'s evaluation is relative up to
#: an underflow's absolute error (2**-1074 an operation), which the margin 1e-12 covers with room to spare.
DECIDE_FROM = 2.0**-900
#: Whole blocks whose power sums :func:`wor_row_sums` forms in one sweep (:func:`moments_group`).
GROUP = 4
#: Columns of a group that :func:`moments_group` gathers large tokens from only where one of them is large (a
#: divisor of ``GROUP * BLOCK``); likewise the columns of a block that :func:`head_insert` and
#: :func:`wor_row_last` walk one by one only where a vectorised count found an entry to take.
CHUNK = 64
#: Taylor terms of the race's tail evaluated for a whole block (an entry that needs more continues on its own).
DCAP = 4


#: The bit patterns (as int64) of the smallest normal double and of ``+inf``
#: (:data:`otspec._validation_kernel.TINY_BITS`, :data:`otspec._validation_kernel.INF_BITS`): an entry whose pattern
#: is 0 (``+0.0``) or in ``[TINY_BITS, INF_BITS)`` passes a law's check in place; every other one does not.
TINY_BITS = int(np.array(np.finfo(np.float64).tiny).view(np.int64))
INF_BITS = int(np.array(np.inf).view(np.int64))
#: The length of a row check's buffer (:func:`check_scratch`): the lanes of the two totals and of the bad entries'
#: count, then the two results.
CHECK_LEN = 3 * BLOCK + 2


def union_block(a, n, b, r, h, out):
    """``out[:b]`` = :math:`1 - (1 - a)^n` for ``a[:b]`` by Horner's rule, positive terms only (as
    :func:`otspec.tree._bound._union`, the same operations, up to four steps per sweep of the block); ``r``,
    ``h`` scratch."""
    if n == 1:
        for v in range(b):
            out[v] = a[v] * 1.0
        return
    for v in range(b):
        r[v] = 1.0 - a[v]
        h[v] = 1.0 + r[v]
    k = n - 2
    while k >= 4:
        for v in range(b):
            x = h[v]
            y = r[v]
            x *= y
            x += 1.0
            x *= y
            x += 1.0
            x *= y
            x += 1.0
            x *= y
            x += 1.0
            h[v] = x
        k -= 4
    while k >= 1:
        for v in range(b):
            h[v] *= r[v]
            h[v] += 1.0
        k -= 1
    for v in range(b):
        out[v] = h[v] * a[v]


def iid_block(p, v0, b, s, j, leaf_n, lvl_start, term_start, term_child, term_cnt, F, a, g, acc, r, h):
    """``F[c, :b]`` = :math:`f` of every class ``c`` of the program of :func:`iid_program` at the columns
    ``v0 .. v0 + b - 1`` of the draft row ``p`` (``s`` the draft's probabilities along the prefix, ``j`` its
    length); ``a``, ``g``, ``acc``, ``r``, ``h`` scratch of :data:`BLOCK` entries."""
    n_lvl = lvl_start.shape[0] - 1
    pb = p[v0:v0 + b]
    for c in range(lvl_start[1]):
        n = leaf_n[c]
        if n > 0:
            union_block(pb, n, b, r, h, F[c])
        else:
            F[c, :b] = 0.0
    for lev in range(1, n_lvl):
        sl = s[j - lev]
        for c in range(lvl_start[lev], lvl_start[lev + 1]):
            if term_start[c] == term_start[c + 1]:
                F[c, :b] = 0.0
                continue
            one = term_start[c + 1] - term_start[c] == 1         # one term: its union is f(c) itself
            for k in range(term_start[c], term_start[c + 1]):
                fc = F[term_child[k]]
                for v in range(b):
                    a[v] = sl * fc[v]
                if k == term_start[c]:
                    union_block(a, term_cnt[k], b, r, h, F[c] if one else acc)
                else:
                    union_block(a, term_cnt[k], b, r, h, g)
                    for v in range(b):
                        acc[v] = g[v] + (1.0 - g[v]) * acc[v]
            if not one:
                for v in range(b):
                    F[c, v] = acc[v]


def union_point(a, n):
    """:func:`union_block` at one entry ``a``: the same operations, so the same value."""
    if n == 1:
        return a * 1.0
    r = 1.0 - a
    x = 1.0 + r
    for _ in range(n - 2):
        x *= r
        x += 1.0
    return x * a


def iid_point(x, s, j, leaf_n, lvl_start, term_start, term_child, term_cnt, root, Fs):
    r""":math:`f` of the class ``root`` of the program of :func:`iid_program` at one draft probability ``x`` (as
    :func:`iid_block` at one column, by :func:`union_point`: the same operations, so the same value; no clipping at
    1), ``Fs`` scratch of one entry per class."""
    n_lvl = lvl_start.shape[0] - 1
    for c in range(lvl_start[1]):
        n = leaf_n[c]
        Fs[c] = union_point(x, n) if n > 0 else 0.0
    for lev in range(1, n_lvl):
        sl = s[j - lev]
        for c in range(lvl_start[lev], lvl_start[lev + 1]):
            acc = 0.0
            for k in range(term_start[c], term_start[c + 1]):
                g = union_point(sl * Fs[term_child[k]], term_cnt[k])
                acc = g if k == term_start[c] else g + (1.0 - g) * acc
            Fs[c] = acc
    return Fs[root]


def iid_scratch(lvl_start):
    """The buffers of :func:`iid_block`: ``F`` (a row of :data:`BLOCK` entries per class of the program) and five
    scratch rows."""
    F = np.zeros((lvl_start[lvl_start.shape[0] - 1], BLOCK))
    return F, np.zeros(BLOCK), np.zeros(BLOCK), np.zeros(BLOCK), np.zeros(BLOCK), np.zeros(BLOCK)


def iid_pi_kernel(P, s_all, j, leaf_n, lvl_start, term_start, term_child, term_cnt, root, out):
    r"""``out[i, v]`` = :math:`\pi` of the child ``v`` of prefix ``i`` (i.i.d. children), by the program of
    :func:`iid_program`: classes ``0 .. lvl_start[1] - 1`` are level 0 (``leaf_n`` leaf children each), the
    classes of level ``l`` combine their terms ``(term_child, term_cnt)`` with ``s = s_all[i, j - l]``;
    :data:`BLOCK` columns at a time."""
    m, V = P.shape
    F, a, g, acc, r, h = iid_scratch(lvl_start)
    for i in range(m):
        for v0 in range(0, V, BLOCK):
            b = min(BLOCK, V - v0)
            iid_block(P[i], v0, b, s_all[i], j, leaf_n, lvl_start, term_start, term_child, term_cnt, F, a, g, acc, r,
                      h)
            fr = F[root]
            for v in range(b):
                x = fr[v]
                out[i, v0 + v] = x if x < 1.0 else 1.0


def lane_total(L):
    """The sum of the :data:`BLOCK` lanes ``L`` (each a running sum over every ``BLOCK``-th entry of a row) by
    pairwise halving: a row of ``V`` entries is summed within about ``V / BLOCK + log2(BLOCK)`` roundings."""
    buf = L.copy()
    w = buf.shape[0]
    while w > 1:
        h = w // 2
        for k in range(h):
            buf[k] = buf[k] + buf[k + h]
        w = h
    return buf[0]


def iid_row(p, q, Qu, s, j, leaf_n, lvl_start, term_start, term_child, term_cnt, root, mdc, sums, low, pi,
            ck=None):
    r"""One prefix's expansion, i.i.d. children, in one pass over its draft law ``p`` and target law ``q``
    (:data:`BLOCK` columns at a time): :math:`\pi` of every child by the program of :func:`iid_program` (as
    :func:`iid_pi_kernel`, ``s`` the draft's probabilities along the prefix), and the row sums
    ``sums[0]`` = :math:`\sum_x \min(Q_u q_x, \pi_x)`, ``sums[1 + e]`` =
    :math:`\sum_x \min(Q_u q_x, \mathrm{mdc}[e]\, p_x)` (the caps of the lower depths), each over
    :data:`BLOCK` lanes (:func:`lane_total`). With ``low``/``pi`` of length ``V`` (else empty) the entries
    :math:`\min(Q_u q, \pi)` and :math:`\pi` are written too (the candidates' values); without them the sums
    alone, by :func:`iid_row_sums` (:math:`\pi` only where it can be the minimum), bit for bit the same.

    With ``ck`` (a zeroed buffer of :func:`check_scratch`; None: no check) both rows are checked as laws in the
    same pass, block by block (:func:`check_block`, :func:`check_finish`): the totals in its last two entries."""
    E = mdc.shape[0]
    L = np.zeros((1 + E, BLOCK))
    if low.shape[0] == 0:
        Fs, mk, ix = iid_sums_scratch(lvl_start)
        iid_row_sums(p, q, Qu, s, j, leaf_n, lvl_start, term_start, term_child, term_cnt, root, mdc, sums, L, Fs,
                     mk, ix, ck)
        return
    V = p.shape[0]
    F, a, g, acc, r, h = iid_scratch(lvl_start)
    qc = np.zeros(BLOCK)
    for v0 in range(0, V, BLOCK):
        b = min(BLOCK, V - v0)
        pb = p[v0:v0 + b]
        qb = q[v0:v0 + b]
        lb = low[v0:v0 + b]
        pib = pi[v0:v0 + b]
        L0 = L[0]
        iid_block(p, v0, b, s, j, leaf_n, lvl_start, term_start, term_child, term_cnt, F, a, g, acc, r, h)
        fr = F[root]
        for v in range(b):
            x = fr[v]
            pv = x if x < 1.0 else 1.0
            y = Qu * qb[v]
            qc[v] = y
            L0[v] += y if y < pv else pv
        for v in range(b):
            x = fr[v]
            pv = x if x < 1.0 else 1.0
            lb[v] = qc[v] if qc[v] < pv else pv
            pib[v] = pv
        for e in range(E):
            ce = mdc[e]
            for v in range(b):
                y = ce * pb[v]
                L[1 + e, v] += qc[v] if qc[v] < y else y
        if ck is not None:
            check_block(pb, qb, b, ck)
    for e in range(1 + E):
        sums[e] = lane_total(L[e])
    if ck is not None:
        check_finish(ck)


def iid_sums_scratch(lvl_start):
    """The buffers of :func:`iid_row_sums` besides its lanes: one entry per class of the program, the flags of a
    block (one byte per column, read eight at a time) and the columns of its undecided entries."""
    return (np.zeros(lvl_start[lvl_start.shape[0] - 1]), np.zeros(BLOCK, dtype=np.uint8),
            np.zeros(BLOCK + 8, dtype=np.int64))


def iid_chain(lvl_start, term_start):
    """Whether the program of :func:`iid_program` has one class a level and one term a class above level 0 (class
    ``l`` is level ``l``'s, the root the last): then :math:`f` at a point is
    ``z = union(x, leaf_n[0])``, ``z = union(s[j - l] * z, term_cnt[term_start[l]])`` for ``l = 1, 2, ...``, the
    operations of :func:`iid_point` without its loops over classes and terms (so the same value)."""
    n_lvl = lvl_start.shape[0] - 1
    for lev in range(n_lvl):
        if lvl_start[lev + 1] - lvl_start[lev] != 1:
            return False
    for c in range(1, n_lvl):
        if term_start[c + 1] - term_start[c] != 1:
            return False
    return True


def iid_row_sums(p, q, Qu, s, j, leaf_n, lvl_start, term_start, term_child, term_cnt, root, mdc, sums, L, Fs, mk, ix,
                 ck=None):
    r"""The row sums of :func:`iid_row` without its entries (``sums[0]`` = :math:`\sum_x \min(Q_u q_x, \pi_x)`,
    ``sums[1 + e]`` the caps' sums), :math:`\pi` evaluated only where it can be the minimum; ``L`` (``(1 + E,``
    :data:`BLOCK` ``)``, overwritten), ``Fs``, ``mk``, ``ix`` scratch (:func:`iid_sums_scratch`).

    :math:`\pi_x = \min(1, f(p_x))` with :math:`f` concave and increasing in :math:`p_x`, :math:`f(0) = 0` (unions
    :math:`1 - (1 - a)^n` of concave increasing arguments, products of the complements of two of them convex), so
    :math:`\pi_x \ge \pi(S)\, \min(p_x, S) / S` with :math:`S` = :data:`SLOPE_AT` (the chord below :math:`S`; above
    it :math:`\pi_x \ge \pi(S)`, :math:`f` increasing). An entry with :math:`Q_u q_x \le c \min(p_x, S)`, :math:`c =
    (1 - 10^{-12})\, \pi(S) / S` (the margin above the rounding of either side), has :math:`\min(Q_u q_x, \pi_x) =
    Q_u q_x` when :math:`c \min(p_x, S) \ge` :data:`DECIDE_FROM` (below it an underflow in :math:`\pi_x`'s
    evaluation, e.g. of :math:`s\, f` at a subnormal :math:`p_x`, may round :math:`\pi_x` below the bound: only
    :math:`Q_u q_x = 0` is decided there) and adds it to its lane in the block's sweep; the others add 0 there, and
    the sweep notes whether there are any (an or, cheaper than a count). A block with such entries flags them in a
    second sweep (the same comparison, so the same entries), gathers their columns eight flags at a time (a word of
    zeros skips eight without a branch each) and evaluates :math:`\pi` at each by the operations of
    :func:`iid_point` (written out here: a call costs more than its arithmetic), adding :math:`\min(Q_u q_x, \pi_x)`
    to its lane: each lane gets the additions of the whole evaluation in the same order (an added 0 changes no bit
    of a sum of nonnegative terms), so the sums are bit for bit those of :func:`iid_row` with ``low``/``pi``.

    With ``ck`` (:func:`check_scratch`; None: no check) both rows are also checked as laws in the same pass, each
    block after its sweeps while it is in L1 (:func:`check_block`; every entry of both rows is read here, the
    undecided ones or not), the totals in its last two entries (:func:`check_finish`)."""
    V = p.shape[0]
    E = mdc.shape[0]
    n_lvl = lvl_start.shape[0] - 1
    mk8 = mk.view(np.uint64)
    for e in range(1 + E):
        for v in range(BLOCK):
            L[e, v] = 0.0
    x = iid_point(SLOPE_AT, s, j, leaf_n, lvl_start, term_start, term_child, term_cnt, root, Fs)
    c = ((x if x < 1.0 else 1.0) / SLOPE_AT) * (1.0 - 1e-12)
    chain = iid_chain(lvl_start, term_start)
    L0 = L[0]
    for v0 in range(0, V, BLOCK):
        b = min(BLOCK, V - v0)
        pb = p[v0:v0 + b]
        qb = q[v0:v0 + b]
        n = False
        for v in range(b):
            y = Qu * qb[v]
            x = pb[v]
            t = c * (x if x < SLOPE_AT else SLOPE_AT)
            und = y > (t if t >= DECIDE_FROM else 0.0)
            L0[v] += 0.0 if und else y
            n |= und
        if n:
            for v in range(b, BLOCK):
                mk[v] = 0
            for v in range(b):
                y = Qu * qb[v]
                x = pb[v]
                t = c * (x if x < SLOPE_AT else SLOPE_AT)
                mk[v] = 1 if y > (t if t >= DECIDE_FROM else 0.0) else 0
            ne = 0
            for w in range((b + 7) // 8):
                if mk8[w] != 0:
                    for v in range(8 * w, 8 * w + 8):
                        ix[ne] = v
                        ne += mk[v]
            for t in range(ne):
                v = ix[t]
                x = pb[v]
                if chain:                                         # iid_point's operations at x, one class a level
                    z = union_point(x, leaf_n[0]) if leaf_n[0] > 0 else 0.0
                    for lev in range(1, n_lvl):
                        z = union_point(s[j - lev] * z, term_cnt[term_start[lev]])
                else:
                    for k in range(lvl_start[1]):                 # iid_point's operations at x
                        Fs[k] = union_point(x, leaf_n[k]) if leaf_n[k] > 0 else 0.0
                    for lev in range(1, n_lvl):
                        sl = s[j - lev]
                        for k in range(lvl_start[lev], lvl_start[lev + 1]):
                            acc = 0.0
                            for m in range(term_start[k], term_start[k + 1]):
                                g = union_point(sl * Fs[term_child[m]], term_cnt[m])
                                acc = g if m == term_start[k] else g + (1.0 - g) * acc
                            Fs[k] = acc
                    z = Fs[root]
                pv = z if z < 1.0 else 1.0
                y = Qu * qb[v]
                L0[v] += y if y < pv else pv
        for e in range(E):
            ce = mdc[e]
            Le = L[1 + e]
            for v in range(b):
                y = ce * pb[v]
                qv = Qu * qb[v]
                Le[v] += qv if qv < y else y
        if ck is not None:
            check_block(pb, qb, b, ck)
    for e in range(1 + E):
        sums[e] = lane_total(L[e])
    if ck is not None:
        check_finish(ck)


def check_scratch():
    """A zeroed buffer of :data:`CHECK_LEN` entries for :func:`check_block` and :func:`check_finish`."""
    return np.zeros(CHECK_LEN)


def check_block(pb, qb, b, ck):
    """A block's share of the law check of two rows (:func:`otspec._validation_kernel.law_check_sum` of each, in
    the kernel's own pass, the block still in L1): ``pb``, ``qb`` (``b`` entries each) added to their
    :data:`BLOCK` lanes in ``ck`` and each entry that is neither ``+0.0`` nor a positive normal finite double
    (its bit pattern outside ``{0} U [TINY_BITS, INF_BITS)``: NaN, infinite, negative, ``-0.0``, subnormal) counted
    in a third set of lanes."""
    pi = pb.view(np.int64)
    qi = qb.view(np.int64)
    for v in range(b):
        ck[v] += pb[v]
        ck[BLOCK + v] += qb[v]
        bp = pi[v]
        bq = qi[v]
        bad = ((bp != 0) & ((bp < TINY_BITS) | (bp >= INF_BITS))) | ((bq != 0) & ((bq < TINY_BITS) | (bq >= INF_BITS)))
        ck[2 * BLOCK + v] += 1.0 if bad else 0.0


def check_finish(ck):
    """The two rows' check from the lanes of :func:`check_block`: ``ck[CHECK_LEN - 2]``, ``ck[CHECK_LEN - 1]`` the
    draft's and the target's totals (the lanes halved pairwise, :func:`lane_total`: an order of the additions, so
    within ``gamma_{n-1}`` of the exact total as :func:`otspec._validation_kernel.law_check_sum`'s), both NaN where
    an entry of either row is bad (the caller then checks each row apart); the lanes zeroed for the next row."""
    nb = lane_total(ck[2 * BLOCK:3 * BLOCK])
    tp = lane_total(ck[:BLOCK])
    tq = lane_total(ck[BLOCK:2 * BLOCK])
    ok = nb == 0.0
    for v in range(3 * BLOCK):
        ck[v] = 0.0
    ck[CHECK_LEN - 2] = tp if ok else np.nan
    ck[CHECK_LEN - 1] = tq if ok else np.nan



def iid_rows(P, pr, Q, qr, ii, Qu, s_rows, j, leaf_n, lvl_start, term_start, term_child, term_cnt, root, mdc, sums,
             low, pi, chk=None):
    """:func:`iid_row` for the rows ``i = ii[k]`` of a frontier whose laws are the rows ``P[pr[k]]``, ``Q[qr[k]]``
    (rows of one array each, where they are) in one call, row ``i``'s results in ``sums[i]``, ``low[i]``,
    ``pi[i]``; without entries to write (``low`` of width 0) each row by :func:`iid_row_sums`, its buffers made
    once for the call. With ``chk`` (``(m, 2)``; None: no check) both rows of each are checked as laws in the same
    pass (:func:`check_block`): ``chk[i]`` the draft's and the target's totals, NaN where an entry is bad."""
    ck = check_scratch()
    if low.shape[1] > 0:
        for k in range(ii.shape[0]):
            i = ii[k]
            if chk is None:
                iid_row(P[pr[k]], Q[qr[k]], Qu[i], s_rows[i], j, leaf_n, lvl_start, term_start, term_child, term_cnt,
                        root, mdc[i], sums[i], low[i], pi[i])
            else:
                iid_row(P[pr[k]], Q[qr[k]], Qu[i], s_rows[i], j, leaf_n, lvl_start, term_start, term_child, term_cnt,
                        root, mdc[i], sums[i], low[i], pi[i], ck)
                chk[i, 0] = ck[CHECK_LEN - 2]
                chk[i, 1] = ck[CHECK_LEN - 1]
        return
    L = np.zeros((1 + mdc.shape[1], BLOCK))
    Fs, mk, ix = iid_sums_scratch(lvl_start)
    for k in range(ii.shape[0]):
        i = ii[k]
        if chk is None:
            iid_row_sums(P[pr[k]], Q[qr[k]], Qu[i], s_rows[i], j, leaf_n, lvl_start, term_start, term_child,
                         term_cnt, root, mdc[i], sums[i], L, Fs, mk, ix, None)   # None as iid_row passes it: one type
        else:
            iid_row_sums(P[pr[k]], Q[qr[k]], Qu[i], s_rows[i], j, leaf_n, lvl_start, term_start, term_child,
                         term_cnt, root, mdc[i], sums[i], L, Fs, mk, ix, ck)
            chk[i, 0] = ck[CHECK_LEN - 2]
            chk[i, 1] = ck[CHECK_LEN - 1]


def second_draw_t(P, top, rest_top, t):
    """``t[i, x]`` = :math:`p_x / (1 - p_x)` (0 where the denominator is 0), the most likely token's
    :math:`1 - p_x` given as ``rest_top[i]`` (the sum of the row's other entries)."""
    m, V = P.shape
    for i in range(m):
        for v in range(V):
            rest = 1.0 - P[i, v]
            t[i, v] = P[i, v] / rest if rest > 0.0 else 0.0
        rest = rest_top[i]
        v = top[i]
        t[i, v] = P[i, v] / rest if rest > 0.0 else 0.0


def _wor_entries(P, t, top1, S1, S2, ranks, W, coef, top, ptop, tails, pi, md, i, v0, b, special,
                 law, room, acc, kk, rok, rC, rth, rpm, rhead, rHL, rspecial, rx, rd, rdmax, rpw):
    """:func:`wor_pi_kernel` on the columns ``v0 .. v0 + b - 1`` of row ``i``; ``special``: the columns may hold
    the row's most likely tokens (each checked), else none does."""
    K = ranks.shape[0]
    E = md.shape[0]
    if rok[i]:                                     # the race's x and Taylor degree of each entry, for every rank
        pm = rpm[i]
        N = rth.shape[1] - 1
        rdmax[0] = 0
        for v in range(b):
            rx[v] = P[i, v0 + v] / pm
            rd[v] = 0
        for n in range(min(DCAP, N)):               # the degree: thresholds below x (nondecreasing)
            th = rth[i, n]
            for v in range(b):
                rd[v] += 1 if rx[v] > th else 0
        for v in range(b):
            d = rd[v]
            if d == DCAP:
                while d < N and rx[v] > rth[i, d]:
                    d += 1
                rd[v] = d
            if d > rdmax[0]:
                rdmax[0] = d
        for v in range(b):
            rpw[0, v] = 1.0
        for n in range(1, DCAP + 1):
            for v in range(b):
                rpw[n, v] = rpw[n - 1, v] * rx[v]
        for n in range(1, DCAP + 1):
            for v in range(b):
                rpw[n, v] = rpw[n, v] if n <= rd[v] else 0.0
    for v in range(b):
        p = P[i, v0 + v]
        if special and v0 + v == top1[i]:
            p1 = p * S2[i]
        else:
            p1 = p * (S1[i] - t[i, v0 + v])
        p1 = 0.0 if p1 < 0.0 else (1.0 if p1 > 1.0 else p1)
        x = (1.0 - p) - p1
        room[v] = 0.0 if x < 0.0 else (1.0 if x > 1.0 else x)
        law[1, v] = p1
    for k in range(K):
        rk = ranks[k]
        if rk == 0:
            for v in range(b):
                law[0, v] = P[i, v0 + v]
            lk = law[0]
        elif rk == 1:
            lk = law[1]
        elif rok[i]:
            # the exponential race: p * sum_n C_n x^n by Horner's rule up to the entry's degree, the head's laws
            lk = law[2]
            q = kk[k]
            c0 = rC[i, q, 0]
            for v in range(b):
                lk[v] = c0
            for n in range(1, min(DCAP, rdmax[0]) + 1):    # ascending powers, zero above an entry's degree
                cn = rC[i, q, n]
                for v in range(b):
                    lk[v] = lk[v] + cn * rpw[n, v]
            if rdmax[0] > DCAP:
                for v in range(b):
                    if rd[v] > DCAP:
                        xn = rpw[DCAP, v]
                        for n in range(DCAP + 1, rd[v] + 1):
                            xn = xn * rx[v]
                            lk[v] = lk[v] + rC[i, q, n] * xn
            for v in range(b):
                lk[v] = P[i, v0 + v] * lk[v]
            if rspecial:
                for c in range(rhead.shape[1]):
                    v = rhead[i, c] - v0
                    if rhead[i, c] >= 0 and 0 <= v < b:
                        lk[v] = rHL[i, q, c]
        else:
            lk = law[2]
            tr = tails[i, rk]
            for v in range(b):
                y = P[i, v0 + v] / tr
                lk[v] = y if y < room[v] else room[v]
            if special:
                tr1 = tails[i, rk] - ptop[i, rk]
                for c in range(rk):
                    v = top[i, c] - v0
                    if 0 <= v < b:
                        y = ptop[i, c] / (tr1 + ptop[i, c])
                        lk[v] = y if y < room[v] else room[v]
        w = W[i, k]
        if k == 0:
            for v in range(b):
                acc[v] = w * lk[v]
        else:
            for v in range(b):
                acc[v] = acc[v] + w * lk[v]
        for e in range(E):
            ce = coef[e, i, k]
            if k == 0:
                for v in range(b):
                    md[e, i, v0 + v] = ce * lk[v]
            else:
                for v in range(b):
                    md[e, i, v0 + v] = md[e, i, v0 + v] + ce * lk[v]
    for v in range(b):
        x = acc[v]
        pi[i, v0 + v] = x if x < 1.0 else 1.0


def wor_pi_kernel(P, t, top1, S1, S2, ranks, W, coef, top, ptop, tails, pi, md, kk, rok, rC, rth, rpm, rhead,
                  rHL):
    r"""``pi[i, v]`` = :math:`\min(1, \sum_k W[i, k]\, \ell_k(i, v))` and ``md[e, i, v]`` =
    :math:`\sum_k \mathrm{coef}[e, i, k]\, \ell_k(i, v)`, :math:`\ell_k` the law of the draw of rank
    ``ranks[k]`` without replacement from row ``i``: ``P`` (rank 0), the closed form from the terms ``t``
    (the most likely token's zeroed), ``S1`` (their sum before) and ``S2`` (after) (rank 1), the stated upper
    bound from the decreasing ``top``/``ptop`` and the tails ``tails[i, r]`` (mass outside the ``r`` largest)
    for ranks ``r >= 2``, capped by :math:`1 - \ell_0 - \ell_1`, or, in the rows ``rok``, the exact law of
    the exponential race (:class:`otspec.tree._bound._Race`: ``rC``, ``rth``, ``rpm`` the tail's Taylor
    coefficients, degree thresholds and largest probability, ``rhead``/``rHL`` the head's tokens and laws, ``kk``
    the race's index of each rank); :data:`BLOCK` columns at a time, the blocks that hold one of the row's most
    likely tokens again entry by entry."""
    m, V = P.shape
    law = np.zeros((3, BLOCK))
    room = np.zeros(BLOCK)
    acc = np.zeros(BLOCK)
    rx = np.zeros(BLOCK)
    rd = np.zeros(BLOCK, dtype=np.int64)
    rdmax = np.zeros(1, dtype=np.int64)
    rpw = np.zeros((DCAP + 1, BLOCK))
    nt = top.shape[1]
    for i in range(m):
        for v0 in range(0, V, BLOCK):
            b = min(BLOCK, V - v0)
            special = v0 <= top1[i] < v0 + b
            for c in range(nt):
                if v0 <= top[i, c] < v0 + b:
                    special = True
            rspecial = False
            if rok[i]:
                for c in range(rhead.shape[1]):
                    if v0 <= rhead[i, c] < v0 + b:
                        rspecial = True
            _wor_entries(P, t, top1, S1, S2, ranks, W, coef, top, ptop, tails, pi, md, i, v0, b, special,
                         law, room, acc, kk, rok, rC, rth, rpm, rhead, rHL, rspecial, rx, rd, rdmax, rpw)


def head_insert(pb, v0, b, K, hv, hi, c, thr):
    r"""Insert the entries of the block ``pb`` (columns ``v0 .. v0 + b``) above ``thr`` into the running head
    ``hv``/``hi`` (``K + 1`` places, decreasing, ties by lower id: an entry enters after the equal ones already
    there) of ``c`` entries so far; ``(c, thr)`` after the block (``thr`` the ``(K + 1)``-th value once the head
    is full, else 0). The threshold only rises, so an entry not above its value at the start of a chunk of
    :data:`CHUNK` columns never enters: each chunk's entries above it are counted in a vectorised sweep and the
    chunk is walked, in column order, only up to its last one (the same insertions in the same order as a walk of
    every column)."""
    for c0 in range(0, b, CHUNK):
        e = min(c0 + CHUNK, b)
        thr0 = thr
        nc = 0
        for v in range(c0, e):                  # the chunk's entries above the threshold at its start (it only rises)
            nc += 1 if pb[v] > thr0 else 0
        v = c0
        while nc > 0:                           # up to the chunk's last one
            x = pb[v]
            nc -= 1 if x > thr0 else 0
            if x > thr:
                pos = c if c <= K else K
                while pos > 0 and hv[pos - 1] < x:
                    hv[pos] = hv[pos - 1]
                    hi[pos] = hi[pos - 1]
                    pos -= 1
                hv[pos] = x
                hi[pos] = v0 + v
                if c <= K:
                    c += 1
                if c == K + 1:
                    thr = hv[K]
            v += 1
    return c, thr


def head_finish(K, c, hv, hi, head, hval, st):
    """The head of :func:`head_insert` written out: ``head[:kh]``/``hval[:kh]`` (``kh = min(K, c)``; -1 and 0
    past it) and ``st[1]`` = the most likely token, ``st[2]`` = ``kh``, ``st[3]`` = the tail's largest probability
    (the ``(K + 1)``-th, 0 without a tail)."""
    kh = c if c < K else K
    for k in range(K):
        head[k] = hi[k] if k < kh else -1
        hval[k] = hv[k] if k < kh else 0.0
    st[1] = hi[0]
    st[2] = kh
    st[3] = hv[K] if c > K else 0.0


def wor_row_stats(p, K, race, head, hval, nu, mark, st):
    r"""What one draft row ``p`` gives the draws without replacement, read from memory once (the second sweep
    finds the row in the cache; the first inserts into the head by :func:`head_insert`, which walks only the chunks
    of a block with an entry above the head's current threshold, counted in a vectorised sweep): ``st`` = (support,
    most likely token, head size ``kh``, the tail's largest probability, the mass outside the most likely token,
    :math:`S_1`, :math:`S_2`); ``head[:kh]``/``hval[:kh]`` the ``kh = min(K, support)`` most likely tokens and
    their probabilities (decreasing, ties by lower id, as :func:`otspec.tree._process._ranked`); the second sweep
    (:func:`wor_row_sums`) the terms of the second draw's closed form and, with ``race``, the tail's power sums
    ``nu`` (the head left out). ``mark``: a boolean scratch of ``V`` False entries (left so)."""
    V = p.shape[0]
    hv = np.zeros(K + 1)
    hi = np.zeros(K + 1, dtype=np.int64)
    c = 0
    thr = 0.0                                   # entries above it enter the head (positive; then the (K+1)-th)
    for v0 in range(0, V, BLOCK):
        b = min(BLOCK, V - v0)
        c, thr = head_insert(p[v0:v0 + b], v0, b, K, hv, hi, c, thr)  # it walks only chunks with an entry to take
    head_finish(K, c, hv, hi, head, hval, st)
    wor_row_sums(p, race, head, nu, mark, st)


def wor_row(p, q, Qu, top, S1, S2, w01, H, c01, Hmd, rok, pmax, theta, head, HLw, HLmd, sums, low, pi, md):
    r"""One prefix's expansion, children drawn without replacement, in one pass over its draft law ``p`` and
    target law ``q`` (:data:`BLOCK` columns at a time): with every used rank's law combined before the sum,

    .. math::

        \pi_x = \min\Big(1,\ w_0\, p_x + w_1\, \ell_1(x) + p_x \sum_n H_n\, (p_x / p_{\max})^n\Big),

    :math:`\ell_1` the second draw's closed form (``top``, ``S1``, ``S2`` of :func:`wor_row_stats`), ``H`` the
    race's Taylor coefficients of the ranks >= 2 weighted by their slots (``rok``; each entry up to the degree of
    the thresholds ``theta``), the head's tokens ``head`` taking the race's weighted laws ``HLw`` instead; the
    expected slot counts ``md[e]`` the same with ``c01[e]``, ``Hmd[e]``, ``HLmd[e]``. ``sums[0]`` =
    :math:`\sum_x \min(Q_u q_x, \pi_x)`, ``sums[1 + e]`` = :math:`\sum_x \min(Q_u q_x, \mathrm{md}_e(x))` over
    :data:`BLOCK` lanes; ``low``, ``pi`` (length ``V``, else empty) and ``md`` (``(E, V)``, else ``(E, 0)``)
    written when given."""
    V = p.shape[0]
    E = Hmd.shape[0]
    N = H.shape[0] - 1
    K = head.shape[0]
    write = low.shape[0] > 0
    L = np.zeros((1 + E, BLOCK))
    p1 = np.zeros(BLOCK)
    qc = np.zeros(BLOCK)
    val = np.zeros(BLOCK)
    mv = np.zeros((E, BLOCK))
    rx = np.zeros(BLOCK)
    rd = np.zeros(BLOCK, dtype=np.int64)
    rpw = np.zeros((DCAP + 1, BLOCK))
    hit = np.zeros(BLOCK, dtype=np.int64)
    for v0 in range(0, V, BLOCK):
        b = min(BLOCK, V - v0)
        pb = p[v0:v0 + b]
        qb = q[v0:v0 + b]
        lb = low[v0:v0 + b]
        pib = pi[v0:v0 + b]
        for v in range(b):
            x = pb[v]
            den = 1.0 - x
            t = x / den if den > 0.0 else 0.0
            y = x * (S1 - t)
            p1[v] = 0.0 if y < 0.0 else (1.0 if y > 1.0 else y)
            qc[v] = Qu * qb[v]
        if v0 <= top < v0 + b:
            y = p[top] * S2
            p1[top - v0] = 0.0 if y < 0.0 else (1.0 if y > 1.0 else y)
        for v in range(b):
            val[v] = w01[0] * pb[v] + w01[1] * p1[v]
        for e in range(E):
            for v in range(b):
                mv[e, v] = c01[e, 0] * pb[v] + c01[e, 1] * p1[v]
        if rok:
            # the race's x, its Taylor degree (thresholds below x, nondecreasing; the first DCAP in one sweep with
            # the powers x^n, 0 above the degree), the entries that need more continued on their own
            dmax = 0
            for v in range(b):
                x = pb[v] / pmax
                rx[v] = x
                d = 0
                for n in range(DCAP):
                    d += 1 if x > theta[n] else 0
                rd[v] = d
                pw = 1.0
                for n in range(1, DCAP + 1):
                    pw = pw * x
                    rpw[n, v] = pw if n <= d else 0.0
            if N > DCAP:
                for v in range(b):
                    d = rd[v]
                    if d == DCAP:
                        while d < N and rx[v] > theta[d]:
                            d += 1
                        rd[v] = d
                    if d > dmax:
                        dmax = d
            for v in range(b):
                hit[v] = -1
            for c in range(K):
                if v0 <= head[c] < v0 + b:
                    hit[head[c] - v0] = c
            for e in range(-1, E):
                Hc = H if e < 0 else Hmd[e]
                out = val if e < 0 else mv[e]
                for v in range(b):
                    acc = Hc[0]
                    for n in range(1, DCAP + 1):
                        acc = acc + Hc[n] * rpw[n, v]
                    out[v] = out[v] + pb[v] * acc
                if dmax > DCAP:                        # entries that need more terms: x^n continued on their own
                    for v in range(b):
                        if rd[v] > DCAP:
                            acc = Hc[0]
                            for n in range(1, DCAP + 1):
                                acc = acc + Hc[n] * rpw[n, v]
                            xn = rpw[DCAP, v]
                            for n in range(DCAP + 1, rd[v] + 1):
                                xn = xn * rx[v]
                                acc = acc + Hc[n] * xn
                            if e < 0:
                                base = w01[0] * pb[v] + w01[1] * p1[v]
                            else:
                                base = c01[e, 0] * pb[v] + c01[e, 1] * p1[v]
                            out[v] = base + pb[v] * acc
                for v in range(b):                     # the head's tokens: the race's laws themselves
                    c = hit[v]
                    if c >= 0:
                        if e < 0:
                            out[v] = (w01[0] * pb[v] + w01[1] * p1[v]) + HLw[c]
                        else:
                            out[v] = (c01[e, 0] * pb[v] + c01[e, 1] * p1[v]) + HLmd[e, c]
        L0 = L[0]
        for v in range(b):
            x = val[v]
            pv = x if x < 1.0 else 1.0
            val[v] = pv
            y = qc[v]
            L0[v] += y if y < pv else pv
        for e in range(E):
            Le = L[1 + e]
            for v in range(b):
                y = mv[e, v]
                Le[v] += qc[v] if qc[v] < y else y
        if write:
            for v in range(b):
                pib[v] = val[v]
                lb[v] = qc[v] if qc[v] < val[v] else val[v]
            for e in range(E):
                for v in range(b):
                    md[e, v0 + v] = mv[e, v]
    for e in range(1 + E):
        sums[e] = lane_total(L[e])


def wor_lower(dW, x):
    r""":math:`\min(1, \sum_n \mathrm{dW}[n - 1]\, (1 - (1 - x)^n))`, the lower bound on :math:`\pi` of
    :func:`wor_row_last` at a draft probability ``x`` (each :math:`1 - (1 - x)^n = x \sum_{i < n} (1 - x)^i`,
    positive terms)."""
    rr = 1.0 - x
    tot = 0.0
    hn = 0.0
    pw = 1.0
    for k in range(dW.shape[0]):
        hn += pw
        pw *= rr
        tot += dW[k] * hn
    tot *= x
    return tot if tot < 1.0 else 1.0


def wor_row_last(p, q, Qu, dW, idx, out, ck=None, hs=None, hi=None):
    r"""A prefix of the last expanded depth, children drawn without replacement, in one pass over its draft law
    ``p`` and target law ``q``: the part of :math:`\sum_x \min(Q_u q_x, \pi_x)` that a lower bound on
    :math:`\pi` decides, and the columns it leaves (``idx[:n]``, increasing) for :func:`wor_row_at`.

    With the slots' weights :math:`W_r` of the ranks :math:`r = 0 .. R - 1` (nonincreasing: a slot with a child
    of rank ``r`` has children of every lower rank) and ``dW[n - 1]`` :math:`= W_{n-1} - W_n \ge 0`
    (:math:`W_R = 0`), :math:`\pi_x = \min(1, \sum_n \Delta W_n\, P(x \in S_n))`, :math:`S_n` the first ``n``
    draws. Each draw takes ``x``, if not drawn yet, with probability :math:`p_x / (1 - \text{mass drawn}) \ge
    p_x`, so :math:`P(x \in S_n) \ge 1 - (1 - p_x)^n`: :math:`\pi_x \ge \min(1, \sum_n \Delta W_n (1 - (1 -
    p_x)^n))`, concave in :math:`p_x` and 0 at 0, hence :math:`\pi_x \ge c\, p_x` for :math:`p_x \le`
    :data:`SLOPE_AT` with ``c`` its slope there (less a margin of 1e-9, far above the race's error). Entries with
    :math:`p_x \le` :data:`SLOPE_AT` and :math:`Q_u q_x \le c\, p_x` give :math:`Q_u q_x`, summed over
    :data:`BLOCK` lanes into ``out[2]``; ``out[0]`` the support (entries > 0), ``out[1]`` = ``n``. A block with
    entries left by the slope is walked column by column only in its chunks of :data:`CHUNK` columns that hold one
    (counted in a vectorised sweep), up to the chunk's last one: the same columns in the same order.

    With ``ck`` (:func:`check_scratch`; None: no check) both rows are also checked as laws in the same pass, each
    block after its sweeps (:func:`check_block`; every entry of both rows is read here), the totals in its last two
    entries (:func:`check_finish`).

    With ``hs`` (:func:`first_scratch`, ``hi`` its ``K + 1`` token ids; None: neither) the same pass also takes
    what :func:`wor_row_stats` reads of the draft row without the race, for :func:`row_first_finish`: the head of
    the ``K`` most likely tokens (:func:`head_insert` on the blocks with an entry above its threshold, the blocks in
    the same order: the same head) and the lanes of the second draw's sums over every entry (the most likely token
    taken out afterwards by redoing its lane alone). Returns the head's count of entries (0 without ``hs``)."""
    V = p.shape[0]
    P = SLOPE_AT
    c = (wor_lower(dW, P) / P) * (1.0 - 1e-9)
    qc = np.zeros(BLOCK)
    Lq = np.zeros(BLOCK)
    Ls = np.zeros(BLOCK, dtype=np.int64)
    n = 0
    hc = 0
    thr = 0.0                                   # entries above it enter the head (as wor_row_stats)
    if hs is not None:
        Kh = hi.shape[0] - 1
        Lr = hs[:BLOCK]
        Lt = hs[BLOCK:2 * BLOCK]
        hv = hs[2 * BLOCK:]
        for v in range(hs.shape[0]):
            hs[v] = 0.0
        for v in range(Kh + 1):
            hi[v] = 0
    for v0 in range(0, V, BLOCK):
        b = min(BLOCK, V - v0)
        pb = p[v0:v0 + b]
        qb = q[v0:v0 + b]
        m = 0
        for v in range(b):
            x = pb[v]
            y = Qu * qb[v]
            Ls[v] += 1 if x > 0.0 else 0
            und = x > P or y > c * x
            qc[v] = y
            Lq[v] += 0.0 if und else y
            m += 1 if und else 0
        if hs is not None:
            nh = 0
            for v in range(b):                  # the second draw's lanes (every entry) and the head's count
                x = pb[v]
                nh += 1 if x > thr else 0
                den = 1.0 - x
                Lr[v] += x
                Lt[v] += x / den if den > 0.0 else 0.0
            if nh > 0:
                hc, thr = head_insert(pb, v0, b, Kh, hv, hi, hc, thr)
        if m > 0:                               # the block's undecided entries, in the chunks that hold one
            for c0 in range(0, b, CHUNK):
                e = min(c0 + CHUNK, b)
                nc = 0
                for v in range(c0, e):          # counted in a vectorised sweep (the first sweep's test)
                    x = pb[v]
                    nc += 1 if ((x > P) | (qc[v] > c * x)) else 0
                v = c0
                while nc > 0:                   # up to the chunk's last one
                    x = pb[v]
                    if x > P:                       # a large entry: the lower bound itself
                        nc -= 1
                        y = qc[v]
                        if y <= wor_lower(dW, x) * (1.0 - 1e-9):
                            Lq[v] += y
                        else:
                            idx[n] = v0 + v
                            n += 1
                    elif qc[v] > c * x:
                        nc -= 1
                        idx[n] = v0 + v
                        n += 1
                    v += 1
        if ck is not None:
            check_block(pb, qb, b, ck)
    if ck is not None:
        check_finish(ck)
    support = 0
    for v in range(BLOCK):
        support += Ls[v]
    out[0] = support
    out[1] = n
    out[2] = lane_total(Lq)
    return hc


def first_scratch(K):
    r"""The scratch of :func:`wor_row_last`'s draft statistics: the lanes of :math:`\sum x` and
    :math:`\sum x / (1 - x)` (:data:`BLOCK` each) and the head's ``K + 1`` values; its ids apart (int64)."""
    return np.zeros(2 * BLOCK + K + 1), np.zeros(K + 1, dtype=np.int64)


def row_first_finish(p, K, hc, hs, hi, head, hval, st):
    r"""What :func:`wor_row_stats` without the race writes (``head``, ``hval``, ``st[1:7]``; ``st[0]`` the support
    as :func:`wor_row_last` wrote it), from the head and the lanes that :func:`wor_row_last` took with ``hs``
    (``hc`` its head count): the most likely token's lane summed again without it (the other lanes held the same
    additions in the same order as :func:`wor_row_sums`' sweep, so the same sums, bit for bit)."""
    V = p.shape[0]
    head_finish(K, hc, hs[2 * BLOCK:], hi, head, hval, st)
    top = int(st[1])
    Lr = hs[:BLOCK]
    Lt = hs[BLOCK:2 * BLOCK]
    ln = top % BLOCK
    r = 0.0
    t = 0.0
    for v0 in range(0, V, BLOCK):
        if v0 + ln < V:
            x = p[v0 + ln] if v0 + ln != top else 0.0
            den = 1.0 - x
            r += x
            t += x / den if den > 0.0 else 0.0
    Lr[ln] = r
    Lt[ln] = t
    second_draw_sums(p, top, Lr, Lt, st)


def second_draw_sums(p, top, Lr, Lt, st):
    r"""``st[4:7]`` (the mass outside the most likely token ``top``, :math:`S_1`, :math:`S_2`) from the lanes
    ``Lr`` (:math:`\sum x`) and ``Lt`` (:math:`\sum x / (1 - x)`) taken without ``top``."""
    rest = lane_total(Lr)
    S2 = lane_total(Lt)
    pt = p[top]
    st[4] = rest
    st[5] = S2 + (pt / rest if rest > 0.0 else 0.0)
    st[6] = S2


def second_draw_at(x, v, top, S1, S2):
    r"""The second draw's law at column ``v`` of draft probability ``x``, as :func:`wor_row` computes it:
    :math:`x\, (S_1 - x / (1 - x))`, at the most likely token ``top`` :math:`x\, S_2`, clipped to [0, 1]."""
    if v == top:
        y = x * S2
    else:
        den = 1.0 - x
        t = x / den if den > 0.0 else 0.0
        y = x * (S1 - t)
    return 0.0 if y < 0.0 else (1.0 if y > 1.0 else y)


def wor_row_recheck(p, q, Qu, idx, top, S1, S2, dW, out):
    r"""The entries ``idx[:n]`` that :func:`wor_row_last` left (``n = out[1]``), decided again by a tighter lower bound
    on :math:`\pi` from the second draw's closed form (``top``, ``S1``, ``S2`` of :func:`wor_row_stats`): with
    :math:`I_2 = p_x + \ell_1(x)` the exact probability that ``x`` is one of the first two draws :math:`S_2`,
    each later draw takes ``x``, if not drawn yet, with probability :math:`p_x / (1 - p(S_k)) \ge p_x / (1 -
    p(S_2))`, so (:math:`m = n - 2 \ge 0`, :math:`b = 1 - p_x`, :math:`a = 1 - p_x / (1 - p_t)`, ``t`` = ``top``
    :math:`\ne x`, :math:`p(S_2) \ge p_t` when ``t`` is in :math:`S_2`)

    .. math::

        P(x \in S_n) \ge I_2 + (1 - I_2)(1 - b^m) + (b^m - a^m)\, L, \qquad
        L = p_t (1 + S_2) - p_x p_t \Big(\frac{1}{1 - p_x} + \frac{1}{1 - p_t}\Big)
        = P(x \notin S_2,\ t \in S_2)

    (:math:`L` 0 at ``x = t``; lowered by :math:`10^{-12}` of its two terms for the rounding of :math:`S_2`, then
    clipped at 0; every other term a sum of positive products: :math:`1 - b^m = p_x \sum_{i < m} b^i`,
    :math:`b^m - a^m = \frac{p_x p_t}{1 - p_t} \sum_{i < m} b^i a^{m - 1 - i}`); proof in the theory page of the
    trees, the bound's section. The entries it decides add :math:`Q_u q_x` to ``out[2]``; the others stay in
    ``idx[:out[1]]`` (compacted, in order)."""
    n = int(out[1])
    pt = p[top]
    k = 0
    add = 0.0
    for i in range(n):
        v = idx[i]
        qv = Qu * q[v]
        if qv <= wor_recheck_lower(p[v], v, top, pt, S1, S2, dW) * (1.0 - 1e-9):
            add += qv
        else:
            idx[k] = v
            k += 1
    out[1] = k
    out[2] += add


def wor_recheck_lower(x, v, top, pt, S1, S2, dW):
    r"""The lower bound on :math:`\pi_x = \min(1, \sum_n \mathrm{dW}[n - 1]\, P(x \in S_n))` of
    :func:`wor_row_recheck` at column ``v`` of draft probability ``x`` (``top`` the most likely token, ``pt`` its
    probability, ``S1``, ``S2`` the second draw's sums of :func:`wor_row_stats`); with ``dW`` the unit vector of
    place ``n - 1``, the bound on :math:`P(x \in S_n)` itself (before the clip at 1)."""
    R = dW.shape[0]
    p1 = second_draw_at(x, v, top, S1, S2)
    i2 = x + p1
    i2 = i2 if i2 < 1.0 else 1.0
    rt = 1.0 - pt
    L = 0.0                                         # a lower bound on P(x not in S_2, top in S_2)
    a = 0.0
    ba = 0.0
    if v != top and rt > 0.0:
        Pt = pt * (1.0 + S2)                        # P(top in S_2)
        t2 = x * pt * (1.0 / (1.0 - x) + 1.0 / rt) if x < 1.0 else Pt    # P(S_2 = {x, top})
        L = (Pt - t2) - 1e-12 * (Pt + t2)
        L = L if L > 0.0 else 0.0
        a = 1.0 - x / rt
        a = a if a > 0.0 else 0.0
        ba = x * (pt / rt)                          # b - a
    lb = dW[0] * x
    rr = 1.0 - x
    hn = 0.0
    pw = 1.0
    G = 0.0
    for r in range(1, R):           # n = r + 1 >= 2, m = r - 1: hn = sum_{i < m} b^i, G = sum_{i < m} b^i a^(m-1-i)
        lb += dW[r] * (i2 + (1.0 - i2) * (x * hn) + L * (ba * G))
        G = a * G + pw
        hn += pw
        pw *= rr
    return lb if lb < 1.0 else 1.0


def wor_row_decide(p, q, Qu, dW, idx, lo, K, race, big, head, hval, nu, mark, st, ck=None):
    r"""A prefix of the last expanded depth, children drawn without replacement, up to the race, in one call (no
    return to the interpreter between its passes): :func:`wor_row_last` (``lo``, ``idx``), which takes the draft
    row's head and second draw's sums in the same pass (:func:`row_first_finish`: what :func:`wor_row_stats`
    without the race writes, the same values); with at most ``big`` entries left, :func:`wor_row_recheck`; with
    entries still left and ``race``, the tail's power sums (:func:`wor_row_sums`, a second sweep of the row).
    Returns 0 where no entry is left (``st[0]`` the support; ``st`` in full where the recheck decided the last ones,
    ``nu`` then 0: no race reads it), 1 where more than ``big`` are left (:math:`\pi` at every entry), 2 where
    ``idx[:lo[1]]`` are left and no head token is among them, 3 where one is (the race's laws of the head are
    read). With ``ck`` (:func:`check_scratch`) both rows are checked as laws in :func:`wor_row_last`'s pass (the
    totals in its last two entries)."""
    hs, hi = first_scratch(K)
    hc = wor_row_last(p, q, Qu, dW, idx, lo, ck, hs, hi)
    st[0] = lo[0]
    for n in range(nu.shape[0]):
        nu[n] = 0.0
    if lo[1] == 0:
        return 0
    row_first_finish(p, K, hc, hs, hi, head, hval, st)
    if lo[1] <= big:
        wor_row_recheck(p, q, Qu, idx, int(st[1]), st[5], st[6], dW, lo)
        if lo[1] == 0:
            return 0
    if race:
        wor_row_sums(p, race, head, nu, mark, st, False)
    if lo[1] > big:
        return 1
    n = int(lo[1])
    kh = int(st[2])
    for i in range(n):
        v = idx[i]
        for c in range(kh):
            if head[c] == v:
                return 3
    return 2


def wor_rows_decide(P, pr, Q, qr, ii, Qu, dW, idx, lo, K, race, big, head, hval, nu, mark, st, codes, left,
                    chk=None):
    """:func:`wor_row_decide` for the rows ``i = ii[k]`` of a frontier whose laws are the rows ``P[pr[k]]``,
    ``Q[qr[k]]`` (rows of one array each, where they are) in one call: ``codes[i]`` its code, ``left[i, :lo[i, 1]]``
    the entries left (codes 2 and 3); no return to the interpreter between rows (whose code and data a row's pass
    evicts from the caches). With ``chk`` (``(m, 2)``; None: no check) both rows of each are checked as laws in
    :func:`wor_row_last`'s pass: ``chk[i]`` the draft's and the target's totals, NaN where an entry is bad."""
    ck = check_scratch()
    for k in range(ii.shape[0]):
        i = ii[k]
        if chk is None:
            c = wor_row_decide(P[pr[k]], Q[qr[k]], Qu[i], dW[i], idx, lo[i], K, race, big, head[i], hval[i], nu[i],
                               mark, st[i])
        else:
            c = wor_row_decide(P[pr[k]], Q[qr[k]], Qu[i], dW[i], idx, lo[i], K, race, big, head[i], hval[i], nu[i],
                               mark, st[i], ck)
            chk[i, 0] = ck[CHECK_LEN - 2]
            chk[i, 1] = ck[CHECK_LEN - 1]
        codes[i] = c
        if c >= 2:
            for e in range(int(lo[i, 1])):
                left[i, e] = idx[e]


def wor_row_at(p, q, Qu, idx, top, S1, S2, w01, H, rok, pmax, theta, head, HLw):
    r""":math:`\sum_x \min(Q_u q_x, \pi_x)` over the columns ``idx`` (the entries :func:`wor_row_last` left), each
    :math:`\pi_x` by the operations of :func:`wor_row` (the same value, bit for bit)."""
    N = H.shape[0] - 1
    K = head.shape[0]
    tot = 0.0
    for k in range(idx.shape[0]):
        v = idx[k]
        x = p[v]
        p1 = second_draw_at(x, v, top, S1, S2)
        val = w01[0] * x + w01[1] * p1
        if rok:
            hit = -1
            for c in range(K):
                if head[c] == v:
                    hit = c
            if hit >= 0:
                val = val + HLw[hit]
            else:
                xr = x / pmax
                d = 0
                while d < N and xr > theta[d]:
                    d += 1
                acc = H[0]
                xn = 1.0
                for n in range(1, d + 1):
                    xn = xn * xr
                    acc = acc + H[n] * xn
                val = val + x * acc
        pv = val if val < 1.0 else 1.0
        y = Qu * q[v]
        tot += y if y < pv else pv
    return tot


def wor_rows_at(P, pr, Q, qr, ii, Qu, codes, left, lo, st, w01, H, rok, pmax, theta, head, HLw, out):
    """:func:`wor_row_at` for the rows ``i = ii[k]`` of a frontier with entries left (``codes[i] >= 2``, the entries
    ``left[i, :lo[i, 1]]``, as :func:`wor_rows_decide` wrote them) whose laws are the rows ``P[pr[k]]``, ``Q[qr[k]]``
    (rows of one array each, where they are), in one call: ``out[i]`` the row's sum over those entries (the same
    value as :func:`wor_row_at` row by row, bit for bit); other rows untouched."""
    for k in range(ii.shape[0]):
        i = ii[k]
        if codes[i] < 2:
            continue
        out[i] = wor_row_at(P[pr[k]], Q[qr[k]], Qu[i], left[i, :int(lo[i, 1])], int(st[i, 1]), st[i, 5], st[i, 6],
                            w01[i], H[i], rok, pmax[i], theta[i], head[i], HLw[i])


def rest_row(p, q, Qu, mdc, md, cols, out):
    r"""The caps of the lower depths summed over a row's children that are not candidates:
    ``out[e]`` = :math:`\sum_{x \notin \mathrm{cols}} \min(Q_u q_x, c_{e,x})`, :math:`c_{e,x}` =
    ``mdc[e] * p[x]`` (i.i.d. children: ``md`` of width 0) or ``md[e, x]`` (without replacement), over
    :data:`BLOCK` lanes (:func:`lane_total`) as :func:`iid_row`'s sums, the candidates' terms added as 0;
    nonnegative terms only, so no cancellation (what :func:`otspec.tree._bound._share` adds for the children left
    unexpanded). ``cols``: the candidates' columns, increasing. Per block the terms are formed (a loop that
    vectorises), the candidates' places zeroed, then added to the lanes."""
    V = p.shape[0]
    E = out.shape[0]
    n = cols.shape[0]
    per_entry = md.shape[1] > 0
    L = np.zeros((E, BLOCK))
    tb = np.empty(BLOCK)
    k = 0
    for v0 in range(0, V, BLOCK):
        b = min(BLOCK, V - v0)
        k1 = k
        while k1 < n and cols[k1] < v0 + b:
            k1 += 1
        for e in range(E):
            if per_entry:
                for v in range(b):
                    y = Qu * q[v0 + v]
                    c = md[e, v0 + v]
                    tb[v] = y if y < c else c
            else:
                ce = mdc[e]
                for v in range(b):
                    y = Qu * q[v0 + v]
                    c = ce * p[v0 + v]
                    tb[v] = y if y < c else c
            for kk in range(k, k1):
                tb[cols[kk] - v0] = 0.0
            Le = L[e]
            for v in range(b):
                Le[v] += tb[v]
        k = k1
    for e in range(E):
        out[e] = lane_total(L[e])


def row_address(x):
    """The address of the first entry of the float64 row ``x`` (``x.ctypes.data``; compiled, about 0.3 us a call
    against 1.3-2 us for numpy's ``ctypes`` object)."""
    return x.ctypes.data


#: Whether the kernels are compiled (numba installed); the bound reads it at each call (tests turn it off).
JIT = compile_in(globals(), ("union_block", "union_point", "iid_point", "iid_block", "iid_scratch", "iid_pi_kernel",
                             "lane_total", "check_scratch", "check_block", "check_finish",
                             "iid_sums_scratch", "iid_chain", "iid_row_sums", "iid_row", "iid_rows",
                             "second_draw_t",
                             "_wor_entries", "wor_pi_kernel", "head_insert", "head_finish", "wor_row_stats", "wor_row",
                             "wor_lower", "wor_row_last", "first_scratch", "row_first_finish", "second_draw_sums",
                             "second_draw_at", "wor_recheck_lower", "wor_row_recheck", "wor_row_decide",
                             "wor_rows_decide", "wor_row_at",
                             "wor_rows_at", "rest_row", "row_address"))


def iid_program(levels, root):
    """The classes of :meth:`otspec.tree._bound._Slots.iid_classes` as flat int64 arrays for
    :func:`iid_pi_kernel`: ``(leaf_n, lvl_start, term_start, term_child, term_cnt, root)``, each class's terms in
    the order the numpy route combines them (reversed)."""
    ids: dict = {}
    lvl_start = [0]
    leaf_n = []
    for k in levels[0]:
        ids[(0, k)] = len(ids)
        leaf_n.append(k[1])
    lvl_start.append(len(ids))
    term_start, term_child, term_cnt = [0] * len(ids), [], []
    for lev, lvl in enumerate(levels[1:], start=1):
        for k in lvl:
            ids[(lev, k)] = len(ids)
            term_start.append(len(term_child))
            for ck, cnt in reversed(k):
                term_child.append(ids[(lev - 1, ck)])
                term_cnt.append(cnt)
        lvl_start.append(len(ids))
    term_start.append(len(term_child))
    leaf_n += [0] * (len(ids) - len(leaf_n))
    a = [np.asarray(x, dtype=np.int64) for x in (leaf_n, lvl_start, term_start, term_child, term_cnt)]
    if a[3].size == 0:
        a[3], a[4] = np.zeros(1, np.int64), np.zeros(1, np.int64)
    return (*a, ids[(len(levels) - 1, root)])


# --------------------------------------------------------------------------- the exact law of a draw without replacement
def stirling_table(kmax: int, nmax: int):
    r"""``s[k, n]`` = :math:`k!\, S(n, k) / n!` (:math:`S` the Stirling numbers of the second kind): the Taylor
    coefficients :math:`(e^u - 1)^k = \sum_n s[k, n]\, u^n`, by :math:`s[k, n] = k\,(s[k, n-1] + s[k-1, n-1]) / n`."""
    s = np.zeros((kmax + 1, nmax + 1))
    s[0, 0] = 1.0
    for n in range(1, nmax + 1):
        for k in range(1, min(n, kmax) + 1):
            s[k, n] = k * (s[k, n - 1] + s[k - 1, n - 1]) / n
    return s


def race_moments(P, head, mark, pmax, nu):
    r"""Per row ``i``, with the tokens ``head[i]`` left out (the tail): ``pmax[i]``, the tail's largest probability,
    and ``nu[i, n]`` = :math:`\sum_{x} y_x^n`, :math:`y_x = p_x / p_{\max}`, ``n = 1 .. nu.shape[1] - 1``
    (:func:`race_moments_row` on each row); ``mark`` a boolean scratch of ``V`` False entries."""
    m = P.shape[0]
    K = head.shape[1]
    for i in range(m):
        for c in range(K):
            mark[head[i, c]] = True
        mx = 0.0
        for v in range(P.shape[1]):
            if not mark[v] and P[i, v] > mx:
                mx = P[i, v]
        pmax[i] = mx
        race_moments_row(P[i], mark, mx, nu[i])
        for c in range(K):
            mark[head[i, c]] = False


def race_moments_row(p, mark, mx, nu):
    r"""``nu[n]`` = :math:`\sum_{x} y_x^n`, :math:`y_x = p_x / m_x` over the entries of ``p`` not marked in
    ``mark`` (the tail; ``mx`` its largest probability; the marked entries are at least ``mx``, the head),
    ``n = 1 .. nu.shape[0] - 1``. The small tokens (:math:`y \le 10^{-2}`) over :data:`BLOCK` lanes, without
    branches, in one vectorised sweep of each block that forms each product once: ``n = 1`` split without error at
    :func:`split_point` (Rump, Ogita and Oishi, "Accurate floating-point summation part I: faithful rounding",
    SIAM J. Sci. Comput. 31(1), 2008, Lemma 3.3: :math:`q = ((\sigma + y) - \sigma)` on the grid
    :math:`2^{-52} \sigma`, :math:`y - q` exact), the lanes' :math:`\sum q` exact and their :math:`\sum (y - q)`
    (terms below :math:`2^{-53} \sigma` each) within :math:`m^2 2^{-106} \sigma` (:math:`m` a lane's entries),
    the lanes then summed compensated with the large tokens (the mass that enters :math:`e^{-m_L t}`); the powers
    2 .. 10 (:math:`y^{11} \le 10^{-22}`). The large tokens (the marked ones left out) are gathered per block into
    a list (about 2 % of an LLM's row) and add their powers from it, over 8 lanes, up to 21 for
    :math:`y \le 0.1` (:math:`y^{22} \le 10^{-22}`) and up to ``N`` above. Every power is a positive term; each
    token leaves out at most :math:`10^{-22}` of a sum that is at least 1 (the tail's largest token has
    :math:`y = 1`)."""
    N = nu.shape[0] - 1
    for n in range(N + 1):
        nu[n] = 0.0
    if mx <= 0.0:
        return
    V = p.shape[0]
    inv = 1.0 / mx
    sig = split_point(V)
    s0, s1, yb, A, big = moments_scratch(V)
    k = 0
    for v0 in range(0, V, BLOCK):
        b = min(BLOCK, V - v0)
        k = moments_block(p[v0:v0 + b], mark[v0:v0 + b], b, inv, sig, s0, s1, yb, A, big, k)
    moments_finish(s0, s1, A, big, k, nu)


def split_point(V):
    r""":math:`\sigma` of :func:`race_moments_row`'s error-free split of a row of ``V`` entries: the least power of 2
    at least :math:`m \cdot 10^{-2}` (:math:`m = \lceil V / \mathrm{BLOCK} \rceil` entries a lane, each at most
    :math:`10^{-2}`), so that a lane's parts :math:`q`, multiples of :math:`2^{-52} \sigma`, add up exactly (their
    sum stays below :math:`2 \sigma = 2^{53} \cdot 2^{-52} \sigma`)."""
    m = (V + BLOCK - 1) // BLOCK
    bound = m * 1e-2
    sig = 2.0**-6                                       # 0.015625 >= 1e-2
    while sig < bound:
        sig *= 2.0
    return sig


def moments_scratch(V):
    """The lanes of :func:`moments_block` (the sums of the split's parts :math:`q` and :math:`y - q`, the block's
    small tokens, the powers 2 .. 10) and the list of the large tokens (one slot past the last written)."""
    return np.zeros(BLOCK), np.zeros(BLOCK), np.zeros(BLOCK), np.zeros((11, BLOCK)), np.empty(V + 1)


def moments_block(pb, mb, b, inv, sig, s0, s1, yb, A, big, k):
    r"""One block of :func:`race_moments_row` (``pb`` the row's columns, ``mb`` their marks, ``inv`` = 1 / the
    tail's largest probability, ``sig`` = :func:`split_point`): the lanes updated with the tokens
    :math:`y = p\, \mathrm{inv} \le 10^{-2}` (0 for the others and for a NaN, :math:`0 \cdot \infty`), the block's
    unmarked tokens with :math:`y > 10^{-2}` appended to ``big[k:]``; the new ``k``."""
    m = 0
    for v in range(b):
        y = pb[v] * inv
        w = y if y <= 1e-2 else 0.0
        yb[v] = w
        q = (sig + w) - sig                         # error-free split: q exact on its grid, w - q exact
        s0[v] += q
        s1[v] += w - q
        m += 1 if y > 1e-2 else 0
    A2 = A[2]
    A3 = A[3]
    A4 = A[4]
    A5 = A[5]
    A6 = A[6]
    A7 = A[7]
    A8 = A[8]
    A9 = A[9]
    A10 = A[10]
    for v in range(b):                             # the powers 2 .. 10 of the small tokens, each product once
        w = yb[v]
        y2 = w * w
        y3 = y2 * w
        y4 = y2 * y2
        y8 = y4 * y4
        A2[v] += y2
        A3[v] += y3
        A4[v] += y4
        A5[v] += y4 * w
        A6[v] += y3 * y3
        A7[v] += y4 * y3
        A8[v] += y8
        A9[v] += y8 * w
        A10[v] += y8 * y2
    if m > 0:                                      # the block's large tokens, gathered without branches
        for v in range(b):
            y = pb[v] * inv
            big[k] = y
            k += 1 if (y > 1e-2 and not mb[v]) else 0
    return k


def moments_group(pg, mg, inv, sig, s0, s1, yg, A, big, k):
    """:func:`moments_block` on :data:`GROUP` consecutive whole blocks ``pg`` (marks ``mg``, ``yg`` scratch of as
    many entries) in one sweep per stage: each lane's two sums and powers 2 .. 10 held in registers over the
    group's entries of that lane and stored once (the same additions in the same order, so the same lanes; a sweep
    per block stores 11 lanes per entry, the store port's limit); the large tokens appended in column order; the
    new ``k``."""
    m = 0
    for v in range(BLOCK):
        a0 = s0[v]
        a1 = s1[v]
        for e in range(GROUP):
            y = pg[e * BLOCK + v] * inv
            yg[e * BLOCK + v] = y
            w = y if y <= 1e-2 else 0.0
            q = (sig + w) - sig                    # error-free split: q exact on its grid, w - q exact
            a0 += q
            a1 += w - q
            m += 1 if y > 1e-2 else 0
        s0[v] = a0
        s1[v] = a1
    A2 = A[2]
    A3 = A[3]
    A4 = A[4]
    A5 = A[5]
    A6 = A[6]
    A7 = A[7]
    A8 = A[8]
    A9 = A[9]
    A10 = A[10]
    for v in range(BLOCK):                         # the powers 2 .. 10 of the small tokens, each product once
        a2 = A2[v]
        a3 = A3[v]
        a4 = A4[v]
        a5 = A5[v]
        a6 = A6[v]
        a7 = A7[v]
        a8 = A8[v]
        a9 = A9[v]
        a10 = A10[v]
        for e in range(GROUP):
            w = yg[e * BLOCK + v]
            w = w if w <= 1e-2 else 0.0
            y2 = w * w
            y3 = y2 * w
            y4 = y2 * y2
            y8 = y4 * y4
            a2 += y2
            a3 += y3
            a4 += y4
            a5 += y4 * w
            a6 += y3 * y3
            a7 += y4 * y3
            a8 += y8
            a9 += y8 * w
            a10 += y8 * y2
        A2[v] = a2
        A3[v] = a3
        A4[v] = a4
        A5[v] = a5
        A6[v] = a6
        A7[v] = a7
        A8[v] = a8
        A9[v] = a9
        A10[v] = a10
    if m > 0:                                      # the group's large tokens, in column order
        for c0 in range(0, GROUP * BLOCK, CHUNK):    # in the chunks that hold one (counted in a vectorised sweep),
            nc = 0                                   # up to the chunk's last one
            for v in range(c0, c0 + CHUNK):
                nc += yg[v] > 1e-2
            v = c0
            while nc > 0:
                y = yg[v]
                if y > 1e-2:
                    if not mg[v]:
                        big[k] = y
                        k += 1
                    nc -= 1
                v += 1
    return k


def neumaier_add(tot, comp, y):
    """``(tot + y, comp + its rounding error)`` (Neumaier's compensated step)."""
    t = tot + y
    comp += ((tot - t) + y) if abs(tot) >= abs(y) else ((y - t) + tot)
    return t, comp


def moments_finish(s0, s1, A, big, k, nu):
    """The power sums ``nu[1:]`` from the lanes of :func:`moments_block` and the ``k`` large tokens ``big[:k]``:
    ``nu[1]`` the lanes' exact sums of the parts :math:`q`, the large tokens and the lanes' sums of :math:`y - q`
    added compensated (Neumaier), the corrections last."""
    N = nu.shape[0] - 1
    tot = 0.0
    comp = 0.0
    for v in range(BLOCK):
        tot, comp = neumaier_add(tot, comp, s0[v])
    for v in range(k):
        tot, comp = neumaier_add(tot, comp, big[v])
    for v in range(BLOCK):
        tot, comp = neumaier_add(tot, comp, s1[v])
    nu[1] = tot + comp
    for n in range(2, min(10, N) + 1):
        nu[n] = lane_total(A[n])
    high = np.empty(k + 1)                              # the tokens above 0.1 apart, the others kept in order
    kh = 0
    for v in range(k):
        y = big[v]
        if y > 0.1:
            high[kh] = y
            kh += 1
        else:
            big[v - kh] = y
    cur = np.empty(k + 1)
    lanes = np.zeros(8)
    gathered_powers(big[:k - kh], cur, lanes, nu, 21)
    gathered_powers(high[:kh], cur, lanes, nu, N)


def wor_row_sums(p, race, head, nu, mark, st, sums=True):
    r"""The second sweep of :func:`wor_row_stats` over a draft row ``p`` whose head is known (``head[:kh]``,
    ``st[1:4]`` = most likely token, ``kh``, the tail's largest probability, as :func:`head_finish` writes them):
    ``st[0]`` the support, ``st[4]`` the mass outside the most likely token, ``st[5]`` = :math:`S_1`, ``st[6]`` =
    :math:`S_2` (over :data:`BLOCK` lanes, :func:`lane_total`) and, with ``race``, the tail's power sums ``nu``
    (:func:`race_moments_row`'s lanes, block by block in the same sweep: the same operations on the same values, so
    the same sums). ``mark``: a boolean scratch of ``V`` False entries (left so). With ``sums`` False the power sums
    alone (``st`` read, not written: the second draw's sums taken by :func:`wor_row_last`)."""
    V = p.shape[0]
    N = nu.shape[0] - 1
    top = int(st[1])
    kh = int(st[2])
    mx = st[3]
    moments = race and mx > 0.0
    if race:
        for n in range(N + 1):
            nu[n] = 0.0
    if moments:
        for k in range(kh):
            mark[head[k]] = True
    inv = 1.0 / mx if moments else 0.0
    sig = split_point(V)
    s0, s1, yb, A, big = moments_scratch(V if moments else 0)
    yg = np.zeros(GROUP * BLOCK)
    Vg = (V // (GROUP * BLOCK)) * (GROUP * BLOCK) if moments else 0     # the columns in whole groups of blocks
    k = 0
    Lr = np.zeros(BLOCK)
    Lt = np.zeros(BLOCK)
    Ls = np.zeros(BLOCK, dtype=np.int64)
    for v0 in range(0, V, BLOCK):
        b = min(BLOCK, V - v0)
        pb = p[v0:v0 + b]
        if sums:
            for v in range(b):
                y = pb[v]
                Ls[v] += 1 if y > 0.0 else 0
                x = y if v0 + v != top else 0.0
                den = 1.0 - x
                Lr[v] += x
                Lt[v] += x / den if den > 0.0 else 0.0
        if v0 + b <= Vg:
            if (v0 + b) % (GROUP * BLOCK) == 0:      # a group's last block: the group's powers in one sweep
                g0 = v0 + b - GROUP * BLOCK
                k = moments_group(p[g0:v0 + b], mark[g0:v0 + b], inv, sig, s0, s1, yg, A, big, k)
        elif moments:
            k = moments_block(pb, mark[v0:v0 + b], b, inv, sig, s0, s1, yb, A, big, k)
    if moments:
        moments_finish(s0, s1, A, big, k, nu)
        for c in range(kh):
            mark[head[c]] = False
    if sums:
        support = 0
        for v in range(BLOCK):
            support += Ls[v]
        st[0] = support
        second_draw_sums(p, top, Lr, Lt, st)


def gathered_powers(y, cur, lanes, nu, top):
    """``nu[n] +=`` :math:`\\sum_x y_x^n` over the list ``y``, ``n = 2 .. min(top, N)``, over 8 lanes (``cur``,
    ``lanes`` scratch)."""
    k = y.shape[0]
    c = cur[:k]
    for v in range(k):
        c[v] = y[v]
    k8 = k - k % 8
    for n in range(2, min(top, nu.shape[0] - 1) + 1):
        for v in range(k):
            c[v] = c[v] * y[v]
        for l in range(8):
            lanes[l] = 0.0
        for v in range(0, k8, 8):
            for l in range(8):
                lanes[l] += c[v + l]
        for v in range(k8, k):
            lanes[v - k8] += c[v]
        nu[n] += ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]))


def race_rows(PH, kh, pmax, nu, ranks, deg, h, vlo, s, max_nodes, HL, HL2, C, C2, info, heads):
    """:func:`race_row` for each row ``i``: its ``kh[i]`` head probabilities ``PH[i]`` (decreasing), tail
    ``pmax[i]``, ``nu[i]``, the head's laws where ``heads[i]``; results in ``HL[i]``, ``HL2[i]``, ``C[i]``,
    ``C2[i]``, ``info[i]``."""
    race_rows_weighted(PH, kh, pmax, nu, ranks, np.zeros((PH.shape[0], 0)), deg, h, vlo, s, max_nodes, HL, HL2, C, C2,
                       info, heads)


def race_rows_weighted(PH, kh, pmax, nu, ranks, wts, deg, h, vlo, s, max_nodes, HL, HL2, C, C2, info, heads):
    r""":func:`race_rows` with the ranks' laws combined by the slot weights ``wts[i]`` (``(m, ranks)``; with no
    columns, each rank's own): ``HL[i, 0]``, ``C[i, 0]`` (and ``HL2``, ``C2``) the combinations
    :math:`\sum_k w_k \ell_{r_k}` of the head's laws and of the tail's Taylor coefficients, what :math:`\pi`
    reads at the last expanded depth (:func:`race_row`)."""
    m = PH.shape[0]
    K = PH.shape[1]
    ph = np.zeros(K)
    pre = np.zeros((K + 1, deg + 1))
    suf = np.zeros((K + 1, deg + 1))
    pb = np.zeros(deg + 1)
    a = np.zeros(K)
    b = np.zeros(K)
    pw = np.zeros(deg + 1)
    E = np.zeros(deg + 1)
    gw = np.zeros(deg + 1)
    for i in range(m):
        k = kh[i]
        for c in range(k):
            ph[c] = PH[i, c]
        race_row(ph[:k], pmax[i], nu[i], ranks, wts[i], deg, h, vlo, s, max_nodes, HL[i], HL2[i], C[i], C2[i], pre,
                 suf, pb, a, b, pw, E, gw, info[i], heads[i])


def race_row(ph, pmax, nu, ranks, wts, deg, h, vlo, s, max_nodes, HL, HL2, C, C2, pre, suf, pb, a, b, pw, E, gw, info,
             heads):
    r"""The laws of the draws of the ranks ``ranks`` (all >= 2) without replacement from one row, by the
    exponential race: the ``K`` head tokens ``ph`` (decreasing) exactly, the tail (largest probability ``pmax``,
    scaled power sums ``nu``) as Taylor coefficients in :math:`x = p / p_{\max}`.

    With :math:`N(t)` the number of clocks (token ``x`` rings at rate :math:`p_x`) rung by ``t`` and
    :math:`\mathrm{PB}_j(t) = P(N(t) = j)`,

    .. math::

        P(\text{draw } r = y) = p_y \int_0^\infty e^{-p_y t}\, P(N_{-y}(t) = r)\, dt
        = p_y \int_0^\infty [z^r] \frac{\mathrm{PB}(t, z)}{1 + w_y(t) z}\, dt, \quad w_y = e^{p_y t} - 1:

    ``HL[k, c]`` the first form for head token ``c`` (:math:`N_{-y}` from prefix and suffix products, positive
    terms); ``C[k, n]`` the Taylor coefficients of the second over :math:`p_y`
    (:math:`[p^n] w^k = s[k, n]\, t^n`), so the law of a tail token is :math:`p \sum_n C[k, n]\, x^n`. The tail's
    generating function :math:`e^{-m_L t} \exp(\sum_j (-1)^{j+1} z^j P_j / j)` from its power sums
    :math:`P_j = \sum_x (e^{p_x t} - 1)^j = \sum_n s[j, n]\, (p_{\max} t)^n \nu_n`. The trapezoidal rule in
    :math:`\log t` with step ``h`` from ``vlo`` (``HL2``/``C2`` the same with step ``2h``, kept for comparison), until
    the nodes left out on the right add at most :data:`RACE_RIGHT_TOL` :math:`p_y` to any law (a proven bound,
    :func:`race_right_sum`, checked once :math:`G(t) = t\, P(N(t) \le \mathrm{deg})`, times :math:`e^{-p_{\min} t}`
    without a tail, is below 1e-12 of its largest value; at most ``max_nodes`` nodes, none beyond
    :math:`t = e^{500}`, :data:`RACE_LOG_TMAX`). ``info`` = (last ``t``, nodes, done). Without ``heads``
    the head's laws are left 0 (rows whose head tokens need no law: the prefix products and the head's terms
    skipped).

    Without ``heads`` only the whole suffix product :math:`\mathrm{PB}` is kept, rolled in one buffer (the same
    products and sums, so the same values). Each head clock's :math:`e^{-p t}` and :math:`1 - e^{-p t}` from one
    exponential: the smaller of the two from ``exp`` or ``expm1``, the other as 1 minus it (at least 1/2, so
    within two roundings).

    With weights ``wts`` (one per rank; empty: each rank's own laws) only their combination is kept:
    ``HL[0, c]``, ``C[0, n]`` (``HL2``, ``C2``) = :math:`\sum_k w_k` of the ranks' values, the same integrals with
    the sum over the ranks taken inside: per node the head token's :math:`\sum_k w_k \sum_j \mathrm{pre}_j\,
    \mathrm{suf}_{r_k - j}` and, for the tail, :math:`g_q = \sum_k w_k \mathrm{PB}_{r_k - q}` once, then
    :math:`\sum_q (-1)^q s[q, n]\, g_q` per degree (about ``deg`` products per degree instead of the ranks'
    ``sum_k min(r_k, n)``); equal to the weighted sum of the ranks' coefficients up to rounding (the order of the
    additions)."""
    K = ph.shape[0]
    nk = ranks.shape[0]
    comb = wts.shape[0] > 0
    no = 1 if comb else nk                         # the laws kept: the combination, or one per rank
    rtop = 0
    for k in range(nk):
        rtop = ranks[k] if ranks[k] > rtop else rtop
    N = nu.shape[0] - 1
    mL = pmax * nu[1]
    smax = np.zeros(N + 1)                         # the largest s[j, n] over j: terms below 1e-30 end the sums
    for n in range(N + 1):
        for j in range(s.shape[0]):
            if s[j, n] > smax[n]:
                smax[n] = s[j, n]
    tail = mL > 0.0
    pmin = ph[K - 1] if K > 0 else 0.0
    rate = race_right_rate(ph, pmax, mL, deg, tail)
    for k in range(no):
        for c in range(K):
            HL[k, c] = 0.0
            HL2[k, c] = 0.0
        for n in range(N + 1):
            C[k, n] = 0.0
            C2[k, n] = 0.0
    gmax = 0.0
    t = 0.0
    done = False
    i = 0
    while i < max_nodes and vlo + i * h <= RACE_LOG_TMAX:
        t = np.exp(vlo + i * h)
        wt = h * t
        even = i % 2 == 0
        # the tail's generating function E (degrees 0 .. deg)
        for j in range(deg + 1):
            pw[j] = 0.0
            E[j] = 0.0
        if tail:
            u = pmax * t
            un = 1.0
            for n in range(1, N + 1):
                un *= u
                tn = un * nu[n]
                if tn * smax[n] < 1e-30 * nu[1]:
                    break
                for j in range(1, min(n, deg) + 1):
                    pw[j] += s[j, n] * tn
            E[0] = np.exp(-mL * t)
            for k in range(1, deg + 1):
                acc = 0.0
                for j in range(1, k + 1):
                    term = pw[j] * E[k - j]
                    acc = acc + term if j % 2 == 1 else acc - term
                E[k] = acc / k
        else:
            E[0] = 1.0
        # head clocks; suffix products from the tail's function, prefix products from 1
        for c in range(K):
            xe = ph[c] * t
            if xe <= 0.6931471805599453:
                b[c] = -np.expm1(-xe)
                a[c] = 1.0 - b[c]
            else:
                a[c] = np.exp(-xe)
                b[c] = 1.0 - a[c]
        if heads:
            for j in range(deg + 1):
                suf[K, j] = E[j]
                pre[0, j] = 0.0
            pre[0, 0] = 1.0
            for c in range(K - 1, -1, -1):
                suf[c, 0] = a[c] * suf[c + 1, 0]
                for j in range(1, deg + 1):
                    suf[c, j] = a[c] * suf[c + 1, j] + b[c] * suf[c + 1, j - 1]
            for c in range(K):
                pre[c + 1, 0] = a[c] * pre[c, 0]
                for j in range(1, deg + 1):
                    pre[c + 1, j] = a[c] * pre[c, j] + b[c] * pre[c, j - 1]
            for j in range(deg + 1):
                pb[j] = suf[0, j]
        else:
            # no head token's law read: the whole suffix product alone, rolled in place (the same operations on
            # the same values as the rows of ``suf``, degrees from the top so that each reads the one below)
            for j in range(deg + 1):
                pb[j] = E[j]
            for c in range(K - 1, -1, -1):
                ac = a[c]
                bc = b[c]
                for j in range(deg, 0, -1):
                    pb[j] = ac * pb[j] + bc * pb[j - 1]
                pb[0] = ac * pb[0]
        g = 0.0
        for j in range(deg + 1):
            g += pb[j]
        # head tokens
        for c in range(K if heads else 0):
            f = wt * ph[c] * a[c]
            if comb:
                val = 0.0
                for k in range(nk):
                    r = ranks[k]
                    vk = 0.0
                    for j in range(r + 1):
                        vk += pre[c, j] * suf[c + 1, r - j]
                    val += wts[k] * vk
                HL[0, c] += f * val
                if even:
                    HL2[0, c] += 2.0 * f * val
                continue
            for k in range(nk):
                r = ranks[k]
                val = 0.0
                for j in range(r + 1):
                    val += pre[c, j] * suf[c + 1, r - j]
                HL[k, c] += f * val
                if even:
                    HL2[k, c] += 2.0 * f * val
        # tail coefficients
        if tail and comb:
            # the ranks combined first: g_q = sum_k w_k PB_{r_k - q}, then one sum over q per degree
            for q in range(rtop + 1):
                gw[q] = 0.0
            for k in range(nk):
                r = ranks[k]
                for q in range(r + 1):
                    gw[q] += wts[k] * pb[r - q]
            tail_terms(gw, rtop, pmax * t, wt, even, smax, s, C[0], C2[0])
        elif tail:
            u = pmax * t
            for k in range(nk):
                r = ranks[k]
                for q in range(r + 1):
                    gw[q] = pb[r - q]
                tail_terms(gw, r, u, wt, even, smax, s, C[k], C2[k])
        G = t * g if tail else t * g * np.exp(-pmin * t)
        if G > gmax:
            gmax = G
        elif G <= 1e-12 * gmax and h * G * race_right_sum(t, rate, h, deg) <= RACE_RIGHT_TOL:
            done = True                            # the nodes after this one add at most RACE_RIGHT_TOL p_y
            break
        i += 1
    info[0] = t
    info[1] = i + 1
    info[2] = 1.0 if done else 0.0


#: The nodes that the race's quadrature leaves out on the right add at most this times :math:`p_y` to any law.
RACE_RIGHT_TOL = 1e-17
#: The race's last node at most :math:`t = e^{500}` (the products and sums of a node stay finite; a row whose right
#: end is not reached there, e.g. one whose mass outside the largest probabilities is 1e-300, is refused).
RACE_LOG_TMAX = 500.0


def race_right_rate(ph, pmax, mL, deg, tail):
    r"""The decay rate :math:`\nu` of :func:`race_right_sum` for one row (:func:`race_row`'s ``K`` head
    probabilities ``ph``, decreasing, and a tail of mass ``mL`` whose largest probability is ``pmax``): the mass
    :math:`\mu` outside the row's ``deg`` largest probabilities (the head's from place ``deg`` on plus the tail's;
    where the head holds fewer than ``deg`` tokens, the tail's mass less ``deg - K`` times ``pmax``, at least 0),
    lowered by a relative :math:`10^{-9}` (the rounding of these few sums); without a tail plus the smallest
    probability :math:`p_{\min}` of the head (every law's :math:`e^{-p_y t} \le e^{-p_{\min} t}`)."""
    K = ph.shape[0]
    mu = 0.0
    for c in range(deg, K):
        mu += ph[c]
    if tail:
        mu += mL if deg <= K else mL - (deg - K) * pmax
    mu = max(mu, 0.0) * (1.0 - 1e-9)
    if not tail and K > 0:
        mu += ph[K - 1] * (1.0 - 1e-9)
    return mu


def race_right_sum(T, rate, h, deg):
    r"""An upper bound on :math:`\sum_{k \ge 1} G(T e^{kh}) / G(T)`, :math:`G(t) = t\, P(N(t) \le d)` (times
    :math:`e^{-p_{\min} t}` without a tail; ``d`` = ``deg``), for the nodes after ``T`` of :func:`race_row`: with
    :math:`\lambda \ge 1`, :math:`1 - a^\lambda \le \lambda (1 - a)` for each clock's :math:`a = e^{-p_x T}`
    and :math:`\prod_{x \notin S} a_x^{\lambda - 1} \le e^{-(\lambda - 1) T \mu}` for every set :math:`S` of at
    most ``d`` rung clocks (:math:`\mu` the mass outside the ``d`` largest probabilities), so
    :math:`G(\lambda T) \le \lambda^{d+1} e^{-(\lambda - 1) T \nu} G(T)` (``rate`` :math:`\nu`,
    :func:`race_right_rate`). The sum of :math:`e^{kh(d+1) - (e^{kh} - 1) T \nu}` over :math:`k \ge 1`: its
    exponent is concave in ``k``, so the ratios of successive terms decrease, and once one is at most 1/2 the rest
    is at most the last term (raised by a relative 1e-12 for the rounding); infinite where that is not reached
    within 4000 terms, where a term would overflow, or without decay (:math:`\nu = 0`). Every law's terms at those
    nodes are at most :math:`h\, p_y\, G` (:math:`e^{-p_y t} P(N_{-y}(t) = r) \le P(N(t) \le d)`)."""
    if not rate > 0.0:
        return np.inf
    acc = 0.0
    em = np.expm1(h)
    for k in range(1, 4001):
        lam = np.exp(k * h)
        x = k * h * (deg + 1) - (lam - 1.0) * T * rate
        if x > 700.0:
            return np.inf
        term = np.exp(x)
        acc += term
        if h * (deg + 1) - lam * em * T * rate <= -0.6931471805599453:
            return (acc + term) * (1.0 + 1e-12)
    return np.inf


def tail_terms(g, rq, u, wt, even, smax, s, Ck, C2k):
    r"""One node's terms of the tail's Taylor coefficients (:func:`race_row`), added to ``Ck`` (and ``C2k`` twice on
    even nodes): degree 0 ``wt g[0]``, degree ``n`` :math:`\mathrm{wt}\, u^n \sum_{q=1}^{\min(rq, n)} (-1)^q
    s[q, n]\, g_q` (``u`` = :math:`p_{\max} t`), until :math:`u^n \max_j s[j, n] < 10^{-30}`. ``g_q`` is
    :math:`\mathrm{PB}_{r - q}` for one rank ``r = rq``, or the ranks' weighted :math:`\sum_k w_k \mathrm{PB}_{r_k -
    q}`."""
    N = Ck.shape[0] - 1
    Ck[0] += wt * g[0]
    if even:
        C2k[0] += 2.0 * wt * g[0]
    un = 1.0
    for n in range(1, N + 1):
        un *= u
        if un * smax[n] < 1e-30:
            break
        acc = 0.0
        for q in range(1, min(rq, n) + 1):
            term = s[q, n] * g[q]
            acc = acc - term if q % 2 == 1 else acc + term
        d = wt * un * acc
        Ck[n] += d
        if even:
            C2k[n] += 2.0 * d


def race_left_end(ph, pmax, nu, ranks, wts, want, h, t0, HL, HL2, C, C2):
    r"""The bound of :func:`otspec.tree._bound._left_end` on the trapezoidal rule's nodes before ``t0`` (the proof
    there), added in place, row by row: per row the elementary symmetric polynomials :math:`e_k(p)`, ``k <=
    max(ranks) + 1``, of the whole row (the tail's from its power sums :math:`p_{\max}^i \nu_i` by Newton's
    identities, times the head's factors :math:`1 + p_c z`), each head token's :math:`e_k(p_{-c})` by dividing
    out its factor, and for each rank ``r`` and step (``h`` into ``HL``/``C``, ``2h`` into ``HL2``/``C2``, with
    :math:`S_m = \mathrm{step}\, t_0^m / (e^{m\, \mathrm{step}} - 1)`, :math:`A = S_{r+1} - s S_{r+2} + c
    S_{r+3}`, :math:`c = (s/6 + s^2/2)(1 + 10^{-9})`, :math:`s = e_1(p)`): a head token's :math:`p_c (A e_r +
    \tfrac12 S_{r+2} ((s - p_c) e_r - (r+1) e_{r+1}) + 10^{-12} S_{r+1})` (:math:`e_k = e_k(p_{-c})`, where
    ``want``), and the same polynomial in :math:`p_y = p_{\max} x` for a tail token (:math:`e_k(p_{-y}) =
    \sum_{j \le k} (-p_y)^j e_{k-j}(p)`) added to ``C[i, ., 0 .. r + 1]`` times :math:`p_{\max}^j`. With weights
    ``wts`` (``(n, ranks)``; no columns: each rank's own) their combination into ``[:, 0]``."""
    n = ph.shape[0]
    K = ph.shape[1]
    nk = ranks.shape[0]
    comb = wts.shape[1] > 0
    R = 0
    for k in range(nk):
        R = ranks[k] if ranks[k] > R else R
    R += 1
    e = np.zeros(R + 1)
    eh = np.zeros((K, R + 1))
    Er = np.zeros(R + 2)
    Er1 = np.zeros(R + 2)
    for i in range(n):
        pm = pmax[i]
        for k in range(R + 1):
            e[k] = 0.0
        e[0] = 1.0
        for k in range(1, R + 1):                       # Newton's identities: the tail's e_k
            acc = 0.0
            pw = 1.0
            for j in range(1, k + 1):
                pw = pw * pm
                term = e[k - j] * (pw * nu[i, j]) if pm > 0.0 else 0.0
                acc = acc + term if j % 2 == 1 else acc - term
            e[k] = acc / k
        for c in range(K):                              # times the head's factors (1 + p_c z)
            x = ph[i, c]
            for k in range(R, 0, -1):
                e[k] = e[k] + x * e[k - 1]
        for c in range(K):                              # e_k(p_{-c})
            eh[c, 0] = 1.0
            for k in range(1, R + 1):
                eh[c, k] = e[k] - ph[i, c] * eh[c, k - 1]
        s = e[1]
        cc = (s / 6.0 + s * s / 2.0) * (1.0 + 1e-9)
        for half in range(2):
            st = h if half == 0 else 2.0 * h
            Hk = HL if half == 0 else HL2
            Ck = C if half == 0 else C2
            for kk in range(nk):
                r = ranks[kk]
                w = wts[i, kk] if comb else 1.0
                o = 0 if comb else kk
                S1 = st * t0 ** (r + 1) / np.expm1((r + 1) * st)
                S2 = st * t0 ** (r + 2) / np.expm1((r + 2) * st)
                S3 = st * t0 ** (r + 3) / np.expm1((r + 3) * st)
                A = S1 - s * S2 + cc * S3
                if want[i]:
                    for c in range(K):
                        x = ph[i, c]
                        er = eh[c, r]
                        v = A * er + 0.5 * S2 * ((s - x) * er - (r + 1) * eh[c, r + 1]) + 1e-12 * S1
                        Hk[i, o, c] += w * (x * v)
                for j in range(r + 2):
                    sg = 1.0 if j % 2 == 0 else -1.0
                    Er[j] = sg * e[r - j] if j <= r else 0.0
                    Er1[j] = sg * e[r + 1 - j]
                pj = 1.0
                for j in range(r + 2):
                    sEr = s * Er[j] - (Er[j - 1] if j > 0 else 0.0)
                    v = A * Er[j] + 0.5 * S2 * (sEr - (r + 1) * Er1[j])
                    if j == 0:
                        v += 1e-12 * S1
                    Ck[i, o, j] += w * (v * pj)
                    pj = pj * pm if pm > 0.0 else 0.0


def race_thresholds(C, out):
    r"""``out[i, d]`` (``(m, N + 1)``): entries of row ``i`` with :math:`x \le \theta_d` need the Taylor terms
    of the race's coefficients ``C`` (``(m, ranks, N + 1)``) up to degree ``d`` only, as
    :func:`otspec.tree._bound._race_thresholds` by numpy and with the same operations, so the same values: per rank
    the tail sums :math:`\sum_{n > d} |C_n|` added from the top degree down, :math:`(10^{-17} C_0 / \mathrm{rest})
    ^{1/(d+1)}` where the rest is positive (else infinite), the smallest over the ranks (NaN where any is NaN), the
    last infinite, then the running minimum from the top degree down (NaN carried down)."""
    m, nk, N1 = C.shape
    N = N1 - 1
    above = np.zeros(N1)
    for i in range(m):
        for d in range(N1):
            out[i, d] = np.inf
        for k in range(nk):
            acc = 0.0
            for n in range(N, -1, -1):                   # above[n] = sum_{n' >= n} |C_n'|, numpy's cumsum order
                acc = acc + abs(C[i, k, n])
                above[n] = acc
            c0 = 1e-17 * C[i, k, 0]
            for d in range(N):
                rest = above[d + 1]
                v = (c0 / rest) ** (1.0 / (d + 1)) if rest > 0 else np.inf
                if v != v or v < out[i, d]:              # numpy's min: NaN wins
                    out[i, d] = v
        for d in range(N - 1, -1, -1):                   # the running minimum from the top (NaN carried)
            v = out[i, d + 1]
            if v != v or v < out[i, d]:
                out[i, d] = v


def race_at(p, pmax, theta, C, head, HL, rows, cols, kk, out):
    r"""The race's law of its ``kk``-th rank at the entries ``(rows[e], cols[e])`` of draft values ``p[e]`` (as
    :func:`otspec.tree._bound._race_at` by numpy, the same operations: :math:`p \sum_{n \le d} C_n x^n`,
    :math:`x = p / p_{\max}`, ``d`` the thresholds ``theta`` below ``x``; a head token's law ``HL`` itself), into
    ``out``."""
    K = head.shape[1]
    for e in range(p.shape[0]):
        i = rows[e]
        x = p[e] / pmax[i]
        d = 0
        for n in range(theta.shape[1] - 1):
            d += 1 if x > theta[i, n] else 0
        acc = 0.0 + C[i, kk, 0]
        pw = 1.0
        for n in range(1, d + 1):
            pw = pw * x
            acc = acc + C[i, kk, n] * pw
        out[e] = p[e] * acc
        for c in range(K):
            if head[i, c] == cols[e]:
                out[e] = HL[i, kk, c]


#: Whether the race's row kernels are compiled (numba installed); they serve the fused and the numpy route alike.
RACE_JIT = compile_in(globals(), ("gathered_powers", "split_point", "moments_scratch", "moments_block",
                                  "neumaier_add", "moments_finish",
                                  "race_moments_row", "race_moments", "moments_group", "wor_row_sums", "tail_terms",
                                  "race_row", "race_rows",
                                  "race_rows_weighted", "race_at", "race_left_end", "race_thresholds",
                                  "race_right_rate", "race_right_sum"))


def exact_sum(x, n, part):
    """``math.fsum(x[:n])`` bit for bit, for finite ``x`` whose partial sums stay finite: CPython's ``msum``
    (Shewchuk, "Adaptive precision floating-point arithmetic and fast robust geometric predicates", 1997: the sum
    held exactly as non-overlapping partials, ``part`` a scratch of at least ``n + 1``), rounded once, half to even
    across the partials as CPython does; 0.0 for ``n = 0``."""
    m = 0
    for k in range(n):
        xv = x[k]
        i = 0
        for j in range(m):
            y = part[j]
            if abs(xv) < abs(y):
                xv, y = y, xv
            hi = xv + y
            lo = y - (hi - xv)
            if lo != 0.0:
                part[i] = lo
                i += 1
            xv = hi
        m = i
        if xv != 0.0:
            part[m] = xv
            m += 1
    hi = 0.0
    if m > 0:
        m -= 1
        hi = part[m]
        lo = 0.0
        while m > 0:
            xv = hi
            m -= 1
            y = part[m]
            hi = xv + y
            lo = y - (hi - xv)
            if lo != 0.0:
                break
        if m > 0 and ((lo < 0.0 and part[m - 1] < 0.0) or (lo > 0.0 and part[m - 1] > 0.0)):
            y = lo * 2.0
            xv = hi + y
            if y == xv - hi:
                hi = xv
    return hi


def wor_enumerate(vals, tok, need, off, binom, ranks, seqs, w_out, e):
    r"""Every ordered draw of ``need >= 1`` distinct positions of ``vals`` (the support's masses, tokens ``tok``)
    without replacement, depth first by increasing position (``itertools.permutations``' order), with its
    probability :math:`\prod_j v_{x_j} / L(\{x_0, \dots, x_{j-1}\})` formed as the sequential product
    ``w = w * (v / L)`` from ``w = 1.0``, :math:`L(S)` the mass not drawn (:func:`exact_sum` of the others, once a
    drawn set: entry ``off[|S|] + rank(S)`` of a memo, ``rank`` the combinatorial number system's
    :math:`\sum_i \binom{c_i}{i + 1}` of the sorted positions, ``binom[c, i]`` = :math:`\binom{c}{i}`). The draws'
    tokens and probabilities into ``seqs``, ``w_out`` (when they have rows), and, in the same order,
    ``e[k, tok[x_{ranks[k]}]] += w`` (when ``e`` has rows). Returns the number of sums formed."""
    n = vals.shape[0]
    left = np.empty(off[need])
    known = np.zeros(off[need], dtype=np.bool_)
    used = np.zeros(n, dtype=np.bool_)
    pos = np.empty(need, dtype=np.int64)
    srt = np.empty(need, dtype=np.int64)
    den = np.empty(need)
    wd = np.empty(need + 1)
    buf = np.empty(n)
    part = np.empty(n + 1)
    sums = 1
    den[0] = exact_sum(vals, n, part)
    wd[0] = 1.0
    cnt = 0
    d = 0
    pos[0] = -1
    while d >= 0:
        j = pos[d] + 1
        while j < n and used[j]:
            j += 1
        if j >= n:                                      # this prefix's continuations done: back up a draw
            d -= 1
            if d >= 0:
                used[pos[d]] = False
            continue
        pos[d] = j
        w = wd[d] * (vals[j] / den[d])
        if d == need - 1:
            if seqs.shape[0] > 0:
                for r in range(need):
                    seqs[cnt, r] = tok[pos[r]]
                w_out[cnt] = w
            for k in range(e.shape[0]):
                e[k, tok[pos[ranks[k]]]] += w
            cnt += 1
            continue
        used[j] = True
        wd[d + 1] = w
        for i in range(d + 1):                          # the drawn set, sorted
            srt[i] = pos[i]
        for i in range(1, d + 1):
            v = srt[i]
            a = i
            while a > 0 and srt[a - 1] > v:
                srt[a] = srt[a - 1]
                a -= 1
            srt[a] = v
        rk = off[d + 1]
        for i in range(d + 1):
            rk += binom[srt[i], i + 1]
        if not known[rk]:
            m = 0
            for x in range(n):
                if not used[x]:
                    buf[m] = vals[x]
                    m += 1
            left[rk] = exact_sum(buf, m, part)
            known[rk] = True
            sums += 1
        den[d + 1] = left[rk]
        d += 1
        pos[d] = -1
    return sums


#: Whether the enumeration of the draws without replacement is compiled (numba installed); else
#: :func:`otspec.tree._process._wor_blocks` forms them by numpy.
WOR_JIT = compile_in(globals(), ("exact_sum", "wor_enumerate"))
