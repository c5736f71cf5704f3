"""Per-peer privacy budgets (the seed's Algorithm 2): the ledger, affordable counts, the registry.

Every peer starts with ``epsilon_total`` (and ``delta_total``); every group aggregation it
joins releases one noisy model computed from its shard, at ``(epsilon_per_aggregation,
delta_per_aggregation)`` for a change of one record of its shard. A peer that cannot afford one
more aggregation leaves the candidate set. The ledger (:class:`BudgetLedger`) counts
aggregations per peer (integers, so no floating-point drift from repeated subtraction) and the
accountant turns a count ``k`` into the epsilon spent, at ``delta_total``: ``basic``, ``rdp``
and ``gdp`` (:mod:`p2pdp.privacy.accountants`) or ``pld`` (:mod:`p2pdp.privacy.pld`), found by
name here (:func:`make_accountant`; ``"auto"``: :func:`resolve_accountant_name`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from p2pdp.core.boundary import calling, check_methods, problem
from p2pdp.core.errors import BudgetExhaustedError, ConfigError
from p2pdp.core.validation import require_count, require_positive, require_probability
from p2pdp.privacy.accountants import (
    ACCOUNTANT_METHODS,
    Accountant,
    BasicAccountant,
    GdpAccountant,
    RdpAccountant,
    _counts,
    composed,
)
from p2pdp.privacy.calibration import analytic_gaussian_sigma
from p2pdp.privacy.events import EpsilonDeltaEvent, GaussianEvent, PrivacyEvent
from p2pdp.privacy.pld import PldAccountant
from p2pdp.privacy.tolerance import BUDGET_TOLERANCE

ACCOUNTANTS: tuple[str, ...] = ("basic", "rdp", "gdp", "pld")

#: Accountants that compose only Gaussian releases (they need ``delta > 0``).
GAUSSIAN_ACCOUNTANTS: tuple[str, ...] = ("rdp", "gdp")

#: Accountants whose epsilon the README's budget table compares.
BUDGET_TABLE_ACCOUNTANTS: tuple[str, ...] = ("basic", "rdp", "gdp")

#: (epsilon_total, epsilon_per_aggregation, delta_total, delta_per_aggregation) rows of the
#: README budget table; ``delta_per_aggregation = delta_total / floor(eps/eps_A)`` so that the
#: delta budget does not bind under basic composition.
BUDGET_TABLE_SETTINGS: tuple[tuple[float, float, float, float], ...] = (
    (0.5, 0.1, 1e-5, 2e-6),
    (1.0, 0.1, 1e-5, 1e-6),
    (1.0, 0.2, 1e-5, 2e-6),
    (1.0, 0.5, 1e-5, 5e-6),
    (2.0, 0.2, 1e-5, 1e-6),
    (10.0, 1.0, 1e-5, 1e-6),
)


def _validate_step(
    epsilon_per_aggregation: float,
    delta_total: float,
    delta_per_aggregation: float,
    accountant: str,
) -> tuple[float, float, float]:
    """Validated ``(epsilon_A, delta_total, delta_A)`` as floats."""
    if accountant not in ACCOUNTANTS:
        raise ConfigError(f"accountant must be one of {ACCOUNTANTS}, got {accountant!r}")
    eps_step = require_positive("epsilon_per_aggregation", epsilon_per_aggregation)
    delta_total = require_probability("delta_total", delta_total, high_open=True)
    delta_step = require_probability("delta_per_aggregation", delta_per_aggregation, high_open=True)
    if delta_step > delta_total:
        raise ConfigError(
            f"delta_per_aggregation must be <= delta_total ({delta_total!r}), got {delta_step!r}"
        )
    if accountant in GAUSSIAN_ACCOUNTANTS and delta_step == 0:
        raise ConfigError(
            f"accountant {accountant!r} is for the gaussian mechanism and needs "
            f"delta_per_aggregation in (0, 1), got {delta_per_aggregation!r}"
        )
    return eps_step, delta_total, delta_step


_ACCOUNTANTS: dict[str, Accountant] = {
    "basic": BasicAccountant(),
    "rdp": RdpAccountant(),
    "gdp": GdpAccountant(),
    "pld": PldAccountant(),
}


def resolve_accountant_name(accountant: str, mechanism: str) -> str:
    """``privacy.accountant`` with ``"auto"`` resolved: ``gdp`` for Gaussian releases, else basic.

    A mechanism counts as Gaussian when its class is (a subclass of)
    :class:`p2pdp.privacy.mechanisms.Gaussian`, whose releases declare a
    :class:`~p2pdp.privacy.events.GaussianEvent`. Any other name is returned unchanged.
    """
    if accountant != "auto":
        return accountant
    from p2pdp.privacy.mechanisms import Gaussian, mechanism_class

    try:
        cls = mechanism_class(mechanism)
    except ConfigError:
        return "basic"
    return "gdp" if isinstance(cls, type) and issubclass(cls, Gaussian) else "basic"


def make_accountant(accountant: str | Accountant) -> Accountant:
    """An accountant instance from a registered name, an import string or an instance."""
    if isinstance(accountant, Accountant):
        return accountant
    if accountant in _ACCOUNTANTS:
        return _ACCOUNTANTS[accountant]
    from p2pdp.core.components import resolve

    target = resolve("accountant", accountant, key="privacy.accountant")
    if isinstance(target, type):
        with calling("accountant", target, "__init__"):
            target = target()
    check_methods(target, "accountant", ACCOUNTANT_METHODS, "p2pdp.privacy.accountants.Accountant")
    return target


def step_event(
    epsilon_per_aggregation: float, delta_per_aggregation: float, accountant: str
) -> PrivacyEvent:
    """The event of one release at ``(epsilon_A, delta_A)``: Gaussian for rdp/gdp, else plain."""
    if accountant in GAUSSIAN_ACCOUNTANTS:
        sigma = analytic_gaussian_sigma(epsilon_per_aggregation, delta_per_aggregation, 1.0)
        return GaussianEvent(sigma, epsilon_per_aggregation, delta_per_aggregation)
    return EpsilonDeltaEvent(epsilon_per_aggregation, delta_per_aggregation)


def composed_epsilon(
    n_aggregations: int | np.ndarray,
    *,
    epsilon_per_aggregation: float,
    delta_total: float = 0.0,
    delta_per_aggregation: float = 0.0,
    accountant: str = "basic",
) -> np.ndarray:
    """Epsilon spent, at ``delta_total``, after ``n_aggregations`` releases of one peer.

    A convenience over :class:`Accountant` for releases calibrated to ``(epsilon_A,
    delta_A)`` (``rdp``: the analytic Gaussian mechanism at that calibration).

    Parameters
    ----------
    n_aggregations : int or ndarray of int, any shape
        Number of aggregations joined, >= 0.
    epsilon_per_aggregation, delta_per_aggregation : float
        Guarantee of one release (for ``rdp``: the Gaussian mechanism's calibration).
    delta_total : float
        Delta at which the composition is stated.
    accountant : {"basic", "rdp"}

    Returns
    -------
    ndarray of float, same shape as ``n_aggregations``
        ``inf`` where no epsilon is valid at ``delta_total`` (basic: ``k * delta_A >
        delta_total``); 0 where ``k = 0``.
    """
    eps_step, delta_total, delta_step = _validate_step(
        epsilon_per_aggregation, delta_total, delta_per_aggregation, accountant
    )
    counts = _counts(n_aggregations)
    event = step_event(eps_step, delta_step, accountant)
    return _ACCOUNTANTS[accountant].composed_epsilon(event, counts, delta_total=delta_total)


#: More releases per peer than any budget affords: an accountant that allows them is broken.
_MAX_RELEASES = 2**40


def affordable(
    accountant: Accountant,
    event: PrivacyEvent,
    *,
    epsilon_total: float,
    delta_total: float,
    at_most: int | None = None,
) -> int:
    """Largest number of releases of ``event`` whose composed epsilon is <= ``epsilon_total``.

    Up to the relative :data:`BUDGET_TOLERANCE`; 0 if not even one fits. Found by doubling
    and bisection on ``k`` (the composed epsilon increases with ``k``). ``at_most``: no more
    can happen in the run, so the search stops there (a very noisy event affords more).
    A built-in accountant's answer, a function of the arguments only, is searched once per
    process (a sweep builds a ledger for every cell).
    """
    if any(accountant is builtin for builtin in _ACCOUNTANTS.values()):
        try:
            hash(event)
        except TypeError:  # an event of one's own may not be hashable
            pass
        else:
            return _affordable_builtin(accountant, event, epsilon_total, delta_total, at_most)
    return _affordable(accountant, event, epsilon_total, delta_total, at_most)


def _affordable(
    accountant: Accountant,
    event: PrivacyEvent,
    epsilon_total: float,
    delta_total: float,
    at_most: int | None,
) -> int:
    """:func:`affordable`'s search."""
    limit = epsilon_total * (1 + BUDGET_TOLERANCE)

    def fits(k: int) -> bool:
        spent = composed(accountant, event, np.array(k), delta_total=delta_total)
        return bool(spent <= limit)

    if at_most is not None and fits(at_most):
        return at_most
    if not fits(1):
        return 0
    low, high = 1, 2
    while fits(high):
        if high > _MAX_RELEASES:
            raise problem(
                "accountant",
                accountant,
                "composed_epsilon",
                f"stays <= epsilon_total = {epsilon_total:g} for {high} releases: it must grow "
                "with the number of releases",
            )
        low, high = high, 2 * high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


_affordable_builtin = functools.lru_cache(maxsize=256)(_affordable)


def affordable_aggregations(
    epsilon_total: float,
    epsilon_per_aggregation: float,
    delta_total: float = 0.0,
    delta_per_aggregation: float = 0.0,
    accountant: str = "basic",
) -> int:
    """Largest number of aggregations a peer can join within its budget.

    The largest ``k`` with :func:`composed_epsilon` ``(k) <= epsilon_total`` (up to the relative
    :data:`BUDGET_TOLERANCE`), e.g. ``basic`` with ``(1.0, 0.1)`` gives 10.
    """
    eps_step, delta_total, delta_step = _validate_step(
        epsilon_per_aggregation, delta_total, delta_per_aggregation, accountant
    )
    eps_total = _validate_total(epsilon_total, eps_step)
    event = step_event(eps_step, delta_step, accountant)
    return affordable(
        _ACCOUNTANTS[accountant], event, epsilon_total=eps_total, delta_total=delta_total
    )


def _validate_total(epsilon_total: float, eps_step: float) -> float:
    eps_total = require_positive("epsilon_total", epsilon_total)
    if eps_step > eps_total * (1 + BUDGET_TOLERANCE):
        raise ConfigError(
            f"epsilon_per_aggregation must be <= epsilon_total ({eps_total!r}), got {eps_step!r}"
        )
    return eps_total


def budget_table(
    settings: Sequence[tuple[float, float, float, float]] = BUDGET_TABLE_SETTINGS,
) -> list[dict[str, float | int]]:
    """Affordable aggregations per peer under each accountant for the Gaussian mechanism.

    Parameters
    ----------
    settings : sequence of (epsilon_total, epsilon_per_aggregation, delta_total,
        delta_per_aggregation)

    Returns
    -------
    list of dict
        One row per setting with those four keys plus ``basic``, ``rdp`` and ``gdp`` (counts).
    """
    rows = []
    for eps_total, eps_step, delta_total, delta_step in settings:
        row: dict[str, float | int] = {
            "epsilon_total": eps_total,
            "epsilon_per_aggregation": eps_step,
            "delta_total": delta_total,
            "delta_per_aggregation": delta_step,
        }
        for accountant in BUDGET_TABLE_ACCOUNTANTS:
            row[accountant] = affordable_aggregations(
                eps_total, eps_step, delta_total, delta_step, accountant
            )
        rows.append(row)
    return rows


def format_budget_table(rows: Sequence[dict[str, float | int]]) -> str:
    """Markdown table of :func:`budget_table` rows (for the README)."""
    lines = [
        "| epsilon | epsilon_A | delta | delta_A | basic | rdp | gdp |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['epsilon_total']:g} | {row['epsilon_per_aggregation']:g} "
            f"| {row['delta_total']:g} | {row['delta_per_aggregation']:g} "
            f"| {row['basic']} | {row['rdp']} | {row['gdp']} |"
        )
    return "\n".join(lines)


#: Arrays of at most this many peer ids are checked with Python builtins (faster when short).
_SMALL = 256


class BudgetLedger:
    """Vectorised per-peer budget ledger for ``n_peers`` peers (tested up to 100,000).

    Holds one integer count of aggregations joined per peer. Use it as the seed's Algorithm 2:
    :meth:`check` the group before any noise is drawn, :meth:`spend` once the noisy model is
    released. :meth:`spend` is all-or-nothing: it raises and changes nothing if any peer would
    overspend, so a fault cannot make a peer pay twice or not at all.

    Parameters
    ----------
    n_peers : int
        Number of peers ``P >= 1``; peers are identified by 0..P-1.
    epsilon_total, delta_total : float
        Budget of each peer (``epsilon_total > 0``; ``delta_total`` in [0, 1)).
    epsilon_per_aggregation, delta_per_aggregation : float
        Cost of one aggregation (``0 < epsilon_A <= epsilon_total``; ``delta_A <= delta_total``).
    accountant : str or Accountant
        ``"basic"``, ``"rdp"`` (Gaussian only), or any :class:`Accountant`.
    event : PrivacyEvent, optional
        What one aggregation releases, as the run's mechanism declares it
        (:meth:`p2pdp.privacy.mechanisms.Mechanism.budget_event`); the accountant composes it.
        Default: the event of a release calibrated to ``(epsilon_A, delta_A)``
        (:func:`step_event`).

    Attributes
    ----------
    max_aggregations : int
        Aggregations every peer can afford.
    """

    def __init__(
        self,
        n_peers: int,
        *,
        epsilon_total: float,
        epsilon_per_aggregation: float,
        delta_total: float = 0.0,
        delta_per_aggregation: float = 0.0,
        accountant: str | Accountant = "basic",
        event: PrivacyEvent | None = None,
    ) -> None:
        self.n_peers = require_count("n_peers", n_peers)
        name = accountant.name if isinstance(accountant, Accountant) else accountant
        eps_step, delta_total, delta_step = _validate_step(
            epsilon_per_aggregation,
            delta_total,
            delta_per_aggregation,
            name if name in ACCOUNTANTS else "basic",
        )
        self.epsilon_total = _validate_total(epsilon_total, eps_step)
        self.delta_total = delta_total
        self.accountant = make_accountant(accountant)
        self.event = event if event is not None else step_event(eps_step, delta_step, name)
        with calling("accountant", self.accountant, "check"):
            self.accountant.check(self.event)
        self.max_aggregations = affordable(
            self.accountant, self.event, epsilon_total=self.epsilon_total, delta_total=delta_total
        )
        self._counts = np.zeros(self.n_peers, dtype=np.int64)
        self._slots: np.ndarray | None = None  # (P,) scratch of _distinct, made on first use

    def _peer_ids(self, peers: np.ndarray | Sequence[int]) -> np.ndarray:
        ids = np.asarray(peers)
        if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
            raise ConfigError(f"peers must be a 1-D sequence of integer ids, got {peers!r}")
        if ids.size:
            # a group is small: Python's min/max on a list beat two numpy reductions there
            if ids.size <= _SMALL:
                values = ids.tolist()
                low, high = min(values), max(values)
            else:
                low, high = ids.min(), ids.max()
            if low < 0 or high >= self.n_peers:
                raise ConfigError(f"peers must be ids in [0, {self.n_peers}), got {peers!r}")
        return ids

    def can_afford(self, peers: np.ndarray | Sequence[int]) -> np.ndarray:
        """Bool per peer (shape (len(peers),)): can it afford one more aggregation?"""
        return self._counts[self._peer_ids(peers)] < self.max_aggregations

    def check(self, peers: np.ndarray | Sequence[int]) -> None:
        """Raise BudgetExhaustedError naming the peers that cannot afford one more aggregation."""
        self.refuse_broke(self._peer_ids(peers))

    def refuse_broke(self, ids: np.ndarray, spent: np.ndarray | None = None) -> None:
        """Raise BudgetExhaustedError naming the ``ids`` whose count (``spent``, default the
        ledger's) leaves no aggregation.

        ``ids`` is an int64 array of valid peer ids (not checked here: :meth:`check` checks
        them); ``spent`` (same shape) the counts to judge them by, for a driver that keeps its
        own counts until :meth:`write_counts`.
        """
        spent = self._counts[ids] if spent is None else spent
        broke = ids[spent >= self.max_aggregations]
        if broke.size:
            raise BudgetExhaustedError(
                f"peers {broke.tolist()} have used all {self.max_aggregations} aggregations of "
                f"epsilon_total={self.epsilon_total} ({self.accountant.name} accountant)"
            )

    def spend(self, peers: np.ndarray | Sequence[int]) -> None:
        """Record one aggregation for each of ``peers`` (distinct ids); all or nothing."""
        ids = self._peer_ids(peers)
        if ids.size > 1 and not self._distinct(ids):
            raise ConfigError(f"peers must be distinct ids, got {peers!r}")
        self.refuse_broke(ids)
        self._counts[ids] += 1

    def _distinct(self, ids: np.ndarray) -> bool:
        """Whether the valid ids ``ids`` are distinct. Past ``_SMALL`` ids, each writes its
        position into a scratch array of P slots and reads it back: an id that repeats has
        one slot for two positions, so one of them reads the other's (whichever write
        lands last); O(len(ids)), where a sort or hash (``np.unique``) costs 20x more."""
        if ids.size <= _SMALL:
            return len(set(ids.tolist())) == ids.size
        if self._slots is None:
            self._slots = np.empty(self.n_peers, dtype=np.int64)
        positions = np.arange(ids.size)
        self._slots[ids] = positions
        return bool((self._slots[ids] == positions).all())

    def write_counts(self, counts: Sequence[int], ids: Sequence[int] | None = None) -> None:
        """Set the aggregation counts of ``ids`` (every peer if None) to ``counts``.

        For a driver that charges its peers outside the ledger, each charge checked with
        :meth:`refuse_broke` (:class:`p2pdp.sim.waves.DrawnCharges`). A count never decreases
        and never exceeds ``max_aggregations``: either would understate what was spent, so it
        raises ConfigError and writes nothing.
        """
        new = np.asarray(counts, dtype=np.int64)
        rows = slice(None) if ids is None else np.asarray(ids, dtype=np.int64)
        old = self._counts[rows]
        if new.shape != old.shape:
            raise ConfigError(f"counts must have shape {old.shape}, got {new.shape}")
        if not ((old <= new) & (new <= self.max_aggregations)).all():
            raise ConfigError(
                f"counts must not decrease nor exceed max_aggregations={self.max_aggregations}"
            )
        self._counts[rows] = new

    def spent_epsilon(self) -> np.ndarray:
        """Epsilon spent by each peer under the ledger's accountant, shape (P,)."""
        return composed(self.accountant, self.event, self._counts, delta_total=self.delta_total)

    def aggregations(self, peers: np.ndarray | Sequence[int] | None = None) -> np.ndarray:
        """Number of aggregations each peer joined, shape (P,), or of ``peers`` only (a
        copy)."""
        if peers is None:
            return self._counts.copy()
        return self._counts[self._peer_ids(peers)]

    def active_mask(self) -> np.ndarray:
        """Bool mask of peers that can still afford one more aggregation, shape (P,)."""
        return self._counts < self.max_aggregations
