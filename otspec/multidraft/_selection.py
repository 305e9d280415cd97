r"""Select one draft, then one speculative-sampling step: the part every optimal-verifier rule shares.

Given the law ``z`` of the selected draft ``Z``, accept it with probability
:math:`a = \min(1, q(Z)/z(Z))`, otherwise draw the output from the residual
:math:`(q - z)_+ / \sum (q - z)_+`. Lossless whatever the selection rule
(docs, "Theory: the optimal verifier"). Subclasses give the rule:
``selection_law(drafts)`` and ``_pick(drafts, gen)``.

Notation: ``p`` is the draft distribution, ``q`` the target.
"""

from __future__ import annotations

import abc

import numpy as np

from .._validation import as_rng
from .._verifier import Verifier, coin_accept


def above_noise(excess: np.ndarray, noise: float) -> np.ndarray:
    """Indices of the positive entries of ``excess`` left after skipping the smallest ones up to a total of ``noise``."""
    pos = np.flatnonzero(excess > 0)
    if pos.size == 0:
        return pos
    srt = pos[np.argsort(excess[pos], kind="stable")]
    csum = np.cumsum(excess[srt])
    return np.sort(srt[csum > noise])


class SelectThenSpeculate(Verifier):
    """Base of the selection-rule verifiers: ``z``, the acceptance coin, the residual and the report."""

    def _init_speculative(self, z: np.ndarray) -> None:
        q = self.q
        n = q.shape[0]
        self._z = z
        # a(y) = min(1, q/z), the strict coin u z(y) < q(y) of sample(): divided only where z > q (elsewhere q/z of
        # a subnormal z overflowed, unused); tokens never selected (z = 0) get 1, or 0 where q = 0 as the coin does
        self._a = coin_accept(q, z)
        r = np.maximum(q - z, 0.0)
        rs = r.sum()
        self._res = r / rs if rs > 0 else np.array(q)
        self._res_cdf = np.cumsum(self._res)
        self._res_last = int(np.flatnonzero(self._res > 0)[-1]) if np.any(self._res > 0) else n - 1

    def _init_report(self, alpha: float, acceptance: float, tol: float, status: str, method: str, n_iter: int,
                     *, slack: float | None = None):
        r"""Record ``alpha``, the acceptance, ``gap = alpha - acceptance`` and the status.

        The status compares the size of the gap, ``|gap| <= tol`` for
        ``"optimal"``: no valid verifier accepts more than :math:`\alpha_k`
        (it is the optimum), so an acceptance above it is not "optimal" but
        rounding or a defect. ``status`` is the construction's own word for
        a gap above ``tol`` (``"optimal"`` there becomes ``"suboptimal"``).
        ``slack`` (default ``tol``): the float64 rounding bound of
        ``alpha`` and the acceptance, the most the computed acceptance can
        exceed :math:`\alpha_k` by rounding alone. An acceptance above
        :math:`\alpha_k` by at most ``max(tol, slack)`` (only when ``tol <
        slack``) has the status ``"rounding"``; by more, the construction is
        wrong (its ``z`` is not the law of a selection rule, or the
        acceptance was summed wrongly), and :class:`RuntimeError` is raised
        with the numbers.
        """
        self._alpha = float(alpha)
        self._acceptance = float(acceptance)
        self._gap = float(self._alpha - self._acceptance)
        bound = max(float(tol), float(tol if slack is None else slack))
        if self._gap < -bound:
            raise RuntimeError(
                f"internal error: the acceptance {self._acceptance!r} of the {method!r} construction (n={self.n}, "
                f"k={self.k}) exceeds alpha_k = {self._alpha!r} by {-self._gap:.3e}, beyond its float64 rounding "
                f"bound {bound:.3e}: no lossless verifier accepts more than alpha_k, so its selected-token law z is "
                "not the law of its selection rule or the acceptance was computed wrongly; please report this input"
            )
        if abs(self._gap) <= tol:
            self._status = "optimal"
        elif self._gap < 0:
            self._status = "rounding"  # above alpha_k by rounding alone (tol below the rounding bound)
        else:
            self._status = status if status != "optimal" else "suboptimal"
        self._method = str(method)
        self._n_iter = int(n_iter)
        self._tol = float(tol)
        for arr in (self._z, self._a, self._res, self._res_cdf):
            arr.setflags(write=False)

    @property
    def z(self) -> np.ndarray:
        """(n,) law of the selected token."""
        return self._z

    @property
    def residual(self) -> np.ndarray:
        """(n,) normalised residual :math:`(q - z)_+ / \\sum (q - z)_+` drawn after a rejection."""
        return self._res

    @property
    def alpha(self) -> float:
        """:math:`\\alpha_k(p, q)`, the optimum (closed form)."""
        return self._alpha

    @property
    def gap(self) -> float:
        """``alpha - acceptance()``, signed (zero up to rounding when optimal; never below ``-tol`` but by rounding)."""
        return self._gap

    @property
    def status(self) -> str:
        """``"optimal"`` when ``|gap| <= tol``; else ``"rounding"`` or why the construction stopped short.

        ``"rounding"``: above :math:`\\alpha_k` by no more than the float64
        rounding bound of the construction (possible only with a ``tol``
        below that bound), or, for the priority-key layout, short of it by
        no more than that bound. ``"suboptimal"``, ``"max_iter"``,
        ``"stalled"``, ``"solver:<HiGHS status>"``: short of it by more. An
        acceptance above :math:`\\alpha_k` beyond the rounding bound is never
        reported: the construction raises :class:`RuntimeError`.
        """
        return self._status

    @property
    def method(self) -> str:
        """The construction used (``"keys"``, ``"direct"``, ``"direct+colgen"`` or ``"colgen"``)."""
        return self._method

    @property
    def n_iter(self) -> int:
        """Carathéodory steps (direct), pricing rounds (column generation), 0 for the key layout."""
        return self._n_iter

    @property
    def tol(self) -> float:
        """The gap tolerance behind ``status``."""
        return self._tol

    @property
    def success(self) -> bool:
        """``status == "optimal"``."""
        return self.status == "optimal"

    @abc.abstractmethod
    def selection_law(self, drafts) -> np.ndarray:
        """(n,) law of the selected token given the drafts (before the speculative step)."""

    @abc.abstractmethod
    def _pick(self, x, gen) -> int:
        """The selected draft token for the validated drafts ``x``, randomness from ``gen``."""

    def conditional(self, drafts) -> np.ndarray:
        law = self.selection_law(drafts)
        acc = law * self._a
        out = (float(law.sum()) - float(acc.sum())) * self._res
        out += acc
        return out

    def acceptance(self) -> float:
        return self._acceptance

    def sample(self, drafts, *, rng=None) -> int:
        x = self._drafts(drafts)
        gen = as_rng(rng)
        y = self._pick(x, gen)
        # strict, division-free acceptance test u * z(y) < q(y) (u uniform on [0, 1))
        if gen.random() * self._z[y] < self.q[y]:
            return int(y)
        # inverse CDF on the precomputed cumulative residual, O(log n)
        c = self._res_cdf
        i = int(np.searchsorted(c, gen.random() * c[-1], side="right"))
        i = min(i, self._res_last)
        while self._res[i] <= 0 and i > 0:  # skip zero-mass cells (rounding at a boundary)
            i -= 1
        return i
