r"""Exact per-position quantities of a profile, from the laws of one drawn draft tree.

At a context ``c`` the profile holds ``k_max`` i.i.d. draft blocks ``X``
(``(k_max, L_max)`` token ids), the draft laws along them ``P`` (``(k_max,
L_max, V)``, ``P[r, j] = p(. | c, X[r, :j])``) and the target laws ``Q``
(``(k_max, L_max + 1, V)``). From these alone, exactly (float64):

* per depth ``j`` along the first block and every ``k``: each token-level
  verifier's acceptance :math:`P(Y \in S(X))` at ``(P[0, j], Q[0, j], k)``
  (batched closed forms where they exist; the lossy rules also with the
  total variation and :math:`\mathrm{KL}(q \| \text{output})` of their output law);
* for every scheme, ``k`` and ``L``: :math:`E[\tau_L \mid X]`, the expected
  number of accepted draft tokens given the drawn drafts.

The laws may be numpy arrays or any array-API arrays (torch tensors, on the
CPU or a GPU): the batched quantities (:math:`\alpha_k`, the maximal
coupling, k-Seq's acceptance, token and block verification's
:math:`E[\tau \mid X]`) are computed in the laws' namespace on their device
and only their ``(L,)`` values come back to the host; so are the costly
quantities that have closed forms (:mod:`otspec.profile._quantities_batched`:
multi-round, greedy and top-k draft sets, typical acceptance per depth, and
the conditional laws of k-Seq, multi-round and typical acceptance at every
node of the tree, and of the optimal verifier and Khisti et al.'s rule at
every node with one draft); the quantities that still build a verifier per
node (the optimal verifier and Khisti et al.'s at the nodes with several
drafts, the without-replacement optimum, a k-Seq at a given ``rho``,
mentored decoding, ...) read a host copy of the laws, made on first use.

Notation: ``p`` is the draft's law, ``q`` the target's.
"""

from __future__ import annotations

import math
import weakref

import array_api_compat
import numpy as np

from .._array import namespace, to_host
from .._registry import get_verifier
from .._validation import NEGLIGIBLE
from ..block._weights import chains_lost, path_weight_rows
from ..lossy._mentored import kl_divergence
from ..multidraft._batched import _accepted_mass, _kseq_value, batched_maximal_coupling_acceptance
from ..otm._alpha import alpha_k
from ..otm._without_replacement import alpha_k_without_replacement
from ._quantities_batched import (
    ACC_BATCHED,
    REACH_BATCHED,
    REACH_ONE_DRAFT,
    RhoStar,
    acceptance_rows,
    node_conditional,
    node_rows,
    reach_nodes,
    reach_parts,
)

__all__ = ["Builds", "drop_null_columns", "depth_quantities", "expected_accepted", "tree_reach", "block_path_laws",
           "block_path_laws_stack", "to_host", "text_probs", "text_probs_where", "tokens_like",
           "prefill_batched", "acc_part", "reach_part",
           "read_parts", "support_to_host", "support_part", "support_parts", "support_width", "needs_host"]


def tokens_like(laws, y) -> object:
    """Token ids ``y`` (``(...,)`` ints) as an int64 ``(..., 1)`` array of the laws' namespace, on their device."""
    y = np.asarray(y, dtype=np.int64)[..., None]
    if isinstance(laws, np.ndarray):
        return y
    import array_api_compat

    return array_api_compat.array_namespace(laws).asarray(y, device=array_api_compat.device(laws))


def text_probs(laws, y) -> np.ndarray:
    """``laws[..., t, y[..., t]]``: each row's law at its token, gathered in the laws' namespace (on their device),
    the ``(..., T)`` float64 values in host memory (:func:`text_probs_where`, read)."""
    return to_host(text_probs_where(laws, y))


def text_probs_where(laws, y):
    """:func:`text_probs` left unread: the ``(..., T)`` values in the laws' namespace, on their device (numpy for
    host laws)."""
    if not hasattr(laws, "shape"):
        laws = np.asarray(laws, dtype=np.float64)
    if array_api_compat.is_torch_array(laws):  # torch's own gather, without the array-API wrapper's index arithmetic
        import torch

        return torch.gather(laws, -1, tokens_like(laws, y))[..., 0]
    return namespace(laws).take_along_axis(laws, tokens_like(laws, y), axis=-1)[..., 0]


def _compress(p: np.ndarray, q: np.ndarray):
    """The union support of ``p`` and ``q`` and both restricted to it, renormalised (as the decoding loop does)."""
    keep = (p > 0) | (q > 0)
    if keep.all():
        return None, p / p.sum(), q / q.sum()
    idx = np.flatnonzero(keep)
    pc, qc = p[idx], q[idx]
    return idx, pc / pc.sum(), qc / qc.sum()


def drop_null_columns(P: np.ndarray, Q: np.ndarray, X: np.ndarray | None = None):
    r"""The laws restricted to the tokens that carry mass somewhere, and the token ids mapped there.

    .. math::

        S = \{x : \exists\, i,\ P_i(x) > 0 \text{ or } Q_i(x) > 0\}, \qquad
        (P, Q, X) \mapsto (P_{\cdot, S},\ Q_{\cdot, S},\ \text{rank of } X \text{ in } S).

    Every quantity of a profile is a sum over tokens of terms that vanish
    where both laws vanish, and ties are broken by token order, which the
    restriction keeps; so the restricted laws give the same values (to float64
    summation order) at the cost of ``|S|`` instead of ``V`` columns: with
    top-k sampling ``|S|`` is at most ``top_k`` times the number of rows.

    Parameters
    ----------
    P, Q : ndarray
        Laws ``(..., V)`` (any leading shapes, the same ``V``).
    X : ndarray of int, optional
        Token ids, all in ``S`` (tokens drawn from ``P`` or ``Q``).

    Returns
    -------
    tuple
        ``(P_S, Q_S)`` or ``(P_S, Q_S, X_S)``; the inputs themselves (no copy) when ``S`` is every token.
    """
    keep = (P > 0).reshape(-1, P.shape[-1]).any(axis=0) | (Q > 0).reshape(-1, Q.shape[-1]).any(axis=0)
    if keep.all():
        return (P, Q) if X is None else (P, Q, X)
    cols = np.flatnonzero(keep)
    out = (np.ascontiguousarray(P[..., cols]), np.ascontiguousarray(Q[..., cols]))
    return out if X is None else out + (np.searchsorted(cols, X),)


def support_to_host(P, Q, X: np.ndarray, xp=None, *, cols=None):
    r""":func:`drop_null_columns` of laws of any namespace, the restriction made in their namespace (on their device):
    only the columns with mass reach the host.

    .. math::

        S = \{x : \exists\, i,\ P_i(x) > 0 \text{ or } Q_i(x) > 0\}, \qquad
        (P, Q, X) \mapsto (P_{\cdot, S},\ Q_{\cdot, S},\ \text{rank of } X \text{ in } S)
        \quad\text{in host memory}.

    With truncated sampling (``top_k``, ``top_p``) ``|S|`` is at most the truncation times the number of rows, so at
    ``V = 128,256`` the copy is a few thousand columns, not the vocabulary; two host reads (which columns have mass,
    ``V`` booleans, then both laws' values in one copy). The values are those of :func:`drop_null_columns` on host
    copies, bit for bit.

    Parameters
    ----------
    P, Q : (..., V) arrays (numpy, torch on any device, any array-API library)
    X : ndarray of int
        Token ids of the laws' vocabulary, all in ``S`` (host memory).
    xp : namespace, optional
        The laws' (found when None).
    cols : ndarray of int, keyword-only, optional
        ``S`` itself, increasing, when read already (:func:`support_part`): then only the values are read (one host
        read, no ``nonzero`` on the device).

    Returns
    -------
    tuple of ndarray
        ``(P_S, Q_S, X_S)`` in host memory.

    Examples
    --------
    >>> import numpy as np, torch
    >>> from otspec.profile._quantities import support_to_host
    >>> P = torch.tensor([[0.5, 0.0, 0.5, 0.0]], dtype=torch.float64)
    >>> Q = torch.tensor([[0.0, 0.0, 0.25, 0.75]], dtype=torch.float64)
    >>> Ps, Qs, Xs = support_to_host(P, Q, np.array([2, 3]))
    >>> Ps.tolist(), Qs.tolist(), Xs.tolist()
    ([[0.5, 0.5, 0.0]], [[0.0, 0.25, 0.75]], [1, 2])
    """
    X = np.asarray(X)
    if isinstance(P, np.ndarray):
        return drop_null_columns(P, np.asarray(Q), X)
    xp = namespace(P, Q) if xp is None else xp
    V = int(P.shape[-1])
    if cols is None:
        keep = _support_mask(P, Q, xp)
        cols = np.flatnonzero(to_host(keep))  # one read: V booleans (a synchronisation on a GPU)
        idx = None if cols.shape[0] == V else xp.nonzero(keep)[0]
    else:
        cols = np.asarray(cols, dtype=np.int64)
        idx = None if cols.shape[0] == V else xp.asarray(cols, device=array_api_compat.device(P))
    if cols.shape[0] == V:
        return to_host(P), to_host(Q), X
    Ps, Qs = xp.take(P, idx, axis=-1), xp.take(Q, idx, axis=-1)
    both = to_host(xp.concat([xp.reshape(Ps, (-1,)), xp.reshape(Qs, (-1,))]))  # one read: both laws' values
    n = int(np.prod(tuple(int(d) for d in Ps.shape)))
    return (both[:n].reshape(tuple(int(d) for d in Ps.shape)), both[n:].reshape(tuple(int(d) for d in Qs.shape)),
            np.searchsorted(cols, X))


def _support_mask(P, Q, xp):
    """The ``(V,)`` booleans of the tokens with mass in some row of ``P`` or ``Q`` (the laws' namespace)."""
    V = int(P.shape[-1])
    return xp.any(xp.reshape(P, (-1, V)) > 0, axis=0) | xp.any(xp.reshape(Q, (-1, V)) > 0, axis=0)


def support_width(top_k, P, Q) -> int:
    """The width :func:`support_part` gathers the support to: ``top_k`` times the rows of ``P`` and ``Q`` (each row
    keeps ``top_k`` tokens, more only on ties at the ``top_k``-th value), at most ``V``; ``V`` without ``top_k``."""
    V = int(P.shape[-1])
    if top_k is None:
        return V
    rows = int(np.prod(tuple(int(d) for d in P.shape[:-1]))) + int(np.prod(tuple(int(d) for d in Q.shape[:-1])))
    return min(V, int(top_k) * rows)


#: The most entries of a position's laws (per prompt) that :func:`support_part` gathers to its width and reads with the
#: support's columns: ``2**18`` float64 (2 MiB, a fraction of a millisecond over PCIe, less than the synchronisation it
#: saves); wider (a large vocabulary without ``top_k``) the values are read on their own as before, ``|S|`` columns.
SUPPORT_VALUES_MAX = 1 << 18


def support_part(builds, width: int, *, values: bool | None = None):
    r"""The part (:func:`read_parts`) that reads the support :math:`S` of ``builds``' laws (:func:`support_to_host`)
    with other values, and with it the laws' values at :math:`S`, so that the host copy needs no read of its own.

    On the laws' device: :math:`|S|` and the first ``width`` token ids of a stable sort that puts the tokens with mass
    first (so :math:`S` in increasing order when :math:`|S| \le` ``width``), then (``values``) both laws gathered at
    those ``width`` ids, ``1 + width (R_P + R_Q)`` float64 entries in all (the ids exact below :math:`2^{53}`; a
    gather copies, so the values at the first :math:`|S|` ids are the laws' at :math:`S` bit for bit). The store
    keeps :math:`S` and the host copy in ``builds`` (used by :attr:`Builds.host`), or nothing when
    :math:`|S| >` ``width`` (ties at ``top_k`` can keep more tokens: :attr:`Builds.host` then reads the mask as
    before). ``values`` None: when ``width (R_P + R_Q)`` is at most :data:`SUPPORT_VALUES_MAX`; False: the columns
    only (the values then take one read of their own)."""
    xp = builds.xp
    P, Q = builds.P, builds.Q
    keep = _support_mask(P, Q, xp)
    first = xp.argsort(xp.astype(keep, xp.int8), descending=True, stable=True)[:width]  # ties: increasing ids
    head = xp.concat([xp.reshape(xp.sum(keep, dtype=xp.int64), (1,)), first])  # int64: read_parts casts, exactly
    shapes = [tuple(int(d) for d in A.shape[:-1]) + (int(first.shape[0]),) for A in (P, Q)]
    sizes = [int(np.prod(sh)) for sh in shapes]
    if values is None:
        values = sum(sizes) <= SUPPORT_VALUES_MAX
    vals = head if not values else xp.concat(
        [xp.astype(head, xp.float64), xp.reshape(xp.take(P, first, axis=-1), (-1,)),
         xp.reshape(xp.take(Q, first, axis=-1), (-1,))])

    def store(host):
        n = int(host[0])
        if n > width:
            return
        builds._cols = host[1:1 + n].astype(np.int64)
        if values:
            at = 1 + int(first.shape[0])
            got = []
            for sh, m in zip(shapes, sizes):
                got.append(np.array(host[at:at + m].reshape(sh)[..., :n], dtype=np.float64, order="C"))  # a copy
                at += m
            builds._support = tuple(got)

    return vals, store


def support_parts(builds, width: int, top_k=None) -> list:
    r"""The parts (:func:`read_parts`) that bring the host copy of ``builds``' laws restricted to their support
    :math:`S` (:attr:`Builds.host`, :func:`support_to_host`) with the position's other values: no read of its own.

    With ``top_k`` (the sampling's truncation, less than the vocabulary) on torch laws: each row's ``top_k + 1``
    largest values and their token ids (:func:`torch.topk`), ``2 (top_k + 1)`` entries a row; on the host
    :math:`S` is the ids of the positive values and each row's restriction is zeros but for them, its values copied
    (bit for bit the laws' at :math:`S`, every other entry of a row being 0). A row whose ``(top_k + 1)``-th value
    is positive (ties at the ``top_k``-th value keep more tokens) stores nothing (:attr:`Builds.host` then reads
    the mask and the values as before); an :math:`S` wider than ``width`` only its columns (the values then read on
    their own, as with :func:`support_part`). At the vocabulary's width (no ``top_k``), both laws whole
    if they hold at most :data:`SUPPORT_VALUES_MAX` entries, :math:`S` taken on the host (:func:`drop_null_columns`:
    the same comparisons, its values copies of the laws'). Else :func:`support_part` (gathered to ``width``)."""
    P, Q = builds.P, builds.Q
    V = int(P.shape[-1])
    shapes = [tuple(int(d) for d in A.shape) for A in (P, Q)]
    if top_k is not None and int(top_k) + 1 < V and array_api_compat.is_torch_array(P):
        import torch

        K = int(top_k) + 1
        got = [torch.topk(A.reshape(-1, V), K, dim=-1, sorted=False) for A in (P, Q)]
        parts = [got[0].values, got[0].indices, got[1].values, got[1].indices]
        host = []

        def store_rows(vals):
            host.append(vals)
            if len(host) < 4:
                return
            vp, ip, vq, iq = host
            if (vp > 0).all(axis=1).any() or (vq > 0).all(axis=1).any():
                return  # a row with more than top_k tokens with mass: the old route
            cols = np.unique(np.concatenate([ip[vp > 0], iq[vq > 0]]).astype(np.int64))
            builds._cols = cols
            if cols.shape[0] > width:
                return  # wider than the width (support_width bounds it when no row has more than top_k): the values
                # read on their own, at these columns, as when the columns came alone (support_part)
            out = []
            for v, i, sh in ((vp, ip, shapes[0]), (vq, iq, shapes[1])):
                A = np.zeros((v.shape[0], cols.shape[0]))
                r, c = np.nonzero(v > 0)
                A[r, np.searchsorted(cols, i[r, c].astype(np.int64))] = v[r, c]
                out.append(A.reshape(sh[:-1] + (cols.shape[0],)))
            builds._support = tuple(out)

        return [(a, store_rows) for a in parts]
    if width < V or sum(int(np.prod(sh)) for sh in shapes) > SUPPORT_VALUES_MAX:
        return [support_part(builds, width)]
    got = []

    def store(host):
        got.append(host)
        if len(got) == 2:  # both laws read: S and the laws there, on the host
            Ph, Qh = got
            keep = (Ph > 0).reshape(-1, V).any(axis=0) | (Qh > 0).reshape(-1, V).any(axis=0)
            builds._cols = np.flatnonzero(keep)
            builds._support = (Ph, Qh) if keep.all() else (np.ascontiguousarray(Ph[..., builds._cols]),
                                                          np.ascontiguousarray(Qh[..., builds._cols]))

    return [(P, store), (Q, store)]


def needs_host(verifiers, families, ks, options: dict, k_max: int) -> bool:
    r"""Whether a position's quantities of ``verifiers`` and ``families`` (``ks(name)`` their numbers of drafts, at
    ``k_max`` drafts) build a verifier on the host copy of the laws (:attr:`Builds.host`): the verifiers with no
    batched form here (:func:`depth_quantities`), the token-level families whose :math:`E[\tau \mid X]` walks
    the tree with verifiers built at its nodes (:func:`tree_reach`; :func:`reach_part`'s one-draft form at a node
    with several drafts, i.e. ``k_max >= 2``). A guess that only decides what is read in advance: a wrong one costs
    a read, never a value."""
    for name in verifiers:
        if name in ("optimal", "lp", "token"):
            continue
        if name == "without-replacement" or _acc_rows(name, tuple(ks(name)), None, None, None, options, 1) is None:
            return True
    for name in families:
        spec = get_verifier(name)
        if spec.kind == "block" or name == "token":
            continue
        several = not spec.single_draft and k_max >= 2  # expected_accepted's ks: (1,) or 1..k_max
        if name in REACH_ONE_DRAFT:
            if several:
                return True
            continue
        if name not in REACH_BATCHED or (name == "kseq" and options.get("kseq")) or (name == "typical" and several):
            return True
    return False


class Builds:
    """The laws of one draft tree, its batched quantities and its verifiers, each computed at most once.

    The nodes of a tree share their laws with every row whose draft agrees on
    the prefix, so the per-depth acceptance along the first block and the
    expected accepted tokens of every ``k`` read the same builds (each at most
    once per name, prefix and number of drafts), and :math:`\alpha_k` along
    the first block serves both ``"optimal"`` and ``"lp"``. Numpy laws are
    kept on the tokens with mass somewhere in the tree
    (:func:`drop_null_columns`); other arrays (torch tensors, on any device)
    stay where they are for the batched quantities (the costly ones with a
    batched form included: :func:`acc_part`, :func:`reach_part`), and a host
    copy restricted the same way is made on the first per-node build (only the
    verifiers without one: the optimal verifier's and Khisti et al.'s expected
    tokens, the without-replacement optimum, k-Seq at a given ``rho``, ...).

    Parameters
    ----------
    X : (k_max, L_max) array of int
        The drafts (host memory).
    P, Q : (k_max, L_max, V) and (k_max, L_max + 1, V) arrays (numpy, torch, any array-API library)
        Draft and target laws along them, float64 rows on the simplex.
    options : dict
        Per-verifier build options.
    X_dev : (k_max, L_max) int64 array of the laws' namespace, optional
        ``X`` where the laws are, when the caller has it there (not copied there again by :meth:`tokens`).
    """

    def __init__(self, X, P, Q, options: dict, X_dev=None):
        self.xp = namespace(P, Q)
        self.options = options
        self._cache: dict = {}
        self._supp: dict = {}
        self._batched: dict = {}
        X = to_host(X)
        if isinstance(P, np.ndarray):
            self.P, self.Q, self.X = drop_null_columns(P, Q, X)
            self._host = (self.P, self.Q, self.X)
        else:
            self.P, self.Q, self.X = P, Q, X
            self._host = None
        self._Xdev = X_dev if X_dev is not None and not isinstance(P, np.ndarray) else None
        self._cols = None  # the support's columns when read in advance (support_part)
        self._support = None  # and the laws' values there, when read with them

    @property
    def host(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(P, Q, X)`` in host memory, restricted to the tokens with mass (:func:`drop_null_columns`; for laws off
        the host the restriction is made where they are, and only its columns are copied: :func:`support_to_host`)."""
        if self._host is None and self._support is not None:  # read with the position's values (support_part)
            n = int(self._cols.shape[0])
            self._host = self._support + (self.X if n == int(self.P.shape[-1]) else np.searchsorted(self._cols, self.X),)
        if self._host is None:
            self._host = support_to_host(self.P, self.Q, self.X, self.xp, cols=self._cols)
        return self._host

    def tokens(self):
        """The drafts ``X`` as an int64 array of the laws' namespace, on their device."""
        if self._Xdev is None:
            import array_api_compat

            self._Xdev = self.xp.asarray(self.X, dtype=self.xp.int64, device=array_api_compat.device(self.P))
        return self._Xdev

    def batched(self, key, compute):
        """``compute()`` once per ``key`` (the batched quantities shared by several names or ``k``)."""
        out = self._batched.get(key)
        if out is None:
            out = self._batched[key] = compute()
        return out

    def value(self, key, make):
        """The value under ``key``, read into host memory from the parts ``make()`` returns when not yet there
        (:func:`read_parts`: one host read)."""
        if key not in self._batched:
            read_parts(make())
        return self._batched[key]

    def store(self, key):
        """A function that puts its argument in the cache under ``key``."""
        return lambda vals: self._batched.__setitem__(key, vals)

    def support(self, r: int, j: int):
        _, _, X = self.host
        key = (tuple(X[r, :j].tolist()), j)
        out = self._supp.get(key)
        if out is None:
            P, Q, _ = self.host
            out = self._supp[key] = _compress(P[r, j], Q[r, j])
        return out

    def get(self, name: str, r: int, j: int, n: int):
        """The verifier ``name`` for ``n`` drafts at the node ``X[r, :j]`` (on the union support)."""
        key = (name, tuple(self.host[2][r, :j].tolist()), j, n)
        v = self._cache.get(key)
        if v is None:
            _, pc, qc = self.support(r, j)
            v = self._cache[key] = get_verifier(name).build(pc, qc, n, **self.options.get(name, {}))
        return v

    def local(self, r: int, j: int, tokens) -> list[int]:
        """Token ids mapped to the node's union support."""
        idx, _, _ = self.support(r, j)
        t = np.asarray(tokens, dtype=np.int64)
        return (t if idx is None else np.searchsorted(idx, t)).tolist()


def _lossy_gaps(v, q: np.ndarray) -> tuple[float, float]:
    out = np.asarray(v.output_law(), dtype=np.float64)
    return 0.5 * float(np.abs(out - q).sum()), float(kl_divergence(q, out))


def _distinct_support(p: np.ndarray) -> int:
    """The number of distinct tokens a draft law can give: its entries of at least ``NEGLIGIBLE`` (the validation of
    every verifier flushes subnormal entries to 0, :func:`otspec._validation.validate_distribution`, so a law
    ``(2/3, 1/3, 5e-324)`` has two)."""
    return int(np.count_nonzero(p >= NEGLIGIBLE))


def depth_quantities(name: str, ks, builds: Builds, L: int, *, lossless: bool = True) -> dict:
    r"""Exact acceptance of verifier ``name`` at every depth along the first draft block, for each ``k``.

    .. math::

        a_j(k) = P\big(Y \in S(X_{1..k})\big), \quad X_i \overset{\text{i.i.d.}}{\sim} p_j,\
        Y \sim K(\cdot \mid X), \qquad p_j = p(\cdot \mid c, X^{(1)}_{<j}),\ q_j = q(\cdot \mid c, X^{(1)}_{<j}).

    Batched closed forms over the ``L`` depths, in the laws' namespace and on
    their device: :func:`otspec.alpha_k` for ``"optimal"`` and ``"lp"`` (both
    reach the optimum: one call, one sort per depth, serves both and every
    ``k``), the maximal coupling for ``"token"``,
    :func:`otspec.multidraft.batched_kseq_acceptance` for ``"kseq"`` (one sort
    per depth for every ``k``), :func:`otspec.profile._quantities_batched.acceptance_rows`
    for ``"multiround"``, ``"greedy-drafts"``, ``"top-k"`` and ``"typical"``
    (with its output law's total variation and KL); every other verifier is
    built per depth (on a host copy of the laws) and asked for its
    exact ``acceptance()`` (and, when lossy, the total variation and
    :math:`\mathrm{KL}(q \| \pi)` of its output law :math:`\pi`).

    Parameters
    ----------
    name : str
        A registered token-level verifier.
    ks : sequence of int
        Numbers of drafts.
    builds : Builds
        The tree's laws and its cache of built verifiers.
    L : int
        Depths ``1..L``.
    lossless : bool, keyword-only
        False for a lossy rule (then ``"tv"`` and ``"kl"`` are returned too).

    Returns
    -------
    dict
        ``{("acc" | "tv" | "kl", k): (L,) ndarray}``; exact to about 1e-12 (float64 sums over the
        vocabulary); NaN where the scheme is undefined (``k`` distinct drafts on a support of fewer
        than ``k`` tokens), and such values are not recorded.
    """
    # the laws come from Sampling.probs: float64 rows summing to 1 (checked there), so no re-validation; taken along
    # the first block only when not yet computed (prefill_batched may have)
    out: dict = {}
    if name in ("optimal", "lp"):  # both reach the optimum: one alpha_k (one sort per depth) serves both
        vals = builds.batched(("alpha", tuple(ks), L), lambda: to_host(
            alpha_k(builds.P[0, :L], builds.Q[0, :L], list(ks), validate=False, workers=1)).reshape(L, len(ks)))
        for i, k in enumerate(ks):
            out[("acc", k)] = vals[:, i].copy()
        return out
    if name == "without-replacement":  # the closed form of the optimum, not the LP plan over draft sets
        vals = np.full((L, len(ks)), np.nan)
        for j in range(L):
            pc, qc = builds.support(0, j)[1:]
            cols = [i for i, k in enumerate(ks) if k <= _distinct_support(pc)]  # NaN (not recorded) for the rest
            if cols:
                vals[j, cols] = alpha_k_without_replacement(pc, qc, [ks[i] for i in cols])
        for i, k in enumerate(ks):
            out[("acc", k)] = vals[:, i]
        return out
    if name == "token":
        out[("acc", 1)] = builds.batched(("token-acc", L), lambda: to_host(_token_acceptance(builds.P[0, :L],
                                                                                            builds.Q[0, :L])))
        return out
    part = acc_part(name, ks, builds, L)
    if part is not None:  # a batched closed form (one sort of the ratios serves every k for k-Seq)
        vals = builds.value(*part)
        if name == "typical":
            for i, kind in enumerate(("acc", "tv", "kl")):
                out[(kind, 1)] = vals[:, i].copy()
            return out
        for i, k in enumerate(ks):
            out[("acc", k)] = vals[:, i].copy()
        return out

    distinct = get_verifier(name).draft_process != "iid"  # k distinct drafts: undefined on a smaller support
    for k in ks:
        acc = np.full(L, np.nan)
        tv = np.full(L, np.nan)
        kl = np.full(L, np.nan)
        for j in range(L):
            if distinct and _distinct_support(builds.support(0, j)[1]) < k:
                continue  # e.g. greedy decoding (one-hot draft law) with k >= 2 distinct drafts: NaN, not recorded
            v = builds.get(name, 0, j, k)
            acc[j] = float(v.acceptance())
            if not lossless:
                tv[j], kl[j] = _lossy_gaps(v, builds.support(0, j)[2])
        out[("acc", k)] = acc
        if not lossless:
            out[("tv", k)], out[("kl", k)] = tv, kl
    return out


def tree_reach(name: str, rows, builds: Builds, L: int) -> np.ndarray:
    r"""Exact :math:`P(\tau \ge j \mid X)`, ``j = 1..L``, of token-level DraftSelection on the drafts ``rows``.

    .. math::

        P(\tau \ge j \mid X) = \sum_{y_{1..j}} \prod_{i \le j}
        K_i\big(y_i \mid X_{A_i, i}\big), \qquad A_{i+1} = \{r \in A_i : X_{r, i} = y_i\} \ne \emptyset,

    summed over the at most ``|rows|`` branches per depth where the output
    agrees with some surviving draft (SpecTr, Sun et al., arXiv:2310.15141,
    Algorithm 3): the verifier at each node is built for the number of
    drafts alive there and asked for its exact conditional law
    (``Verifier.conditional``).

    Returns
    -------
    (L,) ndarray of float64
    """
    X = builds.host[2]
    return _walk(rows, X, L, _host_conditional(name, builds, X))


def _host_conditional(name: str, builds: Builds, X: np.ndarray):
    """``cond(alive, j)`` of :func:`_walk` by the verifier ``name`` built on the host at the node (on its union
    support, :meth:`Builds.get`) for the drafts alive there, asked for its exact ``conditional()``; the drafts' ids
    are ``X``'s (the laws' own, or the host copy's restricted ids: the restriction keeps their order)."""

    def cond(alive, j):
        Xh = builds.host[2]
        r0 = alive[0]
        toks = Xh[alive, j]
        law = builds.get(name, r0, j, len(alive)).conditional(builds.local(r0, j, toks))
        out = [(y, float(law[builds.local(r0, j, [y])[0]])) for y in np.unique(toks).tolist()]
        if X is Xh:
            return out
        return [(y, v) for y, (_, v) in zip(np.unique(X[alive, j]).tolist(), out)]

    return cond


def _walk(rows, X: np.ndarray, L: int, cond) -> np.ndarray:
    """:func:`tree_reach`'s sum over the branches of the draft tree of ``rows``, given ``cond(alive, j)``: the
    output's law at the node's distinct drafts, ``[(y, P(Y = y | drafts)), ...]`` in increasing ``y``."""
    reach = np.zeros(L)
    stack = [(list(rows), 0, 1.0)]
    while stack:
        alive, j, prob = stack.pop()
        if j == L or prob == 0.0:
            continue
        for y, py in cond(alive, j):
            if py <= 0.0:
                continue
            reach[j] += prob * py
            stack.append(([r for r in alive if X[r, j] == y], j + 1, prob * py))
    return reach


def acc_part(name: str, ks, builds: Builds, L: int):
    """``(key, make)`` of the batched per-depth acceptance of ``name`` along the first block (for
    :meth:`Builds.value` and :func:`prefill_batched`), or None when ``name`` has no batched closed form here."""
    ks = tuple(ks)
    got = _acc_rows(name, ks, None, None, builds.xp, builds.options, L)  # the key: no slice of the laws yet
    if got is None:
        return None
    key = got[0]

    def make():  # the first block's laws sliced only when the value is not in the cache (prefill_batched's)
        compute = _acc_rows(name, ks, builds.P[0, :L], builds.Q[0, :L], builds.xp, builds.options, L)[1]
        return [(compute(), builds.store(key))]

    return key, make


def _acc_rows(name: str, ks: tuple, P0, Q0, xp, options: dict, L: int, rho=None, token=None):
    """``(key, compute)`` of :func:`acc_part` on the ``(..., L, V)`` laws ``P0``, ``Q0`` (one prompt's first block,
    or several prompts' stacked: every row's values its own), or None (``token``: k-Seq's, see
    :func:`_kseq_acceptance`)."""
    if name == "kseq" and not options.get("kseq"):  # at rho* only: a given rho is built on the host
        return ("kseq", ks, L), lambda: _kseq_acceptance(P0, Q0, ks, xp, rho, token=token)
    if name in ACC_BATCHED and (name != "typical" or ks == (1,)):  # typical verifies one draft (else: its error)
        return ("acc", name, ks, L), lambda: acceptance_rows(name, P0, Q0, ks, xp, options.get(name))
    return None


def reach_part(name: str, ks, builds: Builds, L: int, rho=None):
    r"""``(keys, make)`` of :math:`\frac1G \sum_g` :func:`tree_reach` over the ``G`` groups of ``k`` rows of each
    ``k`` of ``ks`` (``keys[k]``), from the batched conditional laws at every node
    (:func:`otspec.profile._quantities_batched.reach_parts`), or None when ``name`` has none here; with ``rho``, as
    :func:`acc_part`."""
    return _reach_rows(name, tuple(ks), [builds], L, rho)


def _reach_rows(name: str, ks: tuple, sub: list, L: int, rho=None, laws=None):
    """:func:`reach_part` of the prompts ``sub`` (their :class:`Builds`) at once: every node of their draft trees in
    one batched pass (a node's law is its own prompt's), each prompt's values put in its cache. ``laws``: the
    prompts' ``(P, Q, X, drafted)`` stacked (``(R, ...)``, ``R`` their drafts; ``drafted`` :func:`_drafted`'s or
    None) when the caller has them (else stacked here)."""
    b0 = sub[0]
    if name not in REACH_ONE_DRAFT and (name not in REACH_BATCHED or (name == "kseq" and b0.options.get("kseq")) or (
            name == "typical" and ks != (1,))):
        return None
    keys = {k: ("reach", name, k, L) for k in ks}
    xp = b0.xp
    k_max = int(b0.X.shape[0])

    def stacked():
        if laws is not None:
            return laws
        if len(sub) == 1:
            return b0.P, b0.Q, b0.tokens(), None
        return tuple(xp.concat([getattr(b, n) for b in sub], axis=0) for n in ("P", "Q")) + (
            xp.concat([b.tokens() for b in sub], axis=0), None)

    if name in REACH_ONE_DRAFT:
        def make_one():
            P, Q, Xd, drafted = stacked()
            stores = [_one_draft_store(name, ks, b, L, keys) for b in sub]

            def store(vals):
                for i, put in enumerate(stores):
                    put(vals[i * k_max:(i + 1) * k_max])

            return [(_token_ratios(P, Q, Xd, L, xp, drafted), store)]

        return keys, make_one

    def make():
        X = b0.X if len(sub) == 1 else np.concatenate([b.X for b in sub], axis=0)
        groups = {k: [list(range(g * k, (g + 1) * k)) for g in range(k_max // k)] for k in ks}
        nodes = reach_nodes(X, [[i * k_max + r for r in rows] for i in range(len(sub)) for gs in groups.values()
                                for rows in gs], L)
        P, Q = stacked()[:2]
        parts = reach_parts(name, P, Q, X, nodes, xp, b0.options.get(name), rho if name == "kseq" else None,
                            block=k_max, flat=True)

        def store(vals):
            vals = node_rows(vals, len(nodes))
            at = {node: vals[i] for i, node in enumerate(nodes)}

            def cond(alive, j):
                return node_conditional(at[(tuple(alive), j)], X[alive, j])

            for i, b in enumerate(sub):
                for k, gs in groups.items():
                    reach = np.zeros(L)
                    for rows in gs:
                        reach += _walk([i * k_max + r for r in rows], X, L, cond) / len(gs)
                    b._batched[keys[k]] = reach

        return [(parts, store)]

    return keys, make


def _one_draft_store(name: str, ks: tuple, builds: Builds, L: int, keys: dict):
    r"""The store of :func:`reach_part` for a verifier of
    :data:`otspec.profile._quantities_batched.REACH_ONE_DRAFT` (one prompt): its conditional law at every node with
    one draft ``x`` is :math:`\min(1, q(x)/p(x))` (``vals``: the ratios of every row and depth, computed in one
    batched pass in the laws' namespace and read with the position's other values), at a node with several drafts the
    verifier built on the host (:func:`_host_conditional`: the host copy of the laws is made only when the tree has
    such a node, i.e. for ``k >= 2``). At ``k = 1`` the value is token verification's (:func:`_token_reach_rows`),
    bit for bit."""
    X = builds.X
    k_max = int(X.shape[0])

    def store(vals):
        several = _host_conditional(name, builds, X)

        def cond(alive, j):
            if len(alive) == 1:
                return [(int(X[alive[0], j]), float(vals[alive[0], j]))]
            return several(alive, j)

        for k in ks:
            gs = [list(range(g * k, (g + 1) * k)) for g in range(k_max // k)]
            reach = np.zeros(L)
            for rows in gs:
                reach += _walk(rows, X, L, cond) / len(gs)
            builds._batched[keys[k]] = reach

    return store


def read_parts(parts) -> None:
    """Read the arrays of ``parts`` (``(array, store)`` pairs, one namespace) into host memory in one read (a
    single synchronisation on a GPU) and hand each its values, shaped as the array: ``store(values)``."""
    if not parts:
        return
    if all(isinstance(a, np.ndarray) for a, _ in parts):
        for a, store in parts:
            store(a)
        return
    xp = namespace(*(a for a, _ in parts))
    flat = [a if a.dtype == xp.float64 else xp.astype(a, xp.float64) for a, _ in parts]
    # the concatenation copies: no cast of a float64 part, no view of a 1-D one, and the parts of two or more
    # dimensions that share their trailing shape, three or more of them, stacked along their first axis first (one
    # view of the stack, not one per part); each part's place in the host copy kept for its store
    sizes = [int(np.prod(tuple(int(n) for n in a.shape))) for a in flat]
    groups: dict = {}
    for i, a in enumerate(flat):
        if a.ndim >= 2:
            groups.setdefault(tuple(int(n) for n in a.shape[1:]), []).append(i)
    pieces, offsets, pos = [], [0] * len(flat), 0
    for i, a in enumerate(flat):
        members = groups[tuple(int(n) for n in a.shape[1:])] if a.ndim >= 2 else ()
        if len(members) >= 3:
            if members[0] == i:  # the group in one piece, at its first part's turn
                pieces.append(xp.reshape(xp.concat([flat[j] for j in members], axis=0), (-1,)))
                for j in members:
                    offsets[j] = pos
                    pos += sizes[j]
            continue
        pieces.append(a if a.ndim == 1 else xp.reshape(a, (-1,)))
        offsets[i] = pos
        pos += sizes[i]
    host = to_host(xp.concat(pieces))
    for (a, store), at, n in zip(parts, offsets, sizes):
        store(host[at:at + n].reshape(tuple(int(d) for d in a.shape)))


def parts_after(later, parts: list) -> list:
    """``later``'s parts (a :class:`otspec.profile._collect.TreesLater`, or None: anything with ``parts`` and
    ``record()``) and then ``parts``, for one read (:func:`read_parts`): ``later``'s rows written as soon as its
    values are stored, before the first store of ``parts`` runs (a bad-logits flag of the position read with them
    raises after the earlier position's rows are written, as when those were read at their own position)."""
    if later is None:
        return list(parts)
    (a, store), *rest = parts

    def first(vals) -> None:
        later.record()
        store(vals)

    return [*later.parts, (a, first), *rest]


def _token_acceptance(P0, Q0):
    """The maximal coupling's acceptance of every row of ``(..., V)`` laws (the laws' namespace)."""
    return batched_maximal_coupling_acceptance(P0, Q0, validate=False)


def _kseq_acceptance(P0, Q0, ks, xp, rho=None, *, token=None):
    r"""k-Seq's acceptance of every row of ``(..., V)`` laws for each ``k`` of ``ks``, ``(..., len(ks))``: one sort of
    the ratios, and the :math:`\rho^*` of every ``k >= 2`` from one root search
    (:class:`otspec.profile._quantities_batched.RhoStar`), each value
    :func:`otspec.multidraft._batched.kseq_acceptance_rows`' (to the last bit of torch's ``pow``). Where the
    acceptance is below 1/2 it is the accepted mass itself, without the cancellation of ``1 - E^k``: at ``k = 1``
    (:math:`\rho^* = 1`) :math:`\sum_x \min(p(x), q(x))`, the maximal coupling's acceptance (Leviathan et al.,
    arXiv:2211.17192, §3.5), summed directly; at ``k >= 2`` :math:`1 - (1 - \beta(\rho^*))^k` by
    ``log1p``/``expm1``, on the host.

    With ``rho`` (a :class:`~otspec.profile._quantities_batched.RhoStar`) the requests are added to it and a function
    is returned (call it after ``rho.solve()``) whose array holds the sums the values are made of, 1-D: the rows'
    :math:`\sum \min(p, q)` (when ``1`` is in ``ks`` or ``token`` is given), their :math:`E(1) = \sum (p - q)_+`
    (when ``1`` is in ``ks``) and :math:`E(\rho^*)^k` of each ``k >= 2``, concatenated; its ``host_fix`` (run by
    :meth:`~otspec.profile._quantities_batched.RhoStar.refreshed`'s store) makes the values from the host copy,
    ``(..., len(ks))``, and hands ``token`` (a store of :func:`read_parts`) the maximal coupling's acceptance of the
    rows, ``(...)``, from the same sum (one sum of the minimum for both verifiers). Without ``rho``, off numpy, the
    values are formed on the laws' device (the tiny-beta rows by the device's second search; no read)."""
    ks = [int(k) for k in ks]
    many = [k for k in ks if k > 1]
    kept_col = 1 in ks or token is not None
    shape = tuple(P0.shape[:-1])
    solver = RhoStar(xp, tiny_beta=True) if rho is None else rho
    V = int(P0.shape[-1])
    rows = (xp.reshape(P0, (-1, V)), xp.reshape(Q0, (-1, V))) if many or kept_col else None
    handles = {k: solver.add(rows, k) for k in many}  # sorted with the solver's other requests

    def sums():
        # sum min(p, q), then one column per k: E(1) = sum (p - q)_+ at k = 1 (rho* = 1: kseq_acceptance_rows' sums
        # on the flat rows, row by row), E(rho*)**k at k >= 2 (the solver's rows)
        kept = [xp.sum(xp.minimum(rows[0], rows[1]), axis=-1)] if kept_col else []
        E1 = xp.sum(xp.clip(rows[0] - rows[1], 0.0, None), axis=-1) if 1 in ks else None
        return kept + [E1 if k == 1 else solver.get(handles[k])[1] ** k for k in ks]

    def finish():  # the sums, 1-D (a 1-D part of the read takes no view): the values made on the host
        cols = sums()
        return cols[0] if len(cols) == 1 else xp.concat(cols)

    def host_fix(vals):
        # 1 - E^k where it is at least 1/2 (no cancellation there; E^k > 1/2 tested as kseq_acceptance_rows does),
        # below it the accepted mass: sum min(p, q) at k = 1, 1 - (1 - beta)^k by log1p/expm1 from beta(rho*)
        # summed directly (the solver's, read with the values) at k >= 2; then the clip to [0, 1]
        cols = np.asarray(vals, dtype=np.float64).reshape(-1, int(np.prod(shape, dtype=np.int64)))
        kept = cols[0] if kept_col else None
        if token is not None:
            token(np.clip(kept, 0.0, 1.0).reshape(shape))
        at = 1 if kept_col else 0
        out = []
        for k in ks:
            mass = kept if k == 1 else _accepted_mass(solver.beta_host[solver.rows(handles[k])], float(k), np)
            out.append(_kseq_value(cols[at], mass, np))
            at += 1
        return np.stack(out, axis=-1).reshape(shape + (len(ks),))

    if rho is not None:  # the solver's values read first: fixed in the store (RhoStar.refreshed)
        finish.host_fix = host_fix
        return finish
    if isinstance(P0, np.ndarray):
        return host_fix(finish())
    # off numpy, no read: the same values in the laws' namespace (the solver's device rows took the second search)
    cols = sums()
    kept = cols.pop(0) if kept_col else None
    out = []
    for k, Ek in zip(ks, cols):
        if k == 1:
            mass = kept
        else:
            mass = _accepted_mass(xp.reshape(solver.beta[solver.rows(handles[k])], (-1,)), float(k), xp)
        out.append(xp.where(Ek > 0.5, mass, 1.0 - Ek))
    return xp.reshape(xp.clip(xp.stack(out, axis=-1), 0.0, 1.0), shape + (len(ks),))


def _token_reach_rows(builds: Builds, L: int):
    r""":func:`tree_reach` of each drawn block alone under the maximal coupling, ``(k_max, L)``, in the laws' namespace.

    .. math::

        P(\tau \ge j \mid X_r) = \prod_{i \le j} \min\Big(1, \frac{q_i(X_{r,i})}{p_i(X_{r,i})}\Big)

    (the laws renormalised per row, as the decoding loop does).
    """
    return _token_reach(builds.P, builds.Q, builds.tokens(), L, builds.xp)


def _token_reach(P, Q, X, L: int, xp, drafted=None):
    """:func:`_token_reach_rows` on ``(R, >= L, V)`` laws and ``(R, >= L)`` tokens of namespace ``xp``
    (``drafted``: :func:`_drafted`'s ``(p, q)`` at the tokens, when already gathered)."""
    return xp.cumulative_prod(_token_ratios(P, Q, X, L, xp, drafted), axis=-1)


def _token_ratios(P, Q, X, L: int, xp, drafted=None):
    r""":math:`\min(1, q_{r,i}(X_{r,i}) / p_{r,i}(X_{r,i}))` of every row and depth ``i < L``, ``(R, L)`` in namespace
    ``xp`` (the laws renormalised per row, as the decoding loop does): the maximal coupling's acceptance of each
    draft. On torch tensors with ``drafted`` given, the last call's array is given again while the same laws (their
    version counters unchanged), ``drafted`` and ``L`` come back: token verification's reach and the one-draft nodes'
    ratios of a position (:func:`prefill_batched`) are one computation, not two."""
    torch_laws = drafted is not None and array_api_compat.is_torch_array(P)
    if torch_laws:
        key = (P._version, Q._version, L)
        last = _LAST_RATIOS[0]
        if last is not None and last[0]() is P and last[1]() is Q and last[2] is drafted and last[3] == key:
            return last[4]
    px, qx = _drafted(P, Q, X, L, xp) if drafted is None else drafted
    p = px / xp.sum(P[:, :L], axis=-1)
    q = qx / xp.sum(Q[:, :L], axis=-1)
    out = xp.clip(q / p, None, 1.0)
    if torch_laws:
        # one new tuple in the slot: a reader in another thread sees the old entry or the new one whole
        _LAST_RATIOS[0] = (weakref.ref(P), weakref.ref(Q), drafted, key, out)  # the laws not kept alive
    return out


#: :func:`_token_ratios`' last torch laws (weak references), ``drafted``, key and array:
#: ``[(ref(P), ref(Q), drafted, (versions, L), out)]`` (one slot, None before the first call).
_LAST_RATIOS: list = [None]


def _drafted(P, Q, X, L: int, xp):
    """``(P[r, i, X[r, i]], Q[r, i, X[r, i]])`` for ``i < L``, ``(R, L)`` each: the laws at the drafted tokens (one
    gather each; torch's own on torch tensors, without the array-API wrapper's index arithmetic)."""
    x = xp.reshape(X[:, :L], (-1, L, 1))
    if array_api_compat.is_torch_array(P) and array_api_compat.is_torch_array(X):
        import torch

        x = x if x.dtype == torch.int64 else x.to(torch.int64)
        return torch.gather(P[:, :L], 2, x)[..., 0], torch.gather(Q[:, :L], 2, x)[..., 0]
    return xp.take_along_axis(P[:, :L], x, axis=-1)[..., 0], xp.take_along_axis(Q[:, :L], x, axis=-1)[..., 0]


def block_path_laws(name: str, P, Q, X, L: int, xp=None):
    r"""The law of :math:`\tau` given each row's block, for every draft length ``1..L`` at once.

    .. math::

        \text{law}[r, \ell - 1, t] = P\big(\tau = t \mid X_r^{\ell}\big), \qquad t = 0, \dots, \ell
        \quad (0 \text{ for } t > \ell),

    of block verification ``"block"`` (Sun et al., arXiv:2403.10444,
    Algorithm 3: :math:`P(\tau = \ell) = \min(1, w_\ell)`, and the backward
    walk accepts :math:`X^t` with :math:`\min(1, \sum_x (w_t q_t(x) - p_t(x))_+
    / \sum_x (p_t(x) - w_t q_t(x))_+)`, :math:`w_t = \prod_{i<t} q_i(X_i)/p_i(X_i)`)
    or of its one-correction-token variant ``"block-onestep"``
    (:math:`P(\tau = t) = h_t \prod_{t < j \le \ell} (1 - h_j)`, :math:`h_\ell = p_\ell`,
    :math:`h_t = Z_t / (Z_t + 1 - p_t)`, :math:`Z_t = \sum_x (p_t q_t(x) - p_t(x))_+`,
    :math:`p_t = \min(1, p_{t-1} q_{t-1}(X_{t-1}) / p_{t-1}(X_{t-1}))`): the
    weights and the sums over the vocabulary depend on the prefix only, so one
    pass over the ``L - 1`` depths serves every length. The same arithmetic as
    :func:`otspec.block.tau_law_on_path` per row and length (whose values it
    equals to rounding), batched in the namespace of ``P`` on its device
    (:func:`block_path_laws_stack`: both schemes at once).

    Parameters
    ----------
    name : {"block", "block-onestep"}
    P, Q : (R, >= L, V) arrays (numpy, torch, any array-API library)
        Draft and target laws along each row's block (``Q`` may hold more depths).
    X : (R, >= L) int array of the same namespace and device
        The blocks.
    L : int
        Largest draft length.
    xp : namespace, optional
        The namespace of ``P`` (found when None).

    Returns
    -------
    (R, L, L + 1) array of float64, namespace and device of ``P``

    Examples
    --------
    >>> import numpy as np
    >>> from otspec.block import tau_law_on_path
    >>> from otspec.profile._quantities import block_path_laws
    >>> p, q = np.array([0.5, 0.5]), np.array([0.25, 0.75])
    >>> law = block_path_laws("block", np.array([[p, p]]), np.array([[q, q]]), np.array([[0, 1]]), 2)
    >>> law[0].round(4).tolist()
    [[0.5, 0.5, 0.0], [0.25, 0.0, 0.75]]
    >>> tau_law_on_path("block", (0, 1), [p, p], [q, q]).round(4).tolist()
    [0.25, 0.0, 0.75]
    """
    return block_path_laws_stack((name,), P, Q, X, L, xp)[0]


def block_path_laws_stack(names, P, Q, X, L: int, xp=None, *, drafted=None, deferred: bool = False):
    r""":func:`block_path_laws` of each scheme of ``names`` (``"block"``, ``"block-onestep"``), stacked, in a fixed
    number of batched operations (no loop over depths or lengths).

    .. math::

        w_n = \prod_{i < n} r_i \ (\texttt{"block"}), \qquad
        w_n = \min\Big(1, \min_{j \le n} \prod_{j \le i < n} r_i\Big) \ (\texttt{"block-onestep"}),

        \text{law}[\ell - 1, t] = (1 - \text{top}_\ell)\, a_t \prod_{t < s < \ell} (1 - a_s) \ (t < \ell), \qquad
        \text{law}[\ell - 1, \ell] = \text{top}_\ell,

    :math:`r_i = q_i(X_i) / p_i(X_i)`, :math:`a_s` the backward walk's acceptance at depth ``s`` (:math:`a_0 = 1`).
    The one-step variant's capped running product :math:`w_n = \min(1, w_{n-1} r_{n-1})` is the smallest capped
    product over the suffixes of its path (each suffix product formed left to right, as the running product is;
    rounding is monotone, so the minimum is the running product's value to the last bit); the products of the
    backward walk are one cumulative product per length, taken in the walk's order. Every value is the one the
    sequential walk along the depths computes, bit for bit on numpy and on torch's CPU (whose cumulative products
    run in order). Where a chain of weights leaves the float range (a draft probability below about ``1e-154``,
    ratios whose product over- or underflows on the way) its entries are recomputed from mantissas and exact
    exponents (:func:`otspec.block._weights.path_weight_rows`, the rule of :func:`otspec.block.tau_law_on_path`'s
    weights: a weight above :math:`2^{900}` stands for itself), so the laws stay exact there too. With
    ``deferred`` on laws that are not numpy arrays, the plain float chains instead (no mask, no recomputation:
    the ops of a chain that stays in range) and the arrays that tell whether they stayed there returned beside the
    laws, for the caller to read in a read it already does and to check on the host
    (:func:`otspec.block._weights.chains_lost`); where that finds a lost entry the caller calls again without
    ``deferred``, and its values are then this function's, bit for bit, whichever route.

    Parameters
    ----------
    names : sequence of {"block", "block-onestep"}
    P, Q, X, L, xp
        As :func:`block_path_laws`.
    drafted : tuple of two (R, L) arrays, optional, keyword-only
        ``P`` and ``Q`` at the drafted tokens (:func:`_drafted`), when already gathered.
    deferred : bool, keyword-only
        Off numpy, the float chains unchecked and ``(law, checks)`` returned, ``checks`` the ``(R, L)`` ratios and
        the chains asked for (``(ratio, w, pw)``, None for a chain not asked for:
        :func:`otspec.block._weights.chains_lost`'s arguments). Ignored on numpy (checked there: a few reductions).

    Returns
    -------
    (len(names), R, L, L + 1) array of float64, namespace and device of ``P``
        With ``deferred`` off numpy: ``(law, checks)``.
    """
    xp = namespace(P, Q) if xp is None else xp
    names = list(names)
    for n in names:
        if n not in ("block", "block-onestep"):
            raise ValueError(f"`names` must hold 'block' or 'block-onestep', got {n!r}")
    dev = _device(P)
    R = int(P.shape[0])
    px, qx = _drafted(P, Q, X, L, xp) if drafted is None else drafted
    c = _scheme_consts(tuple(names), xp, dev)
    one = c["one"]
    some = px > 0
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):  # q / 0 not taken; q / tiny p: see below
        ratio = xp.where(some, qx / px, one)  # 1 where p = 0 (weightless blocks)
    m = _block_steps(L, xp, dev)
    # the float chains, every entry whose chain left the normal range (an infinite ratio over a tiny p, a product
    # overflowing or underflowing on the way) recomputed without leaving it (path_weight_rows: the rule of
    # otspec.block's path weights, a weight above 2**900 standing for itself); with deferred, the float chains
    # unchecked, the caller checking them on the host
    onestep = "block-onestep" in names

    def chains():
        with np.errstate(over="ignore", invalid="ignore"):  # inf, nan (inf * 0): replaced by path_weight_rows
            if not onestep:
                return xp.cumulative_prod(ratio, axis=-1), None
            # S[r, j, n] = prod_{j <= i <= n} ratio[r, i] (1 for j > n), formed left to right
            S = xp.cumulative_prod(xp.where(m["suffix"], ratio[:, None, :], one), axis=-1)
            return S[:, 0, :], xp.min(xp.where(S <= 1.0, S, one), axis=1)

    deferred = deferred and not isinstance(px, np.ndarray)
    if deferred:  # the float chains as they are, checked by the caller on the host
        w, pw = chains()
        w = w if "block" in names else None
    else:
        w, pw = path_weight_rows(px, qx, xp, chains, block="block" in names, onestep=onestep, ratio=ratio)
    run = {"block": w, "block-onestep": pw}
    ones = _ones_column(len(names), R, ratio, xp)
    runs = xp.stack([run[n] for n in names], axis=0)  # (F, R, L): w_1 .. w_L
    W = xp.concat([ones, runs], axis=-1)  # (F, R, L + 1): w_0 = 1
    # P(tau = ell | X^ell), (F, R, L, 1): w capped at 1 (the one-step variant's never exceeds 1: the same values)
    top = xp.clip(runs, None, 1.0)[..., None]
    if L > 1:  # the backward walk's acceptance at depth 1..L-1, (F, R, L - 1): pos / den, 1 where den = 0
        pos, neg = _excess_sums(W, P, Q, L, xp, "block" in names)  # (F, R, L - 1) each
        if "block-onestep" in names:
            # 1 - w exact for w in [1/2, 1]: w = 1 gives h = 1; finite on "block" rows (weights at most 2**900)
            den = pos + (1.0 - W[:, :, 1:L])
            den = den if c["block"] is None else xp.where(c["block"], neg, den)
        else:
            den = neg
        some = den > 0
        with np.errstate(divide="ignore", invalid="ignore"):  # pos / 0 not taken
            acc = xp.where(some, pos / den, one)
        if "block" in names:  # capped at 1 for block verification (the one-step variant's is not)
            acc = xp.minimum(acc, c["cap"])
    else:
        acc = xp.zeros((len(names), R, 0), dtype=ratio.dtype, device=dev)
    # the backward walk of every length at once: left = (1 - top_ell) prod_{ell > s > t} (1 - a_s), multiplied from
    # s = ell - 1 down as the walk goes: one cumulative product over t reversed of G[ell - 1, t] = 1 - a_{t + 1}
    # (t < ell - 1), 1 - top_ell (t = ell - 1), 1 (t >= ell)
    ones4, acc4 = _ones_column(len(names), R, ratio, xp, (1, 1)), acc[:, :, None, :]  # (F, R, 1, .): one view
    below = xp.concat([1.0 - acc4, ones4], axis=-1)  # (F, R, 1, L): 1 - a_{t + 1}, 1 at t = L - 1
    G = xp.where(m["inside"], below, xp.where(m["last"], 1.0 - top, one))
    left = xp.flip(xp.cumulative_prod(xp.flip(G, axis=-1), axis=-1), axis=-1)  # (F, R, L, L)
    a = xp.concat([ones4, acc4], axis=-1)  # a_t, a_0 = 1
    law = xp.concat([left * a, top], axis=-1)  # a last column (t = L), never short: only its shape is read
    law = xp.where(m["short"], law, xp.where(m["full"], top, c["zero"]))
    return (law, (ratio, w, pw)) if deferred else law


def _ones_column(F: int, R: int, like, xp, shape: tuple = (1,)):
    """``(F, R) + shape`` ones (``(F, R, 1)`` by default) of ``like``'s dtype on its device for
    :func:`block_path_laws_stack`; on torch made there once per run and shape (never written: only
    concatenated)."""
    import array_api_compat

    if not array_api_compat.is_torch_array(like):
        return xp.ones((F, R) + shape, dtype=like.dtype, device=_device(like))
    import torch

    key = (F, R, shape, str(like.dtype), str(like.device))
    got = _ONES.get(key)
    if got is None:
        if len(_ONES) >= 64:
            _ONES.clear()
        got = _ONES[key] = torch.ones((F, R) + shape, dtype=like.dtype, device=like.device)
    return got


#: :func:`_ones_column`'s arrays by shape, dtype and device: made once per run.
_ONES: dict = {}


#: :func:`_scheme_consts`' arrays by (names, namespace, device): made once per run.
_SCHEMES: dict = {}


def _scheme_consts(names: tuple, xp, dev) -> dict:
    """The constants of :func:`block_path_laws_stack` for the schemes ``names`` on ``dev`` (made there once: no host
    data, no number made into a device tensor per position): ``one`` and ``zero`` (``(1,)``: 1.0, 0.0), ``cap``
    (``(F, 1, 1)``: 1 for ``"block"``, inf for ``"block-onestep"``) and ``block`` (``(F, 1, 1)`` bool,
    ``names[f] == "block"``; None when the schemes are all one or the other)."""
    key = (names, getattr(xp, "__name__", str(xp)), str(dev))
    got = _SCHEMES.get(key)
    if got is None:
        f = xp.reshape(xp.arange(len(names), device=dev), (-1, 1, 1))
        block = f == names.index("block") if "block" in names else f < 0
        one = xp.ones((1,), dtype=xp.float64, device=dev)  # (1,), not 0-d: no promotion checks in the namespace's where
        got = {"one": one, "zero": xp.zeros((1,), dtype=xp.float64, device=dev), "cap": xp.where(block, one, math.inf),
               "block": block if "block" in names and "block-onestep" in names else None}
        if len(_SCHEMES) >= 64:
            _SCHEMES.clear()
        _SCHEMES[key] = got
    return got


def _block_tau_calls(names, P, Q, X, L_max: int, xp, drafted=None, *, deferred: bool = False):
    r"""``(len(names), 2, R, L_max)``: block verification's :math:`E[\tau \mid X_r^\ell]` and expected target calls
    for every scheme of ``names``, row and length, from :func:`block_path_laws_stack` (the laws' namespace); with
    ``deferred`` off numpy, ``(values, checks)`` (:func:`block_path_laws_stack`'s ``deferred``)."""
    law = block_path_laws_stack(names, P, Q, X, L_max, xp, drafted=drafted, deferred=deferred)  # (F, R, L, L + 1)
    law, checks = law if isinstance(law, tuple) else (law, None)
    m = _block_steps(L_max, xp, _device(P))
    # sum_t law * t and 1 + sum_t law * (ell - t)_+ in one product and one sum: (F, 2, R, L) (the tau row + 0.0)
    got = xp.sum(law[:, None] * m["t_missing"], axis=-1) + m["calls_one"]
    return got if checks is None else (got, checks)


#: :func:`_block_steps`' arrays by (namespace, device, L): made once per run.
_STEPS: dict = {}


def _block_steps(L: int, xp, dev) -> dict:
    r"""The constant index arrays of :func:`block_path_laws_stack` and :func:`_block_tau_calls` at draft length
    ``L`` on ``dev`` (made once: no index arithmetic per position). For lengths :math:`\ell = 1..L` (axis -2) and
    steps ``t`` (axis -1): ``suffix[j, n]`` (``j <= n``, ``(L, L)``), ``inside`` (``t < \ell - 1``), ``last``
    (``t = \ell - 1``), ``short`` (``t < \ell``, over ``t = 0..L``), ``full`` (``t = \ell``), the float64 steps
    ``t`` and the missing tokens ``missing`` (:math:`\max(\ell - t, 0)`), both stacked as ``t_missing``
    (``(2, 1, L, L + 1)``), and ``calls_one`` (``(2, 1, 1)``: 0, 1)."""
    key = (getattr(xp, "__name__", str(xp)), str(dev), int(L))
    got = _STEPS.get(key)
    if got is None:
        t = xp.reshape(xp.arange(L + 1, device=dev), (1, L + 1))  # made where the laws are: no host data
        ell1 = xp.reshape(xp.arange(L, device=dev), (L, 1))
        got = {"suffix": ell1 <= xp.reshape(ell1, (1, L)), "inside": t[:, :L] < ell1, "last": t[:, :L] == ell1,
               "short": t <= ell1, "full": t == ell1 + 1, "t": xp.astype(t, xp.float64),
               "missing": xp.astype(xp.clip(ell1 + 1 - t, 0, None), xp.float64)}
        got["t_missing"] = xp.stack([xp.broadcast_to(got["t"], (L, L + 1)), got["missing"]], axis=0)[:, None]
        got["calls_one"] = xp.reshape(xp.astype(xp.arange(2, device=dev), xp.float64), (2, 1, 1))
        if len(_STEPS) >= 64:
            _STEPS.clear()
        _STEPS[key] = got
    return got


def prefill_batched(builds: list, verifiers, families, ks, L: int, *, subsampled=None, costly=((), ()),
                    also=(), top_k=None, read: bool = True) -> list | None:
    r"""The batched quantities of ``B`` prompts' draft trees in one pass each, put in every :class:`Builds`' cache.

    .. math::

        \alpha_k\big(p^{(b)}_j, q^{(b)}_j\big),\ \beta\big(p^{(b)}_j, q^{(b)}_j\big),\
        1 - E(\rho^*)^k,\ E[\tau_\ell \mid X^{(b)}_r] \quad \text{for every prompt } b \text{ at once},

    the cheap per-depth acceptances of ``verifiers`` (``"optimal"``/``"lp"``: :math:`\alpha_k`; ``"token"``;
    ``"kseq"``) and the batched :math:`E[\tau \mid X]` rows of ``families`` (``"token"``, ``"block"``,
    ``"block-onestep"``), each computed on the stacked ``(B, ...)`` laws of the prompts walked together (one
    sort, one launch for all of them, instead of one per prompt) and sliced into each
    prompt's cache under the key :func:`depth_quantities` and :func:`expected_accepted` read, so their values are
    the per-prompt route's (the same per-row arithmetic). With ``subsampled`` (one bool per prompt: whether its
    costly quantities run at this position), the batched forms of the costly quantities ``costly`` (a pair:
    verifiers, families) of those prompts too, where they have one (:func:`acc_part`, :func:`reach_part`), for
    all of them at once (every node of their draft trees in one pass, a node's law its own prompt's). Every
    value is read into host memory in one read (:func:`read_parts`: a single synchronisation on a GPU), with the
    caller's parts ``also`` (``(array, store)`` pairs of :func:`read_parts`, stored first: the position's pending
    bad-logits flags and the path's target law). When the subsampled prompts' quantities build verifiers on the host
    copy of the laws (:func:`needs_host`), their supports and the laws' values there come in that read too
    (:func:`support_parts`: gathered to :func:`support_width` at ``top_k``, the sampling's truncation, or the laws
    whole when that is the vocabulary), so that copy takes no read of its own. For laws
    on an accelerator; ``builds`` share one namespace, shapes and options; ``ks(name)`` gives each name's numbers
    of drafts. With ``read=False`` nothing is read: the parts are returned (``(array, store)`` pairs, the arrays
    computed), for the caller to read with a later read of its own (:func:`read_parts`); the caches are filled
    by their stores then.
    """
    b0 = builds[0]
    xp = b0.xp
    P = xp.stack([b.P for b in builds], axis=0)  # (B, k_max, L_max, V)
    Q = xp.stack([b.Q for b in builds], axis=0)
    P0, Q0 = P[:, 0, :L], Q[:, 0, :L]
    B = len(builds)
    parts = []  # (values on the device, what to do with their host copy): read together, one host read for all
    rho = RhoStar(xp)  # k-Seq's rho* of every prompt, depth, node and k of the position: one root search
    parts += list(also)

    def spread(key, shape, move=None):
        def store(vals):
            vals = vals.reshape(shape)
            vals = vals if move is None else np.moveaxis(vals, move, 0)
            for b, bl in enumerate(builds):
                bl._batched[key] = vals[b]
        return store

    names = set(verifiers)
    alpha_ks = sorted({tuple(ks(n)) for n in names & {"optimal", "lp"}})
    for kk in alpha_ks:
        parts.append((alpha_k(P0, Q0, list(kk), validate=False, workers=1), spread(("alpha", kk, L), (B, L, len(kk)))))
    on = [b for b, o in enumerate(subsampled or ()) if o]
    # k-Seq's acceptance on every prompt's first block (cheap, or costly with every prompt subsampled): token
    # verification's acceptance handed from its part (its sum of min(p, q), the k = 1 column's): one sum for both
    kseq_all = not b0.options.get("kseq") and ("kseq" in names or ("kseq" in costly[0] and len(on) == B))
    token = spread(("token-acc", L), (B, L)) if "token" in names else None
    if token is not None and not kseq_all:
        parts.append((_token_acceptance(P0, Q0), token))
        token = None
    if "kseq" in names and not b0.options.get("kseq"):
        kk = tuple(ks("kseq"))
        parts.append((_kseq_acceptance(P0, Q0, kk, xp, rho, token=token), spread(("kseq", kk, L), (B, L, len(kk)))))
        token = None
    k_max = int(P.shape[1])
    R = B * k_max
    X = xp.reshape(xp.stack([b.tokens() for b in builds], axis=0), (R, -1))
    Pr, Qr = xp.reshape(P, (R,) + tuple(P.shape[2:])), xp.reshape(Q, (R,) + tuple(Q.shape[2:]))
    blocks = [name for name in ("block", "block-onestep") if name in families]
    drafted = _drafted(Pr, Qr, X, L, xp) if blocks or "token" in families else None  # shared by both
    if blocks:  # both schemes in one batched pass
        spreads = [spread(("block", name, L), (2, B, k_max, L), 1) for name in blocks]

        got = _block_tau_calls(blocks, Pr, Qr, X, L, xp, drafted, deferred=True)
        vals, checks = got if isinstance(got, tuple) else (got, ())
        seen: list = []  # the float chains' ratios and products, read with the values (off numpy)

        def store_blocks(vals):
            # a lost entry of the float chains (a draft probability below about 1e-154, a product over- or
            # underflowing on the way): every value again with the chains exact past the range, read on its own
            if checks and chains_lost(*(seen.pop(0) if c is not None else None for c in checks)):  # stored first
                vals = to_host(_block_tau_calls(blocks, Pr, Qr, X, L, xp, drafted))
            vals = vals.reshape((len(blocks), 2 * B * k_max * L))
            for f, put in enumerate(spreads):
                put(vals[f])

        parts += [(c, seen.append) for c in checks if c is not None]  # stored before the values: read first
        parts.append((vals, store_blocks))
    if "token" in families:
        parts.append((_token_reach(Pr, Qr, X, L, xp, drafted), spread(("token", L), (B, k_max, L))))
    if on:  # the costly quantities of the subsampled prompts, each for all of them at once
        sub = [builds[b] for b in on]
        if needs_host([*verifiers, *costly[0]], [*families, *costly[1]], ks, b0.options, k_max):
            # their supports first: the stores of the parts after them may build verifiers on the host copy
            parts[len(also):len(also)] = [p for b in sub for p in support_parts(b, support_width(top_k, b.P, b.Q), top_k)]
        if len(on) == B:
            P0s, Q0s, laws = P0, Q0, (Pr, Qr, X, drafted)
        else:
            P0s, Q0s, laws = xp.stack([b.P[0, :L] for b in sub]), xp.stack([b.Q[0, :L] for b in sub]), None
        for name in costly[0]:
            got = _acc_rows(name, tuple(ks(name)), P0s, Q0s, xp, b0.options, L, rho, token)
            if got is not None:
                parts.append((got[1](), _spread_over(sub, got[0])))
        for name in costly[1]:
            got = _reach_rows(name, tuple(ks(name)), sub, L, rho, laws)
            if got is not None:
                parts.extend(got[1]())
    rho.solve()
    # k-Seq's parts (the functions, computed from rho*) stored again from values computed again where the check of
    # rho*'s tiny-beta rows, read with them and stored first, solved some row again on the host
    parts = [(a(), rho.refreshed(a, store)) if callable(a) else (a, store) for a, store in parts]
    check = rho.check_part()
    if check is not None:
        parts.insert(len(also), check)
    if not read:
        return parts
    read_parts(parts)
    return None


def _spread_over(builds: list, key):
    """A store of :func:`read_parts` putting ``vals[i]`` in the cache of ``builds[i]`` under ``key``."""
    def store(vals):
        for i, b in enumerate(builds):
            b._batched[key] = vals[i]
    return store


def _excess_sums(W, P, Q, L: int, xp, both: bool):
    r"""``pos[..., r, t - 1] = \sum_x (W_{..., r,t} Q_{r,t}(x) - P_{r,t}(x))_+`` for ``t = 1..L-1`` (and ``neg``, of
    the negative part, when ``both``); ``W`` is ``(R, L + 1)`` or ``(F, R, L + 1)`` (one row of weights per scheme).

    Host (numpy) laws row by row and depth by depth into two reused ``(V,)``
    buffers: fresh row-sized temporaries cost more in page faults than in
    arithmetic at ``V = 49,152``; the same sums, bit for bit. Other arrays
    (a GPU) in one batched pass over ``(R, L - 1, V)``.
    """
    if isinstance(P, np.ndarray):
        if W.ndim == 3:
            got = [_excess_sums(w, P, Q, L, xp, both) for w in W]
            return np.stack([g[0] for g in got]), (np.stack([g[1] for g in got]) if both else None)
        R = P.shape[0]
        pos = np.zeros((R, L - 1))
        neg = np.zeros((R, L - 1)) if both else None
        d = np.empty(P.shape[-1])
        part = np.empty(P.shape[-1])
        for r in range(R):
            for t in range(1, L):
                np.multiply(Q[r, t], W[r, t], out=d)
                np.subtract(d, P[r, t], out=d)
                pos[r, t - 1] = np.maximum(d, 0.0, out=part).sum()
                if both:  # the sum of min(d, 0), negated: the same sum as of max(-d, 0), one pass fewer
                    neg[r, t - 1] = -np.minimum(d, 0.0, out=part).sum()
        return pos, neg
    d = W[..., 1:L, None] * Q[:, 1:L] - P[:, 1:L]
    return xp.sum(xp.clip(d, 0.0, None), axis=-1), (xp.sum(xp.clip(-d, 0.0, None), axis=-1) if both else None)


def _device(x):
    import array_api_compat

    return array_api_compat.device(x)


def _group_mean(rows: np.ndarray, k: int, G: int) -> np.ndarray:
    """The mean over the ``G`` groups of ``k`` blocks of each group's first row (summed in group order)."""
    out = np.zeros(rows.shape[1:])
    for g in range(G):
        out += rows[g * k] / G
    return out


def expected_accepted(name: str, k: int, builds: Builds, L_max: int) -> dict:
    r"""Exact :math:`E[\tau_L \mid X]` for ``L = 1..L_max`` (and the expected target calls of ``"block"``).

    .. math::

        \bar\tau_L = \frac{1}{G} \sum_{g=1}^{G} E\big[\tau_L \mid X^{(g)}\big],
        \qquad G = \lfloor k_{\max} / k \rfloor,

    averaged over the ``G`` disjoint groups of ``k`` drawn blocks (each group
    an independent draw of ``k`` i.i.d. blocks, so the average is unbiased for
    :math:`E[\tau_L]` and exact given the drafts). Token-level schemes use
    :func:`tree_reach` (``E[\tau_L] = \sum_{j \le L} P(\tau \ge j)``: a
    shorter draft is the same selection stopped earlier; token verification
    by products of :math:`\min(1, q/p)` along each block, batched; k-Seq,
    multi-round and typical acceptance from their conditional laws at every
    node batched over the nodes of each depth, for every ``k`` of the grid at
    once: :func:`reach_part`; the optimal verifier and Khisti et al.'s rule
    with :math:`\min(1, q/p)` at every node with one draft, batched, and the
    verifier built at each node with several); block
    schemes :func:`block_path_laws` (every row and length in one batched
    pass). Sun et al.'s (arXiv:2403.10444) Algorithm 3 (``"block"``) draws
    its multi-token residual with one extra target call per missing token, so
    it emits ``L + 1`` tokens in :math:`1 + E[(L - \tau)\,\mathbb 1\{\tau < L\}]`
    calls; ``"block-onestep"`` emits :math:`\tau + 1` in one call.

    Returns
    -------
    dict
        ``{"tau": (L_max,) ndarray}``, plus ``"calls"`` for ``"block"``.
    """
    k_max = builds.X.shape[0]
    G = k_max // k
    spec = get_verifier(name)
    xp = builds.xp
    if spec.kind == "block":
        both = builds.batched(("block", name, L_max), lambda: to_host(
            _block_tau_calls((name,), builds.P, builds.Q, builds.tokens(), L_max, xp)[0]))  # (2, k_max, L_max)
        out = {"tau": _group_mean(both[0], 1, G)}
        if name == "block":
            out["calls"] = _group_mean(both[1], 1, G)
        return out
    if name == "token":
        reach = builds.batched(("token", L_max), lambda: to_host(_token_reach_rows(builds, L_max)))
        return {"tau": np.cumsum(_group_mean(reach, k, G))}
    ks = (1,) if spec.single_draft else tuple(range(1, k_max + 1))  # every k of the profile's grid at once
    part = reach_part(name, ks if k in ks else (k,), builds, L_max)
    if part is not None:  # the conditional laws of every node batched (prefill_batched may have read them already)
        keys, make = part
        return {"tau": np.cumsum(builds.value(keys[k], make))}
    reach = np.zeros(L_max)
    for g in range(G):
        rows = list(range(g * k, (g + 1) * k))
        reach += tree_reach(name, rows, builds, L_max) / G
    return {"tau": np.cumsum(reach)}
