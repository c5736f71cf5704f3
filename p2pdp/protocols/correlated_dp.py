"""Correlated, pairwise-cancelling noise (DECOR) and its exact privacy per threat model.

**The noise** (Allouah et al., ICML 2024, arXiv 2405.01031, on D-PSGD). Every pair of overlay
neighbours ``{a, b}`` (``a < b``, edge ``e``) shares a secret; at every round in which both
take a private step, each draws from the pair's own stream a fresh ``p_e ~ N(0, (z_p C)^2 I)``
(``z_p``: ``protocol.pairwise_noise_multiplier``) and adds it to its step's gradient with
opposite signs: ``+ p_e / m_e`` at ``a``, ``- p_e / m_e`` at ``b`` (``m_e = min(m_a, m_b)``,
the smaller of the two public step denominators, so both ends use the same scale). A step of
peer ``i`` is then::

    w_i <- (1 - eta lam) w_i - eta ((g_i + n_i) / m_i + sum_{e ∋ i} s_ie p_e / m_e)

(``n_i ~ N(0, (z C)^2 I)`` its own noise, ``s_ie = +1`` at the smaller end, ``-1`` at the
other). ``W`` is doubly stochastic, so the sum of all models keeps only the ``n_i``: the pair
terms cancel in the network average exactly when every message of the run arrives. They are
never scaled by mixing weights (DECOR's public code scales them by ``W``, reuses them across
rounds and draws them from one global generator; none of that is done here, and the
accounting below is that of the noise as drawn).

**Local DP is unchanged.** The pair terms are independent of the data, so a peer's messages
are post-processing of its independent-noise steps: its ``epsilon_spent`` (every peer, any
adversary, including one that knows all pair secrets) is that of ``z`` alone.

**Threat models.** Per model coordinate (coordinates are iid), the run is a linear map of the
stacked standard-normal noises (every ``n_i`` of every step and every ``p_e`` of every round,
in units of ``C``) plus a data term, exactly as in :mod:`p2pdp.protocols.network_dp` (which
has the derivation, the semidefinite worst case over the shifts and the same assumption that
gradient terms are fixed functions of the data). An adversary's view is some of the messages
(rows) with some noises known to it (their columns removed: conditioning on independent
standard normals). Changing one record of the target ``u`` moves ``u``'s gradient term at its
``t``-th step by ``c_t``, ``||c_t|| <= Delta`` (replace-one, ``Delta = 2 C``); the view's mean
moves by ``G c`` (``G``: ``u``'s data columns). With ``A`` the remaining noise columns, the two
views are Gaussians with covariance ``A A^T`` and means ``G c`` apart: ``mu``-GDP with
``mu^2 = c^T G^T (A A^T)^+ G c / C^2``, and infinite if ``G c`` leaves the range of ``A A^T``
(only possible without independent noise). The assumption is harmless for the
eavesdropper, who sees every model before each step (given its past view each round is a
fresh Gaussian of known covariance, and adaptive composition gives the same ``kappa``); for a
curious peer or a coalition, whose neighbours' gradients depend on models carrying noise it
has not seen, the value is exact for the model, not a proven bound on the run.
``kappa = sup_{||a_t|| <= 1} a^T M a`` with
``M = G^T (A A^T)^+ G`` is bounded from above by
:func:`~p2pdp.protocols.views.worst_case_shifts`; ``mu = (Delta / C) sqrt(kappa)``.

**Two computations of M.** :class:`CorrelatedRun` builds the dense views (rows seen x noises:
``rounds^2 P^2`` entries per view, the reference, small runs); :func:`filtered_kappa` runs
the same model as a state space (state: the peers' models) through a Kalman filter and sums
``M`` over the innovations (``O(P^2)`` memory per target step instead of the views): what
the rows and the threat-model calibration use (:func:`filtered_worst_kappas`). The two are
equal within 1e-7 relative on the tested graphs (their rounding margins differ).

``eavesdropper``
    sees every message sent (every peer's model at every exchange, delivered or not) and
    knows no noise and no secret.
``curious peer v``
    sees the messages it receives (delivered or late) and knows its own noises and the pair
    secrets of its own edges; reported as the worst over ordered pairs ``u != v``.
``coalition K``
    the union of its members' views, their noises and the secrets of every edge with an end
    in ``K``; target ``u`` outside ``K``. :func:`coalition_kappa` computes one coalition,
    :func:`worst_coalition_kappa` the worst of a size by enumeration (small overlays only, so
    the rows do not report it).

**Lost messages.** A step's pair terms are added before anything is sent, so a lost (or
late) message does not change what either end adds: the receiver cannot know at step time
that it will miss the message. The lost message's pair terms then no longer cancel in the
network's sum (a utility cost: noise of size ``z_p`` left in the models); the accounting
is unaffected, since it computes every view from the run's actual exchanges
(:class:`~p2pdp.protocols.views.ViewTrace`). A peer that takes no step in a round (budget
spent) adds no pair term that round, nor do its neighbours on its edges: in a synchronous run
with a public budget every peer knows who steps. Under churn a peer cannot know whether a
neighbour is online, so each end that steps adds its term (the edge's stream gives round
``r`` its ``r``-th draw, :class:`~p2pdp.protocols.peer_streams.PairStream`) and a term
whose other end is offline stays uncancelled; the views are not computed under churn.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from p2pdp.core.errors import ConfigError
from p2pdp.privacy.clipped_gaussian import ClippedGaussianSum
from p2pdp.privacy.gdp import gdp_mu
from p2pdp.protocols.mixing import Mixing
from p2pdp.protocols.network_dp import not_computed, pairwise_epsilon
from p2pdp.protocols.views import ViewTrace, worst_case_shifts

__all__ = [
    "CorrelatedRun",
    "calibrated_noise_multiplier",
    "coalition_kappa",
    "eavesdropper_one_round",
    "edge_pairs",
    "epsilon_of_kappa",
    "filter_cost",
    "filtered_kappa",
    "filtered_worst_kappas",
    "loss_free_trace",
    "report",
    "report_cost",
    "threat_calibration",
    "unit_worst_kappas",
    "worst_coalition_kappa",
    "worst_kappas",
]


def edge_pairs(mixing: Mixing) -> np.ndarray:
    """(U, 2) int64: the overlay's undirected edges ``(a, b)``, ``a < b``, sorted."""
    receivers, senders = mixing.receivers, mixing.indices
    keep = receivers < senders
    pairs = np.stack([receivers[keep], senders[keep]], axis=1)
    return pairs[np.lexsort((pairs[:, 1], pairs[:, 0]))]


def eavesdropper_one_round(laplacian: np.ndarray, z: float, z_pair: float) -> np.ndarray:
    """Closed form: ``kappa`` of every peer against an eavesdropper after one D-PSGD round.

    With equal denominators ``m`` the first messages are ``-(eta / m)(g + n + B p)``: the
    eavesdropper sees ``g + n + B p`` up to a known scale, covariance
    ``C^2 (z^2 I + z_p^2 B B^T)`` and ``B B^T = L``, the overlay's (unweighted) Laplacian. A
    shift ``c`` of ``g_u`` gives ``mu^2 = (c / C)^2 [(z^2 I + z_p^2 L)^-1]_uu``: peer ``u``'s
    effective noise variance is ``1 / [(z^2 I + z_p^2 L)^-1]_uu`` (in ``C^2``), which grows
    from ``z^2`` (no pair noise) towards ``P z^2`` (the network average's, as
    ``z_p -> inf`` on a connected overlay: only ``L``'s null vector ``1 / sqrt(P)`` is left).

    Returns
    -------
    (P,) ``kappa_u = [(z^2 I + z_p^2 L)^-1]_uu``, so ``mu_u = (Delta / C) sqrt(kappa_u)``.
    """
    P = len(laplacian)
    return np.diagonal(np.linalg.inv(z**2 * np.eye(P) + z_pair**2 * laplacian)).copy()


@dataclass(frozen=True, slots=True, kw_only=True)
class CorrelatedRun:
    """Every message of a synchronous run as a linear map of its noises and data terms.

    Built by :meth:`build` from the run's :class:`~p2pdp.protocols.views.ViewTrace`.

    Attributes
    ----------
    messages : list of (P, N) arrays
        ``messages[k][j]``: peer ``j``'s model at exchange ``k`` (what it sent on every edge)
        as coefficients of the ``N`` standard-normal noises, in units of ``C``.
    data : list of (P, D) arrays
        The same models' coefficients of the ``D`` data terms (one per step and peer: its
        gradient sum ``g``, per unit of ``C``).
    seen : list of (E,) bool arrays
        ``seen[k][e]``: the message along edge ``e`` (``Mixing.indices[e]`` to
        ``Mixing.receivers[e]``) reached its receiver at exchange ``k`` (delivered or late).
    noise_peer, noise_pair : (N,) int arrays
        The peer of an independent noise (else -1) and the pair (row of ``pairs``) of a pair
        noise (else -1).
    data_peer : (D,) int array
    pairs : (U, 2) int array
        :func:`edge_pairs` of the overlay.
    senders, receivers : (E,) int arrays
        ``Mixing.indices`` and ``Mixing.receivers``.
    n_peers : int
    noise_multiplier : float
        ``z`` of the peers' own noises.
    """

    messages: list[np.ndarray]
    data: list[np.ndarray]
    seen: list[np.ndarray]
    noise_peer: np.ndarray
    noise_pair: np.ndarray
    data_peer: np.ndarray
    pairs: np.ndarray
    senders: np.ndarray
    receivers: np.ndarray
    n_peers: int
    noise_multiplier: float

    @classmethod
    def build(
        cls,
        trace: ViewTrace,
        mixing: Mixing,
        *,
        scales: np.ndarray,
        decay: float,
        noise_multiplier: float,
        pair_noise_multiplier: float,
    ) -> CorrelatedRun:
        """The run's linear map.

        Parameters
        ----------
        trace : ViewTrace
            Which peers stepped, which messages arrived, at every event.
        mixing : Mixing
            The overlay's weights.
        scales : (P,) array
            ``eta / m_i``: the weight of a step's (noisy) sum in peer ``i``'s model.
        decay : float
            ``1 - eta lam``.
        noise_multiplier, pair_noise_multiplier : float
            ``z`` and ``z_p`` (0: that noise absent; its columns then are zero).
        """
        n = mixing.n_peers
        pairs = edge_pairs(mixing)
        steps = [e for e in trace.events if isinstance(e, np.ndarray)]
        stepped_pairs = []
        for peers in steps:
            stepped = np.zeros(n, dtype=bool)
            stepped[peers] = True
            stepped_pairs.append(np.flatnonzero(stepped[pairs[:, 0]] & stepped[pairs[:, 1]]))
        n_noise = sum(p.size + q.size for p, q in zip(steps, stepped_pairs, strict=True))
        n_data = sum(p.size for p in steps)
        noise_peer = np.full(n_noise, -1, dtype=np.int64)
        noise_pair = np.full(n_noise, -1, dtype=np.int64)
        data_peer = np.zeros(n_data, dtype=np.int64)
        pair_scale = np.maximum(scales[pairs[:, 0]], scales[pairs[:, 1]])  # eta / m_e
        X = np.zeros((n, n_noise))
        Y = np.zeros((n, n_data))
        messages, data, seen = [], [], []
        column = data_column = 0
        k = 0
        for event in trace.events:
            if isinstance(event, np.ndarray):
                peers, active = event, stepped_pairs[k]
                k += 1
                X[peers] *= decay
                Y[peers] *= decay
                own = column + np.arange(peers.size)
                X[peers, own] = -scales[peers] * noise_multiplier
                noise_peer[own] = peers
                column += peers.size
                shared = column + np.arange(active.size)
                coefficient = pair_scale[active] * pair_noise_multiplier
                X[pairs[active, 0], shared] = -coefficient
                X[pairs[active, 1], shared] = coefficient
                noise_pair[shared] = active
                column += active.size
                terms = data_column + np.arange(peers.size)
                Y[peers, terms] = -scales[peers]
                data_peer[terms] = peers
                data_column += peers.size
                continue
            delivered, late = event
            messages.append(X.copy())
            data.append(Y.copy())
            seen.append(delivered | late)
            X = mixing.average(X, delivered)
            Y = mixing.average(Y, delivered)
        return cls(
            messages=messages,
            data=data,
            seen=seen,
            noise_peer=noise_peer,
            noise_pair=noise_pair,
            data_peer=data_peer,
            pairs=pairs,
            senders=mixing.indices,
            receivers=mixing.receivers,
            n_peers=n,
            noise_multiplier=noise_multiplier,
        )

    def view(self, observers: Iterable[int] | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The view of ``observers`` (None: the eavesdropper) and the noises it knows.

        Returns
        -------
        (rows, data_rows, known): (R, N) and (R, D) coefficients of the messages seen (each
        message once), (N,) bool: the noises the observers know (their own and their edges'
        pair secrets; none for the eavesdropper).
        """
        n_noise = self.noise_peer.size
        known = np.zeros(n_noise, dtype=bool)
        rows, data_rows = [], []
        if observers is None:
            senders = np.unique(self.senders)
            for X, Y in zip(self.messages, self.data, strict=True):
                rows.append(X[senders])
                data_rows.append(Y[senders])
        else:
            members = np.zeros(self.n_peers, dtype=bool)
            members[list(observers)] = True
            into = members[self.receivers]
            for X, Y, seen in zip(self.messages, self.data, self.seen, strict=True):
                senders = np.unique(self.senders[seen & into])
                rows.append(X[senders])
                data_rows.append(Y[senders])
            known = (self.noise_peer >= 0) & members[np.maximum(self.noise_peer, 0)]
            pair = self.noise_pair >= 0
            ends = self.pairs[self.noise_pair[pair]]
            known[pair] = members[ends[:, 0]] | members[ends[:, 1]]
        n_data = self.data_peer.size
        R = np.concatenate(rows) if rows else np.zeros((0, n_noise))
        D = np.concatenate(data_rows) if data_rows else np.zeros((0, n_data))
        return R, D, known

    def kappa(self, observers: Iterable[int] | None, targets: np.ndarray) -> np.ndarray:
        """``kappa`` of each target (upper bound, ``inf`` when a shift is seen noiselessly)
        against the view of ``observers`` (None: the eavesdropper); targets must not be
        observers. (T,) array.

        Capped by local DP, ``T_u / z^2`` (``u``'s ``T_u`` data columns are its own noise
        columns over ``z``, and a projection of them has norm at most 1), a bound the
        rounding margin of the fast path could otherwise exceed by a few 1e-8."""
        R, D, known = self.view(observers)
        kappa = _view_kappa(R[:, ~known], D, self.data_peer, targets)
        if self.noise_multiplier > 0:
            steps = np.array([int((self.data_peer == u).sum()) for u in np.ravel(targets)])
            kappa = np.minimum(kappa, steps / self.noise_multiplier**2)
        return kappa


#: Views whose covariance ``A A^T`` has a condition number below this are whitened through
#: its eigendecomposition (fast: the covariance is small); others through the SVD of ``A``.
_GRAM_CONDITION = 1e6


def _view_kappa(
    A: np.ndarray, D: np.ndarray, data_peer: np.ndarray, targets: np.ndarray
) -> np.ndarray:
    """``kappa`` of each target's data columns of ``D`` against noise ``A A^T``.

    ``(A A^T)^+ = U S^-2 U^T``. A well-conditioned covariance (the usual case: every message
    seen carries noise of its own) is decomposed directly, ``A A^T`` being only as large as the
    view (``R x R``, not ``R x N``); forming ``A A^T`` (inner dimension ``N``) and its
    eigendecomposition round by at most about ``cond * max(R, N) * eps`` relative, and ``M``
    is inflated by 100 times that, so the result stays an upper bound. Otherwise the
    SVD of ``A`` (numerical rank as numpy's): a data column with a part outside ``U``'s span
    larger than 1e-9 of the view's scale is a shift seen without noise: ``inf``."""
    targets = np.asarray(targets, dtype=np.int64)
    out = np.zeros(targets.size)
    if A.shape[0] == 0:
        return out
    values, U = np.linalg.eigh(A @ A.T)
    inflate = 1.0
    if values[0] > 0 and values[-1] < _GRAM_CONDITION * values[0]:
        singular = np.sqrt(values)
        inflate += 100.0 * (values[-1] / values[0]) * max(A.shape) * np.finfo(float).eps
    else:
        U, singular, _ = np.linalg.svd(A, full_matrices=False)
        tolerance = singular.max(initial=0.0) * max(A.shape) * np.finfo(float).eps
        rank = singular > tolerance
        U, singular = U[:, rank], singular[rank]
    counts = np.array([int((data_peer == u).sum()) for u in targets.tolist()])
    scale = max(float(np.abs(D).max(initial=0.0)), 1e-300)
    for T in np.unique(counts).tolist():
        if T == 0:
            continue
        which = np.flatnonzero(counts == T)
        G = np.stack([D[:, data_peer == u] for u in targets[which].tolist()])  # (b, R, T)
        inside = np.einsum("rk,brt->bkt", U, G)
        outside = G - np.einsum("rk,bkt->brt", U, inside)
        blind = np.abs(outside).max(axis=(1, 2)) > 1e-9 * scale
        H = inside / singular[None, :, None]
        upper, _ = worst_case_shifts(inflate * np.einsum("bkt,bks->bts", H, H))
        out[which] = np.where(blind, np.inf, upper)
    return out


def filter_cost(trace: ViewTrace, n_peers: int) -> int:
    """Multiply-adds of one view's :func:`filtered_kappa` with every other peer a target, at
    most (counted without running it): per exchange, ``P`` rows x ``P`` targets x the steps
    taken so far, times the ``~3 P`` of an update (the mixing, the gain, the information).
    :data:`MAX_FILTER_COST` bounds the sum over the views a report computes."""
    steps = taken = 0
    for event in trace.events:
        if isinstance(event, np.ndarray):
            steps += 1
        else:
            taken += steps
    return 3 * n_peers**3 * max(taken, 1)


#: Most multiply-adds (:func:`report_cost`: the eavesdropper's and every curious peer's
#: view) of a report. Measured (P = 100, degree 10, one BLAS thread, 2 cores shared by a
#: load of ~10): 20 rounds (6.4e10) 13 to 19 s, 50 rounds (3.9e11) 122 to 127 s.
MAX_FILTER_COST = 2 * 10**12


def filtered_kappa(
    trace: ViewTrace,
    mixing: Mixing,
    *,
    scales: np.ndarray,
    decay: float,
    noise_multiplier: float,
    pair_noise_multiplier: float,
    observers: Iterable[int] | None,
    targets: np.ndarray,
) -> np.ndarray:
    """:meth:`CorrelatedRun.kappa` without the dense views: a Kalman filter over the run.

    **The model** (per coordinate, in units of ``C``). The state is the peers' models
    ``x`` (P,), zero (known) at the start. A step of the peers ``S`` maps
    ``x_i <- decay x_i - s_i (g_i + z n_i) - sum_{e ∋ i} sign_ie s_e z_p p_e`` for ``i`` in
    ``S`` (``s_i = eta / m_i``, ``s_e`` the larger of its ends', edges with both ends in
    ``S``); an exchange first shows the adversary the rows ``O`` of ``x`` (the messages it
    reads), then maps ``x <- W_k x`` (``W_k`` the weights of the delivered messages). The
    noises it knows (its own, its edges' pair secrets) are known inputs: they move the
    conditional mean by known amounts and leave every covariance unchanged, so they are
    dropped; the others add ``Q = z^2 sum_i s_i^2 e_i e_i^T + z_p^2 sum_e s_e^2 b_e b_e^T``
    (``b_e = e_a - e_b``: a Laplacian) per step. Shifting ``u``'s ``t``-th gradient term by
    ``c_t`` adds ``-s_u c_t e_u`` at that step: the state's mean moves by ``H c``.

    **The filter.** Given the views so far, ``x`` is Gaussian with covariance ``Sigma`` (the
    same under both hypotheses) and a mean that the two hypotheses move apart by ``D c``
    (``D = H - Hhat``: the part of the shift the past views have not revealed). An exchange's
    innovation ``y - O xhat`` is then independent of the past, with covariance
    ``S = Sigma_OO`` and the means ``D_O c`` apart, so the log-likelihood ratio of the whole
    view is the sum over exchanges (the chain rule of the Gaussian density) and
    ``mu^2 / (Delta / C)^2 = c^T J c``, ``J = sum_k D_O^T S^+ D_O`` (``S^+`` the
    pseudo-inverse; a ``D_O c`` outside the range of ``S`` is a shift seen without noise:
    ``inf``). The update is Gaussian conditioning: ``K = Sigma_{:O} S^+``,
    ``Sigma <- Sigma - K Sigma_{O:}``, ``D <- D - K D_O``. ``J`` equals
    ``G^T (A A^T)^+ G`` of the dense view (block LDL of ``A A^T`` in time order) and
    ``kappa`` is, as there, :func:`~p2pdp.protocols.views.worst_case_shifts` of it.
    A message whose sender is an observer is a known function of what the observers
    received and know (its model averages messages they read; its noises are theirs): it
    adds nothing and is not read (its innovation would be zero, and its numerical residue
    would not be).

    Cost: ``O(P^2)`` per step and ``O(P^2 (|O| + T b))`` per exchange for ``b`` targets that
    have taken ``T`` steps, against the dense view's ``(messages seen) x (noises)`` entries
    and their decomposition. Same assumption as :class:`CorrelatedRun` (fixed gradients).

    Parameters
    ----------
    trace : ViewTrace
        The run's steps and exchanges.
    mixing : Mixing
        The overlay's weights.
    scales : (P,) array
        ``eta / m_i``.
    decay : float
        ``1 - eta lam``.
    noise_multiplier, pair_noise_multiplier : float
        ``z`` and ``z_p``.
    observers : iterable of int or None
        The coalition (one peer: a curious peer); None: the eavesdropper (every message,
        no secret).
    targets : (b,) int array
        Peers outside ``observers``.

    Returns
    -------
    (b,) array: each target's ``kappa`` (an upper bound as :meth:`CorrelatedRun.kappa`'s,
    with the same local-DP cap ``T_u / z^2``; ``inf`` when a shift is seen noiselessly).
    ``J`` is inflated by a rounding margin, ``100 cond(S) P eps`` summed over the
    innovations, before the semidefinite bound.
    """
    n = mixing.n_peers
    targets = np.asarray(targets, dtype=np.int64).ravel()
    z, z_pair = float(noise_multiplier), float(pair_noise_multiplier)
    members = np.zeros(n, dtype=bool)
    if observers is not None:
        members[list(observers)] = True
    if members[targets].any():
        raise ValueError("a target is an observer")
    pairs = edge_pairs(mixing)
    pair_scale = np.maximum(scales[pairs[:, 0]], scales[pairs[:, 1]])
    unknown_pair = ~(members[pairs[:, 0]] | members[pairs[:, 1]])
    steps = np.zeros(n, dtype=np.int64)
    for event in trace.events:
        if isinstance(event, np.ndarray):
            steps[event] += 1
    counts = steps[targets]
    T = int(counts.max(initial=0))
    b = targets.size
    position = np.full(n, -1, dtype=np.int64)
    position[targets] = np.arange(b)
    Sigma = np.zeros((n, n))
    # row t b + j: the unrevealed shift of target j's t-th term (D transposed, so that the
    # terms taken so far are the first rows)
    D = np.zeros((T * b, n))
    spare = np.zeros_like(D)  # the product's output (the rows before ``live`` are dead)
    update = np.eye(n)
    J = np.zeros((b, T, T))
    taken = np.zeros(b, dtype=np.int64)
    blind = np.zeros(b, dtype=bool)
    senders, receivers = mixing.indices, mixing.receivers
    everyone = np.unique(senders)
    tiny = np.finfo(float).eps
    margin = 0.0  # rounding margin: 100 cond(S) P eps summed over the innovations
    live = 0  # the terms before ``live`` are revealed (zero rows of D, nothing more to add)
    for event in trace.events:
        used = int(taken.max(initial=0))
        if isinstance(event, np.ndarray):
            peers = event
            keep = np.ones(n)
            keep[peers] = decay
            Sigma *= keep[:, None] * keep[None, :]
            D[live * b : used * b] *= keep
            own = peers[~members[peers]]
            Sigma[own, own] += (z * scales[own]) ** 2
            stepped = np.zeros(n, dtype=bool)
            stepped[peers] = True
            active = np.flatnonzero(stepped[pairs[:, 0]] & stepped[pairs[:, 1]] & unknown_pair)
            if z_pair > 0 and active.size:
                a, c = pairs[active, 0], pairs[active, 1]
                weight = (z_pair * pair_scale[active]) ** 2
                np.add.at(Sigma, (a, a), weight)
                np.add.at(Sigma, (c, c), weight)
                np.add.at(Sigma, (a, c), -weight)
                np.add.at(Sigma, (c, a), -weight)
            mine = peers[position[peers] >= 0]
            D[taken[position[mine]] * b + position[mine], mine] = -scales[mine]
            taken[position[mine]] += 1
            continue
        delivered, late = event
        if observers is None:
            seen = everyone
        else:
            seen = np.unique(senders[(delivered | late) & members[receivers]])
            seen = seen[~members[seen]]
        if seen.size and used > live:
            S = Sigma[np.ix_(seen, seen)]
            values, U = np.linalg.eigh((S + S.T) / 2)
            top = max(float(values[-1]), 0.0)
            rank = values > top * seen.size * tiny * 10
            U, values = U[:, rank], values[rank]
            margin += 100.0 * (top / values[0]) * n * tiny
            shift = D[live * b : used * b, seen]  # (terms b, r)
            inside = shift @ U
            if not rank.all():
                outside = np.abs(shift - inside @ U.T).reshape(used - live, b, -1)
                scale = max(float(np.abs(shift).max(initial=0.0)), 1e-300)
                blind |= outside.max(axis=(0, 2), initial=0.0) > 1e-9 * scale
            H = (inside / np.sqrt(values)).reshape(used - live, b, -1).transpose(1, 0, 2)
            J[:, live:used, live:used] += H @ H.transpose(0, 2, 1)
            if seen.size == n:  # the whole state seen: nothing left unrevealed, exactly
                Sigma[:] = 0.0
                live = used
            else:
                gain = Sigma[:, seen] @ (U / values)  # Sigma_{:O} U diag(1 / values)
                update[:, seen] -= gain @ U.T  # I - K C
                Sigma -= gain @ (U.T @ Sigma[seen, :])
                Sigma = (Sigma + Sigma.T) / 2
        W = mixing.average(np.eye(n), delivered)
        Sigma = W @ Sigma @ W.T
        if used > live:  # D <- W (I - K C) D, one product (D is stored transposed)
            rows = slice(live * b, used * b)
            np.matmul(D[rows], (W @ update).T, out=spare[rows])
            D, spare = spare, D
        update = np.eye(n)
    out = np.zeros(b)
    inflate = 1.0 + margin + 1e-12
    for steps_u in np.unique(counts).tolist():
        if steps_u == 0:
            continue
        which = np.flatnonzero(counts == steps_u)
        M = J[which, :steps_u, :steps_u]
        upper, _ = worst_case_shifts(inflate * (M + M.transpose(0, 2, 1)) / 2)
        out[which] = upper
    out[blind] = np.inf
    if z > 0:
        out = np.minimum(out, counts / z**2)
    return out


def coalition_kappa(run: CorrelatedRun, coalition: Iterable[int]) -> np.ndarray:
    """``kappa`` of every peer outside ``coalition`` against the pooled view of its members
    (their received messages, noises and edges' secrets); NaN for the members. (P,)."""
    members = sorted(set(coalition))
    n = run.n_peers
    out = np.full(n, np.nan)
    targets = np.setdiff1d(np.arange(n), members)
    out[targets] = run.kappa(members, targets)
    return out


#: Most coalitions :func:`worst_coalition_kappa` enumerates.
MAX_COALITIONS = 10_000


def worst_coalition_kappa(run: CorrelatedRun, size: int) -> np.ndarray:
    """``kappa`` of every peer against the worst coalition of ``size`` other peers. (P,).

    Exact (each coalition as :func:`coalition_kappa`), by enumerating every coalition of
    ``size`` peers: a view only grows with its coalition (post-processing), so the worst of
    at most ``size`` is among them. Raises ConfigError beyond :data:`MAX_COALITIONS`
    coalitions (no bound short of enumeration is implemented)."""
    n = run.n_peers
    count = math.comb(n, size)
    if not 1 <= size < n or count > MAX_COALITIONS:
        raise ConfigError(
            f"coalitions of {size} among {n} peers: {count:,} to enumerate, more than "
            f"{MAX_COALITIONS:,} (or a size outside 1..{n - 1})"
        )
    worst = np.zeros(n)
    for members in itertools.combinations(range(n), size):
        worst = np.fmax(worst, coalition_kappa(run, members))
    return worst


def epsilon_of_kappa(
    kappa: np.ndarray, *, sensitivity_over_clip: float, delta: float
) -> np.ndarray:
    """``(epsilon, delta)`` of ``mu = (Delta / C) sqrt(kappa)``-GDP; NaN kept, inf kept
    (:func:`p2pdp.protocols.network_dp.pairwise_epsilon`, in units of the clip norm)."""
    return pairwise_epsilon(kappa, sensitivity_over_sigma=sensitivity_over_clip, delta=delta)


def calibrated_noise_multiplier(
    kappa_at_unit: float, *, epsilon: float, delta: float, sensitivity_over_clip: float
) -> float:
    """``z`` that spends exactly ``(epsilon, delta)`` under a threat model, at a fixed ratio
    ``z_p / z``.

    Every noise column of a view is proportional to ``z`` once ``z_p = r z``, so
    ``A A^T`` scales by ``z^2`` and ``kappa(z, r z) = kappa(1, r) / z^2``: one view computation
    at ``z = 1`` (``kappa_at_unit``, the worst target's, for the run's trace) gives
    ``z = (Delta / C) sqrt(kappa(1, r)) / mu(epsilon, delta)`` with ``mu`` the largest GDP
    parameter within the budget (:func:`~p2pdp.privacy.gdp.gdp_mu`, rounded towards more
    noise). Valid for the trace it was computed on (a run without losses is predictable; a
    lossy one is not) and for that adversary only: local DP is then ``sqrt(T) (Delta / C) / z``
    -GDP, larger. Wired as ``protocol.threat_model`` (:func:`threat_calibration`)."""
    if not (math.isfinite(kappa_at_unit) and kappa_at_unit >= 0):
        raise ConfigError(
            f"no noise multiplier reaches epsilon = {epsilon!r} against a view that sees a "
            f"shift without noise (kappa = {kappa_at_unit!r})"
        )
    return sensitivity_over_clip * math.sqrt(kappa_at_unit) / gdp_mu(epsilon, delta)


def worst_kappas(run: CorrelatedRun) -> dict[str, float]:
    """The worst ``kappa`` of any target under each threat model the rows report.

    ``eavesdropper``: max over targets ``u``; ``curious_peer``: max over ordered pairs
    ``u != v`` (``v`` the curious peer). Epsilon grows with ``kappa``, so these give the
    worst epsilons (:func:`report`)."""
    n = run.n_peers
    everyone = np.arange(n)
    eavesdropper = run.kappa(None, everyone)
    curious = np.full((n, n), np.nan)
    for v in range(n):
        others = everyone[everyone != v]
        curious[others, v] = run.kappa([v], others)
    return {"eavesdropper": float(np.max(eavesdropper)), "curious_peer": float(np.nanmax(curious))}


def filtered_worst_kappas(
    trace: ViewTrace,
    mixing: Mixing,
    *,
    scales: np.ndarray,
    decay: float,
    noise_multiplier: float,
    pair_noise_multiplier: float,
) -> dict[str, float]:
    """:func:`worst_kappas` of the run of ``trace``, each view by :func:`filtered_kappa`
    (the eavesdropper's, then every curious peer's with every other peer a target)."""
    n = mixing.n_peers
    everyone = np.arange(n)

    def worst(observers: list[int] | None, targets: np.ndarray) -> float:
        kappa = filtered_kappa(
            trace, mixing, scales=scales, decay=decay, noise_multiplier=noise_multiplier,
            pair_noise_multiplier=pair_noise_multiplier, observers=observers, targets=targets,
        )  # fmt: skip
        return float(np.max(kappa, initial=-np.inf))

    curious = max(worst([v], everyone[everyone != v]) for v in range(n))
    return {"eavesdropper": worst(None, everyone), "curious_peer": curious}


def report_cost(trace: ViewTrace, mixing: Mixing) -> int:
    """:func:`filter_cost` of the ``P + 1`` views a report computes (what
    :data:`MAX_FILTER_COST` limits)."""
    return (mixing.n_peers + 1) * filter_cost(trace, mixing.n_peers)


#: Unit ``kappa`` of the views already computed in this process (:func:`unit_worst_kappas`).
_UNIT_KAPPAS: dict[bytes, dict[str, float]] = {}


def unit_worst_kappas(
    trace: ViewTrace, mixing: Mixing, *, scales: np.ndarray, decay: float, ratio: float
) -> dict[str, float]:
    """:func:`filtered_worst_kappas` of the run of ``trace`` at ``z = 1``, ``z_p = ratio``.

    At a fixed ``z_p / z`` every noise column scales with ``z`` and nothing else does, so
    ``kappa(z, ratio z) = kappa(1, ratio) / z^2`` (also for the SDP bound and the local-DP
    cap, both linear in ``M``): cells that differ only in the budget share one computation,
    kept for the process (keyed by the trace, overlay, scales, decay and ratio)."""
    digest = hashlib.sha256()
    for array in (mixing.indptr, mixing.indices, mixing.weights, np.asarray(scales, float)):
        digest.update(np.ascontiguousarray(array).tobytes())
    digest.update(repr((float(decay), float(ratio))).encode())
    for event in trace.events:
        parts = (event,) if isinstance(event, np.ndarray) else event
        for part in parts:
            digest.update(np.ascontiguousarray(part).tobytes() + b"|")
        digest.update(b"#")
    key = digest.digest()
    if key not in _UNIT_KAPPAS:
        _UNIT_KAPPAS[key] = filtered_worst_kappas(
            trace, mixing, scales=scales, decay=decay, noise_multiplier=1.0,
            pair_noise_multiplier=ratio,
        )  # fmt: skip
    return dict(_UNIT_KAPPAS[key])


def loss_free_trace(mixing: Mixing, rounds: int) -> ViewTrace:
    """The trace of a synchronous one-averaging-per-round run in which every peer steps every
    round and every message arrives in time: what a run without loss, lateness or churn does
    (the one a threat-model calibration can predict before the run)."""
    trace = ViewTrace()
    edges = mixing.indices.size
    for _ in range(rounds):
        trace.step(np.arange(mixing.n_peers))
        trace.exchange(np.ones(edges, dtype=bool), np.zeros(edges, dtype=bool))
    return trace


def threat_calibration(
    mixing: Mixing,
    *,
    rounds: int,
    scales: np.ndarray,
    decay: float,
    ratio: float,
    threat: str,
    epsilon: float,
    delta: float,
    sensitivity_over_clip: float,
) -> float:
    """``z`` that spends exactly ``(epsilon, delta)`` against ``threat`` (``"eavesdropper"`` or
    ``"curious_peer"``, the worst target and curious peer) on a loss-free run
    (:func:`loss_free_trace`) of ``rounds`` rounds, at ``z_p = ratio z``.

    One view computation at ``z = 1`` (:func:`filtered_worst_kappas`), then
    :func:`calibrated_noise_multiplier`. Raises ConfigError when the views cost more than
    :data:`MAX_FILTER_COST` (:func:`report_cost`). ``scales``, ``decay``: see
    :meth:`CorrelatedRun.build`."""
    trace = loss_free_trace(mixing, rounds)
    cost = report_cost(trace, mixing)
    if cost > MAX_FILTER_COST:
        raise ConfigError(
            f"protocol.threat_model: the views of {rounds} rounds on {mixing.n_peers} peers "
            f"cost {cost:.2g} multiply-adds, more than the {MAX_FILTER_COST:.2g} of an exact "
            "computation; lower protocol.rounds"
        )
    return calibrated_noise_multiplier(
        unit_worst_kappas(trace, mixing, scales=scales, decay=decay, ratio=ratio)[threat],
        epsilon=epsilon,
        delta=delta,
        sensitivity_over_clip=sensitivity_over_clip,
    )


def report(
    trace: ViewTrace,
    mixing: Mixing,
    mechanism: ClippedGaussianSum,
    *,
    scales: np.ndarray,
    decay: float,
    pair_noise_multiplier: float,
    delta: float,
    churn: bool = False,
    ratio: float | None = None,
) -> dict[str, float | str]:
    """A D-PSGD run's per-threat-model columns (at the rows' ``privacy.delta``).

    ``correlated_dp_eavesdropper_epsilon``: the worst target's epsilon against the
    eavesdropper; ``correlated_dp_curious_peer_epsilon``: the worst ordered pair ``(u, v)``,
    ``v`` curious; ``correlated_dp_note``: "" when computed, else why not (the epsilons NaN):
    noiseless steps, Poisson sampling, churn (as :func:`network_dp.not_computed
    <p2pdp.protocols.network_dp.not_computed>`) or views costing more than
    :data:`MAX_FILTER_COST` (:func:`report_cost`). ``scales``, ``decay``: see
    :meth:`CorrelatedRun.build`. ``ratio``: ``z_p / z`` as a threat-model calibration was
    given it (its views at ``z = 1`` are then found again, not recomputed: ``z_p / z``
    recomputed from ``z_p`` may differ from it in the last bit); default
    ``pair_noise_multiplier / z``."""
    reason = not_computed(mechanism, churn=churn)
    cost = report_cost(trace, mixing)
    if not reason and cost > MAX_FILTER_COST:
        reason = (
            f"not computed: the views cost {cost:.2g} multiply-adds, more than the "
            f"{MAX_FILTER_COST:.2g} of an exact computation"
        )
    if reason:
        nan = float("nan")
        return {
            "correlated_dp_eavesdropper_epsilon": nan,
            "correlated_dp_curious_peer_epsilon": nan,
            "correlated_dp_note": reason,
        }
    z = mechanism.noise_multiplier
    if ratio is None:
        ratio = pair_noise_multiplier / z
    unit = unit_worst_kappas(trace, mixing, scales=scales, decay=decay, ratio=ratio)
    scale = {"sensitivity_over_clip": mechanism.sensitivity / mechanism.clip_norm, "delta": delta}
    worst = {
        threat: float(epsilon_of_kappa(np.array([kappa / z**2]), **scale)[0])
        for threat, kappa in unit.items()
    }
    return {
        "correlated_dp_eavesdropper_epsilon": worst["eavesdropper"],
        "correlated_dp_curious_peer_epsilon": worst["curious_peer"],
        "correlated_dp_note": "",
    }
