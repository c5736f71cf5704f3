"""The filtered upper bound of network DP, for views too large for the exact solver.

Per view a Kalman filter over the peers' models, batched across views: the derivation, its
guarantee and its cost are in :mod:`p2pdp.protocols.network_dp`'s docstring ("Large views: a
certified upper bound"); :func:`filtered_coefficients` computes it and :func:`filter_work` its cost,
which the report compares with :data:`p2pdp.protocols.network_dp.MAX_FILTER_WORK`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import NamedTuple, cast

import numpy as np
import scipy.sparse as sp

from p2pdp.core.parallel import current_workers, forked_map, maps_here
from p2pdp.protocols.mixing import Mixing
from p2pdp.protocols.network_dp_steady import Event, _covariance, _NotSteady, _periodic, _Steady
from p2pdp.protocols.views import ViewTrace, _certificate, _margin, worst_case_shifts

#: Exchanges a noise stays tracked by :func:`filtered_coefficients` before its remaining
#: influence is bounded (the bound's slack falls with it; the cost grows linearly): see
#: :func:`filter_window`. Its views are filtered in batches of at most this many floats of state
#: (``batch P (P + 3 window P + T (window + 1))``: 240 MB).
FILTER_EXCHANGES = 10


def filter_window(trace: ViewTrace) -> int:
    """The default window of :func:`filtered_coefficients`: enough step events to span
    :data:`FILTER_EXCHANGES` exchanges (``ceil(10 / K)`` for ``K`` exchanges a step), from 2 to
    6 (the cost grows with it). With several exchanges a step a noise gives nearly all its
    information within its own round (on 100 peers of degree 10 with 5 exchanges a step,
    ~1e-5 of it after); with one it keeps arriving for many."""
    steps = sum(isinstance(e, np.ndarray) for e in trace.events)
    exchanges = sum(isinstance(e, tuple) for e in trace.events)
    per_step = exchanges / max(steps, 1)
    return int(min(6, max(2, math.ceil(FILTER_EXCHANGES / max(per_step, 1e-9)))))


_FILTER_FLOATS = 30_000_000

#: Pieces of work a process of :func:`filtered_coefficients` gets, each of whole batches.
_PIECES = 4


#: A retired noise whose cheap remainder bound (:func:`_remainder`) exceeds this in a view
#: has it recomputed from that view's covariance (a solve, ``P^3``): few exchanges a step
#: (D-PSGD), where a noise keeps telling for many exchanges after the window. With several
#: (Muffliato's 5, degree 10) the cheap bound is ~1e-7 (100 peers) to ~4e-6 (200): no solve.
RETIRE_SOLVE = 1e-5


def filtered_coefficients(
    trace: ViewTrace,
    mixing: Mixing,
    *,
    scales: np.ndarray,
    decay: float,
    window: int | None = None,
    steady: bool = True,
    batch: int | None = None,
    workers: int | None = None,
) -> np.ndarray:
    """An upper bound on every ``kappa[u, v]`` from a Kalman filter over the models.

    Per view ``v`` (in batches) the filter tracks the covariance ``Sigma`` (P, P) of the
    models given what ``v`` has read so far, and the filter error's response ``E`` to the
    noises of the last ``window`` step events; each message ``v`` reads is an exact
    observation. Its whitened innovations ``z = D^-1/2 U^T (H x - H x_hat)`` are an
    orthonormal basis of ``v``'s view, so ``M_u = sum_k Z_k[:, u]^T Z_k[:, u]`` (``Z_k``: the
    innovation's response to each noise): tracked exactly while a noise is in the window
    (``M_act``), bounded after it leaves:

    * **Remainder of a retired noise** ``j`` (column ``e_j`` of ``E``, retired right after a
      step event's injection, at ``tau``): the later rows are functions of the models
      ``x(tau)`` and of later noises, independent of ``n_j``, so the information they add,
      ``r_j = sum_{k > tau} ||Z_k[:, j]||^2 = Var(n_j | y_<=tau) - Var(n_j | y)``, is at most
      what revealing ``x(tau)`` would add: ``e_j^T Sigma^+ e_j``. Right after the step,
      ``Sigma`` is the fresh noise just injected, ``D = diag(s_i^2)`` (independent of the
      view so far and of ``n_j``; 0 at ``v``, which knows its own noise, where ``e_j[v] = 0``:
      ``v`` knows its own model), plus the older uncertainty, which is at least the part
      ``n_j`` explains, ``e_j e_j^T / s`` (``s = Var(n_j | y_<=tau)``, 1 minus what ``n_j``
      has told so far, tracked exactly in the window). So ``Sigma >= D + e_j e_j^T / s`` and,
      as ``e^T Sigma^+ e = sup_w 2 w.e - w^T Sigma w`` falls as ``Sigma`` grows,
      ``r_j <= q s / (q + s)`` with ``q = e_j^T D^+ e_j`` (Sherman-Morrison): ``P`` operations
      a noise, the same floor ``D`` for every view (:func:`_remainder`; ``s`` alone where a
      peer that did not step leaves ``e_j`` outside the range of ``D``). Where that exceeds
      :data:`RETIRE_SOLVE` (few exchanges a step: a noise keeps telling long after the
      window) and every peer but ``v`` has stepped, ``e_j^T Sigma^+ e_j`` is computed with
      the view's ``Sigma`` on the peers but ``v`` (>= ``D``: invertible, well conditioned; a
      solve, ``P^3`` a view) and the smaller of it and ``s`` is used.
    * **The coefficient**: write ``u``'s responses as ``a_k = a_k^act + a_k^ret`` (entries
      of its noises in / out of the window at row ``k``). By Minkowski's inequality, for
      unit ``c_t``,
      ``sqrt(sum_k ||sum_t a_kt c_t||^2) <= sqrt(c^T M_act c) + sum_t sqrt(r_t)``, so
      ``kappa <= (sqrt(kappa(M_act)) + sum_t sqrt(r_t))^2``, with ``kappa(M_act)`` bounded
      by certificates (:func:`_certificate`).
      Also ``kappa <= T_u`` (``M <= I``). Every step only enlarges: the result is an upper
      bound of the exact value of :func:`view_coefficients`.

    **How it is computed** (the same filter, in fewer operations). No noise enters between two
    step events, so the models after the exchanges since the last one, at ``tau``, are
    ``C x(tau)`` (``C`` the product of those exchanges' matrices, one for all views): reading
    ``H x`` is reading ``(H C) x(tau)``, filtered in ``tau``'s coordinates. A view's
    covariance is never formed: it is ``Sigma = base - F F^T - R R^T``, ``base`` the models'
    covariance before any reading (every noise; shared by the views and computed once,
    :func:`_shared_states`), ``F`` and ``R`` the view's gains (each reading removes
    ``g g^T``; ``v``'s own noises are columns ``s_v e_v``, which remove their variance), ``F``
    those of the innovations that respond to a noise of the window. A reading costs
    ``d P^2`` (``(H C) base``, one product for the batch) plus ``d P`` per gain, and the gains
    move to the present once, at the next step event (``C F``, ``C R``: ``P^2`` per gain,
    not ``2 P^3`` for ``C Sigma C^T``; or exchange by exchange, sparse, where their nonzeros
    are fewer: :func:`_left`); ``R``, whose ``R R^T`` has rank at most ``P``, is
    replaced by a ``P``-column factor (QR) once it has more columns. ``E`` is never formed:
    it is the window's noises' response before any reading (shared by the views) minus
    ``F Z_kept`` (an innovation before a noise does not respond to it), and ``M_act`` is a
    band (two steps of ``u`` in the window are under ``window`` apart).

    **Periodic runs** (``steady``, the default; up to :data:`STEADY_MAX_PEERS` peers): on a
    trace whose rounds are all alike, the filter runs until the views' covariances stop
    moving, then a few rounds of a larger view whose rounds are exact copies, and the copies'
    values stand for the rounds not run (:class:`~p2pdp.protocols.network_dp_steady._Steady`,
    which gives the proof; a batch of views whose covariance does not settle from below is
    filtered over every round).

    **Processes.** The views are independent given the shared states: their batches (of
    ``batch`` views, by default as many as :data:`_FILTER_FLOATS` floats of state hold) go to
    ``workers`` forked processes (default
    :func:`~p2pdp.core.parallel.current_workers`: the run's local worker budget, 1 in a
    runner's worker process, so cells run in parallel never start more), which inherit the
    shared states; each holds one batch's state at a time. A batch's result depends on its
    views only: the values are the same whatever the processes, and within ~1e-12 relative
    whatever the batch size (the rounding of the batched products).

    Parameters: as :func:`view_coefficients`, plus ``window`` (default
    :func:`filter_window`), ``steady`` (``False``: every round filtered), ``batch`` and
    ``workers``. Returns the (P, P) upper bounds (the
    diagonal NaN), each raised by :func:`_margin` above the rounding of the arithmetic.
    """
    window = filter_window(trace) if window is None else window
    n, L = mixing.n_peers, window
    scales = np.asarray(scales, dtype=float)
    steps = [e for e in trace.events if isinstance(e, np.ndarray)]
    counts = np.bincount(np.concatenate(steps), minlength=n) if steps else np.zeros(n, int)
    kappa = np.full((n, n), np.nan)
    pending: dict[int, list[tuple[np.ndarray, np.ndarray, int, np.ndarray]]] = {}
    shared = _SharedStates(_shared_states(trace, mixing, scales=scales, decay=decay, window=L))
    per_view = _view_floats(trace, mixing, L)
    if batch is None:
        batch = max(1, min(n, _FILTER_FLOATS // max(1, per_view)))
    elif isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be an integer >= 1, got {batch!r}")
    # the batches are the same whatever the processes: each process runs whole batches
    batches = [(lo, min(n, lo + batch)) for lo in range(0, n, batch)]
    workers = current_workers() if workers is None else workers
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
    if not maps_here(workers, len(batches)):  # inside remote workers: the shared states stay
        workers = 1
    periodic = _periodic(trace, n) if steady and n <= STEADY_MAX_PEERS else None
    if periodic is None:  # every round is read: computed once, the forked workers share them
        shared.compute_all()
    context = _Context(trace, mixing, scales, decay, L, shared, counts, periodic)
    # a piece: consecutive batches; several a process, for the faster one to take more
    count = 1 if workers == 1 else min(len(batches), _PIECES * workers)
    pieces = [[(int(lo), int(hi)) for lo, hi in part] for part in np.array_split(batches, count)]
    for piece, (columns, found) in zip(
        pieces, forked_map(_filter_batches, context, pieces, workers=workers), strict=True
    ):
        kappa[:, piece[0][0] : piece[-1][1]] = columns
        for T_u, parts in found.items():  # in the order of the views, whatever the split
            pending.setdefault(T_u, []).extend(parts)
    for parts in pending.values():  # the semidefinite program where the caps are loose
        value, _ = worst_case_shifts(np.concatenate([p[0] for p in parts]))
        start = 0
        for _, us, v, tail in parts:
            better = _margin((np.sqrt(np.maximum(value[start : start + us.size], 0.0)) + tail) ** 2)
            kappa[us, v] = np.minimum(kappa[us, v], better)
            start += us.size
    return kappa


class _Context(NamedTuple):
    """What :func:`_filter_batches` reads, the same for every batch of views (inherited by the
    forked workers, never pickled)."""

    trace: ViewTrace
    mixing: Mixing
    scales: np.ndarray
    decay: float
    window: int
    shared: _SharedStates
    counts: np.ndarray
    periodic: tuple[list[Event], int, list[Event]] | None  # _periodic's, None: every round


def _filter_batches(
    context: _Context, batches: list[tuple[int, int]]
) -> tuple[np.ndarray, dict[int, list[tuple[np.ndarray, np.ndarray, int, np.ndarray]]]]:
    """The filter of :func:`filtered_coefficients` for consecutive batches of views, each
    ``(lo, hi)`` the views ``lo`` to ``hi - 1``: their columns of ``kappa`` (P, views) and,
    by number of steps, the matrices whose semidefinite program may tighten them (solved by
    the caller, for every batch at once). A batch's result depends on its views only, not on
    the other batches nor on which process runs it."""
    n = context.mixing.n_peers
    kappa = np.full((n, n), np.nan)
    pending: dict[int, list[tuple[np.ndarray, np.ndarray, int, np.ndarray]]] = {}
    for lo, hi in batches:
        try:
            _filter_batch(context, np.arange(lo, hi), context.periodic, kappa, pending)
        except _NotSteady:  # not a copy of the round before: every round of these views
            _filter_batch(context, np.arange(lo, hi), None, kappa, pending)
    return kappa[:, batches[0][0] : batches[-1][1]], pending


def _filter_batch(
    context: _Context,
    views: np.ndarray,
    periodic: tuple[list[Event], int, list[Event]] | None,
    kappa: np.ndarray,
    pending: dict[int, list[tuple[np.ndarray, np.ndarray, int, np.ndarray]]],
) -> None:
    """One batch of views (``views``, consecutive): their columns of ``kappa`` and their
    ``pending`` semidefinite programs (:func:`_filter_batches`), written only once the run is
    filtered (:class:`_NotSteady` leaves both as they were)."""
    trace, mixing, scales, decay, L, shared, counts, _ = context
    n, T = mixing.n_peers, int(counts.max(initial=0))
    senders, receivers = mixing.indices, mixing.receivers
    u_all = np.arange(n)
    B, rows_b = views.size, np.arange(views.size)
    others = np.array([np.delete(u_all, v) for v in views.tolist()])  # (B, n - 1)
    # view-major. The covariance of the models x(tau) right after the last step event
    # given what view b has read is never formed: it is base - F[b] F[b]^T - R[b] R[b]^T,
    # base the models' covariance before any reading (every noise, shared by the views),
    # F[b] and R[b] the gains of its innovations (the models' covariance with each
    # whitened innovation: each reading removes gain gain^T) and v's own noises (v knows
    # them: a column scales[v] e_v each, which removes their variance). F holds the gains
    # of the innovations that respond to a noise of the window, R the others.
    # The exchanges since tau are carried as one matrix (x = carry x(tau)), applied at the
    # next step event: an exchange's observation H x = (H carry) x(tau) is filtered in
    # tau's coordinates (no noise enters between).
    # The filter error's response to the noise of peer i held in slot l is
    # E[b, :, l n + i] = prior[:, l n + i] - F[b] @ Z_kept[b][:, l n + i] (never formed):
    # prior, the models' response before any reading (shared by the views); Z_kept, the
    # kept innovations' responses.
    prior = np.zeros((n, L * n))
    F = np.zeros((B, n, 0))
    R = np.zeros((B, n, 0))
    Z_kept = np.zeros((B, 0, L * n))
    own = np.add.outer(np.arange(L) * n, views).T  # (B, L): v's own noises' columns
    carry: np.ndarray | None = None  # None: no exchange since tau (the identity)
    exchanged: list[sp.csr_array] = []  # their matrices, carry's factors
    step_of = np.full((L, n), -1)  # which of i's steps slot l holds (-1: none)
    # M_act[b, u, s, k]: the entry (s, s + k) of u's M_act (two steps of u in the window
    # at once are at most L - 1 apart: a band)
    M_act = np.zeros((B, n, T, L))
    remainder = np.zeros((B, n, T))
    taken = np.zeros(n, dtype=np.int64)
    slot = 0
    matrices: dict[bytes, sp.csr_array] = {}  # the last exchange's W_delta
    events = iter(shared)
    variances = np.zeros((B, n))
    schedule = None if periodic is None else _Steady(*periodic, window=L)
    for event in trace.events if schedule is None else schedule.events():
        if isinstance(event, np.ndarray):
            if carry is not None:
                F, R = _left(carry, F, exchanged), _left(carry, R, exchanged)
                carry, exchanged = None, []
            base, prior = next(events)  # moved, decayed, the step's noise in base
            peers = event
            F[:, peers, :] *= decay
            R[:, peers, :] *= decay
            fresh = np.zeros((B, n))
            fresh[:, peers] = scales[peers] ** 2
            fresh[rows_b, views] = 0.0  # v knows its own noise
            stepping = np.flatnonzero(np.isin(views, peers))
            if stepping.size:  # its variance leaves v's covariance
                known = np.zeros((B, n, 1))
                known[stepping, views[stepping], 0] = scales[views[stepping]]
                R = np.concatenate([R, known], axis=2)
            old = np.flatnonzero(step_of[slot] >= 0)
            if old.size:  # retire the oldest slot's noises: bound what they can still tell
                seen = _errors(prior, F, Z_kept, own, slot * n + old, None)  # every row
                idle = fresh == 0  # Sigma >= diag(fresh) on the peers but v
                idle[rows_b, views] = False
                left = np.maximum(1.0 - M_act[:, old, step_of[slot, old], 0], 0.0)
                bound = _remainder(seen, fresh, left, idle)
                loose = np.flatnonzero(
                    (bound.max(axis=1, initial=0.0) > RETIRE_SOLVE) & ~idle.any(axis=1)
                )
                if loose.size:  # Sigma on the peers but v, exactly (P^3 per view)
                    rows = others[loose]
                    seen = np.take_along_axis(seen[loose], rows[:, :, None], axis=1)
                    cov = _covariance(base, F[loose], R[loose])
                    inner = cov[
                        np.arange(loose.size)[:, None, None], rows[:, :, None], rows[:, None, :]
                    ]
                    solved = np.linalg.solve(inner, seen)
                    exact = np.einsum("bik,bik->bk", seen, solved)
                    bound[loose] = np.minimum(bound[loose], np.minimum(exact, left[loose]))
                remainder[:, old, step_of[slot, old]] = np.maximum(bound, 0.0)
            prior = _new_slot(prior, peers, slot, scales)
            Z_kept[:, :, slot * n : (slot + 1) * n] = 0.0  # earlier readings: no response
            responding = np.abs(Z_kept).max(axis=(0, 2), initial=0.0) > 0
            R = np.concatenate([R, F[:, :, ~responding]], axis=2)
            F, Z_kept = F[:, :, responding], Z_kept[:, responding]
            if R.shape[2] > n:  # R R^T has rank <= P: keep P columns with its product
                R = _square_root(R)
            # the models' variances given the view: the scale of a reading's precision
            variances = np.diagonal(base)[None] - (F**2).sum(axis=2) - (R**2).sum(axis=2)
            step_of[slot] = -1
            step_of[slot, peers] = taken[peers]
            taken[peers] += 1
            slot = (slot + 1) % L
            if schedule is not None:
                reset = schedule.step(base, F, R, variances, others)  # _NotSteady: not a copy
                if reset is not None:  # the larger view's reading that makes it a copy
                    covariance, gain = reset  # on the peers but v
                    r = gain.shape[2]
                    whole = np.zeros((2, B, n, r))  # G and Sigma^-1 G on every peer
                    whole[:, rows_b[:, None], others] = gain, np.linalg.solve(covariance, gain)
                    H = whole[1].transpose(0, 2, 1)  # y = H x + w: Z = H E
                    moved = (H.reshape(B * r, n) @ prior).reshape(B, r, L * n)
                    Z = _errors(moved, H @ F, Z_kept, own, slice(None), None)
                    F, Z_kept, variances = _absorb(
                        M_act, step_of, F, Z_kept, variances, whole[0], Z
                    )
            continue
        delivered, late = event
        seen_edges = delivered | late
        lists = [senders[seen_edges & (receivers == v)] for v in views.tolist()]
        d = max(len(x) for x in lists)
        if d:
            index = np.zeros((B, d), dtype=np.int64)
            mask = np.zeros((B, d), dtype=bool)
            for b, x in enumerate(lists):
                index[b, : len(x)], mask[b, : len(x)] = x, True
            if carry is None:  # H x(tau): rows of Sigma and of the error's response
                HF = np.take_along_axis(F, index[:, :, None], axis=1)
                HR = np.take_along_axis(R, index[:, :, None], axis=1)
                HS = base[index] - HF @ F.transpose(0, 2, 1) - HR @ R.transpose(0, 2, 1)
                HS *= mask[:, :, None]  # (B, d, n)
                S = np.take_along_axis(HS, index[:, None, :].repeat(d, axis=1), axis=2)
                HE = _errors(prior, F, Z_kept, own, slice(None), index) * mask[:, :, None]
            else:  # H carry x(tau)
                H = carry[index] * mask[:, :, None]  # (B, d, n)
                HF, HR = H @ F, H @ R
                HS = (H.reshape(B * d, n) @ base).reshape(B, d, n)
                HS -= HF @ F.transpose(0, 2, 1) + HR @ R.transpose(0, 2, 1)
                S = HS @ H.transpose(0, 2, 1)
                moved = _moved(H, prior, (slot - 1) % L)
                HE = _errors(moved, HF, Z_kept, own, slice(None), None)
            w, U = np.linalg.eigh(S * mask[:, None, :] * mask[:, :, None])
            scale = np.maximum(variances.max(axis=1), 1e-300)
            keep = w > 1e-10 * scale[:, None]
            white = U * np.where(keep, 1.0 / np.sqrt(np.where(keep, w, 1.0)), 0.0)[:, None]
            gain = HS.transpose(0, 2, 1) @ white  # (B, n, d): Cov(x(tau) error, z)
            Z = white.transpose(0, 2, 1) @ HE  # (B, d, L n): z's response to each noise
            F, Z_kept, variances = _absorb(M_act, step_of, F, Z_kept, variances, gain, Z)
        key = delivered.tobytes()
        if key not in matrices:  # few patterns: every message delivered, mostly
            matrices = {key: mixing.matrix(delivered)}
        W = matrices[key]
        carry = W.toarray() if carry is None else W @ carry
        exchanged.append(W)
    if schedule is not None and schedule.start is not None:  # the copies' values
        copies = schedule.copies()
        M_act, remainder = M_act[:, :, copies], remainder[:, :, copies]
    for b, v in enumerate(views.tolist()):
        for T_u in np.unique(counts).tolist():
            same = np.flatnonzero((counts == T_u) & (u_all != v))
            if not same.size:
                continue
            if T_u == 0:
                kappa[same, v] = 0.0
                continue
            M = _banded(M_act[b, same][:, :T_u], T_u)
            active, hard = _certificate(M)
            tail = np.sqrt(remainder[b, same, :T_u]).sum(axis=1)
            kappa[same, v] = np.minimum(_margin((np.sqrt(active) + tail) ** 2), T_u)
            if hard.size:  # solved by the caller, all views' at once
                pending.setdefault(T_u, []).append((M[hard], same[hard], v, tail[hard]))


def _absorb(
    M_act: np.ndarray,
    step_of: np.ndarray,
    F: np.ndarray,
    Z_kept: np.ndarray,
    variances: np.ndarray,
    gain: np.ndarray,
    Z: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A reading's whitened innovations, gains ``gain`` (B, P, d) and responses ``Z`` (B, d,
    window P), added to the window's information ``M_act`` (in place: the products of the
    responses to two noises of a peer held in slots ``a`` and ``c``, ``step_of`` their steps)
    and to the view's gains: the new ``F``, ``Z_kept`` and the models' variances."""
    B, d = Z.shape[:2]
    L, n = step_of.shape
    Z4 = Z.reshape(B, d, L, n)
    pairs = np.einsum("brlu,brmu->bulm", Z4, Z4)  # (B, n, L, L)
    for a in range(L):
        for c in range(L):
            apart = step_of[c] - step_of[a]
            both = np.flatnonzero((step_of[a] >= 0) & (step_of[c] >= 0) & (apart >= 0))
            M_act[:, both, step_of[a, both], apart[both]] += pairs[:, both, a, c]
    F = np.concatenate([F, gain], axis=2)
    Z_kept = np.concatenate([Z_kept, Z], axis=1)
    return F, Z_kept, variances - (gain**2).sum(axis=2)


#: Above this fraction of nonzero entries the exchanges carried to a step event are applied
#: as a dense matrix (BLAS), below it as sparse ones (one exchange of a sparse overlay, or
#: several of a large one: see :func:`_left`).
_DENSE_CARRY = 0.1


def _errors(
    prior: np.ndarray,
    F: np.ndarray,
    Z_kept: np.ndarray,
    own: np.ndarray,
    columns: np.ndarray | slice,
    rows: np.ndarray | None,
) -> np.ndarray:
    """The filter error's response to the window's noises, ``prior - F Z_kept``, of a batch
    of views: its ``rows`` (B, r) of each view (``None``: ``prior`` (B, r, L P) or (P, L P)
    and ``F`` (B, r, m) are already those rows) and ``columns`` of the noises; a view's own
    noises (``own`` (B, L), their columns) respond 0 (not unknown to it)."""
    B = F.shape[0]
    picked = np.zeros((B, prior.shape[-1]), dtype=bool)
    picked[np.arange(B)[:, None], own] = True
    prior = prior[..., columns]
    if rows is not None:
        prior, F = prior[rows], np.take_along_axis(F, rows[:, :, None], axis=1)
    errors = F @ Z_kept[..., columns]
    np.subtract(prior, errors, out=errors)  # prior - F Z_kept, in one (B, r, k) array
    errors *= ~picked[:, None, columns]
    return errors


def _moved(H: np.ndarray, prior: np.ndarray, fresh: int) -> np.ndarray:
    """``H @ prior`` (B, d, window P) for readings ``H`` (B, d, P): the slot ``fresh`` of
    ``prior`` holds the last step event's noises, not yet moved by an exchange (a diagonal
    block, :func:`_new_slot`): a scaling of ``H``, not a product (half the readings' cost
    with a window of 2)."""
    B, d, n = H.shape
    moved = np.empty((B, d, prior.shape[1]))
    for start in range(0, prior.shape[1], n):
        if start == fresh * n:
            moved[..., start : start + n] = H * np.diagonal(prior[:, start : start + n])
        else:
            moved[..., start : start + n] = (
                H.reshape(B * d, n) @ prior[:, start : start + n]
            ).reshape(B, d, n)
    return moved


def _remainder(
    errors: np.ndarray, floor: np.ndarray, left: np.ndarray, idle: np.ndarray
) -> np.ndarray:
    """Upper values of what revealing the models would add about retired noises, for a
    batch, without factorising a view's covariance.

    Parameters
    ----------
    errors : (B, r, k) array
        ``e``: the filter error's response to each of k unit-variance noises on r peers,
        ``Cov(x, n_j | view)``.
    floor : (B, r) array
        The variances the r peers have just injected (independent of the view and of the
        retired noises): ``Sigma >= diag(floor) = D``. A peer with 0 is left out of ``q``.
    left : (B, k) array
        ``s_j = Var(n_j | view) = 1 - (what n_j has told so far)``.
    idle : (B, r) bool array
        The peers that did not step (0 in ``floor``) and whose error counts: every peer but
        the view's own (which knows its model).

    Returns
    -------
    (B, k): ``q s / (q + s)`` with ``q = e^T D^+ e`` (``s`` where ``e`` leaves the range of
    ``D``: a peer that did not step). ``Sigma`` is the fresh noise plus the older
    uncertainty, and the latter is at least the part ``n_j`` explains, ``e e^T / s``, so
    ``Sigma >= D + e e^T / s`` and (Sherman-Morrison) ``e^T Sigma^+ e <= q s / (q + s)``:
    at most ``min(q, s)``. (``e^T Sigma^+ e = sup_w 2 w.e - w^T Sigma w`` decreases as
    ``Sigma`` grows.)
    """
    stepped = floor > 0
    quotient = np.where(stepped, 1.0 / np.where(stepped, floor, 1.0), 0.0)
    q = np.einsum("brk,brk,br->bk", errors, errors, quotient)  # no (B, r, k) temporary
    rows = np.flatnonzero(idle.any(axis=0))
    outside = np.abs(errors[:, rows] * idle[:, rows, None]).max(axis=1, initial=0.0) > 0
    combined = q * left / np.maximum(q + left, 1e-300)
    return np.where(outside, left, combined)


#: The most peers whose periodic runs take the settled path (:class:`_Steady`): each reset
#: factorises a view's covariance (about ``3 P^3`` a view), which outgrows the rounds it saves.
#: CPU of 20 rounds of 5 exchanges on a 10-regular overlay, 2 processes, settled against every
#: round (``benchmarks/network_dp_cost.py --every-round``, load about 2): 300 peers 18 s
#: against 42 s, 500 peers 115 s against 167 s; 1,000 peers settled took more than every round
#: (stopped after 10 min of 2 cores, against about 6 min).
STEADY_MAX_PEERS = 500


class _SharedStates:
    """The states :func:`_shared_states` yields, computed when a batch first reads them and
    kept for the process's other batches: the settled path (:class:`_Steady`) reads only its
    ``s0 + window + 2`` rounds' (a batch that does not settle, every round's). Each forked
    worker extends its own copy (their cost is small beside the views': about 1% of the
    filter's CPU at 200 peers, 20 rounds of 5 exchanges); where every round is read they are
    computed before the workers fork (:meth:`compute_all`), whose memory they share."""

    def __init__(self, states: Iterator[tuple[np.ndarray, np.ndarray]]) -> None:
        self._source = states
        self._kept: list[tuple[np.ndarray, np.ndarray]] = []

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        index = 0
        while True:
            if index == len(self._kept):
                state = next(self._source, None)
                if state is None:
                    return
                self._kept.append(state)
            yield self._kept[index]
            index += 1

    def compute_all(self) -> None:
        """Compute every state now."""
        for _ in self:
            pass


def _shared_states(
    trace: ViewTrace, mixing: Mixing, *, scales: np.ndarray, decay: float, window: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """What :func:`filtered_coefficients` shares between its views at each step event, in
    order, once for all its batches (:class:`_SharedStates`): ``base`` (P, P), the models'
    covariance before any reading (every noise so far, the step's included), and ``prior``
    (P, window P), the models' response to the window's noises (the step's slot not yet
    renewed), both right after the step's decay (2 P^3 + window P^3 each, instead of that for
    each batch)."""
    n = mixing.n_peers
    base, prior = np.zeros((n, n)), np.zeros((n, window * n))
    carry: np.ndarray | None = None
    exchanged: list[sp.csr_array] = []
    matrices: dict[bytes, sp.csr_array] = {}
    slot = 0
    for event in trace.events:
        if isinstance(event, np.ndarray):
            if carry is not None:
                base = _left(carry, _left(carry, base, exchanged).T, exchanged)  # C base C^T
                prior, carry = _left(carry, prior, exchanged), None
                exchanged = []
            base[event, :] *= decay
            base[:, event] *= decay
            base[event, event] += scales[event] ** 2
            prior[event] *= decay
            yield base.copy(), prior.copy()
            prior = _new_slot(prior, event, slot, scales)
            slot = (slot + 1) % window
            continue
        key = event[0].tobytes()
        if key not in matrices:
            matrices = {key: mixing.matrix(event[0])}
        carry = matrices[key].toarray() if carry is None else matrices[key] @ carry
        exchanged.append(matrices[key])


def _new_slot(prior: np.ndarray, peers: np.ndarray, slot: int, scales: np.ndarray) -> np.ndarray:
    """``prior`` (P, window P) with slot ``slot`` holding the step's noises of ``peers`` (a
    copy: the step's shared state stays as it was)."""
    n = prior.shape[0]
    prior = prior.copy()
    prior[:, slot * n : (slot + 1) * n] = 0.0
    prior[peers, slot * n + peers] = -scales[peers]
    return prior


def _left(carry: np.ndarray, X: np.ndarray, exchanges: list[sp.csr_array]) -> np.ndarray:
    """``carry @ X`` for a (P, P) matrix and ``X`` (P, C) or a batch (B, P, C): the state moved
    from the last step event to now through the exchanges since (``carry`` is the product of
    their matrices ``exchanges``, in order), by whichever takes the fewest operations, a
    sparse multiply-add counted as ``1 / _DENSE_CARRY`` dense ones (BLAS): ``carry`` as a
    dense matrix (``P^2`` a column), as a sparse one, or the exchanges one by one (sparse, the
    sum of their nonzeros a column: at degree 10 and 5 exchanges, from about 750 peers)."""
    nonzero = int(np.count_nonzero(carry))
    stepwise = sum(int(W.nnz) for W in exchanges)
    if min(nonzero, stepwise) > _DENSE_CARRY * carry.size:
        return np.matmul(carry, X)
    if stepwise < nonzero:
        batch = X if X.ndim == 3 else X[None]
        out = np.empty(batch.shape)
        for b, view in enumerate(batch):
            for W in exchanges:
                view = W @ view
            out[b] = view
        return out if X.ndim == 3 else out[0]
    sparse = sp.csr_array(carry)
    if X.ndim == 2:
        return sparse @ X
    B, P, C = X.shape
    out = sparse @ X.transpose(1, 0, 2).reshape(P, B * C)
    return np.ascontiguousarray(out.reshape(P, B, C).transpose(1, 0, 2))


def _square_root(R: np.ndarray) -> np.ndarray:
    """(B, P, P) factors with the same ``R R^T`` as ``R`` (B, P, C), ``C > P``: ``T^T`` of the
    QR decomposition ``R^T = Q T`` (``R R^T = T^T Q^T Q T = T^T T``; ``C P^2`` a view)."""
    upper = cast(np.ndarray, np.linalg.qr(R.transpose(0, 2, 1), mode="r"))
    return upper.transpose(0, 2, 1)


def _banded(band: np.ndarray, T: int) -> np.ndarray:
    """The symmetric (k, T, T) matrices whose entries ``(s, s + j)`` are ``band[:, s, j]``
    (zero beyond the band)."""
    M = np.zeros((band.shape[0], T, T))
    s = np.arange(T)
    for j in range(min(band.shape[-1], T)):
        M[:, s[: T - j], s[j:]] = band[:, : T - j, j]
        M[:, s[j:], s[: T - j]] = band[:, : T - j, j]
    return M


def _window_innovations(trace: ViewTrace, mixing: Mixing, window: int) -> int:
    """About the most innovations of a view that respond to a noise of the window (the
    columns of ``F`` in :func:`filtered_coefficients`): the readings of ``window + 1``
    step events' exchanges, each of up to the largest in-degree."""
    steps = sum(isinstance(e, np.ndarray) for e in trace.events)
    exchanges = sum(isinstance(e, tuple) for e in trace.events)
    received = int(np.bincount(mixing.receivers, minlength=mixing.n_peers).max(initial=0))
    return (window + 1) * math.ceil(exchanges / max(steps, 1)) * received


def _view_floats(trace: ViewTrace, mixing: Mixing, window: int) -> int:
    """The floats of one view's state in :func:`filtered_coefficients` (gains, responses, the
    band of ``M_act``)."""
    n = mixing.n_peers
    innovations = _window_innovations(trace, mixing, window)
    steps = [e for e in trace.events if isinstance(e, np.ndarray)]
    T = int(np.bincount(np.concatenate(steps), minlength=n).max()) if steps else 0
    return n * (2 * n + innovations + T * (window + 1)) + innovations * window * n


def filter_bytes(trace: ViewTrace, mixing: Mixing, window: int | None = None) -> int:
    """The memory :data:`~p2pdp.protocols.network_dp.MAX_FILTER_BYTES` limits (bytes of
    :func:`filtered_coefficients`, counted without running it): the states shared by the
    views, ``(1 + window) P^2`` floats a step event, held for every batch (by each process,
    copy-on-write), and one batch's state, :data:`_FILTER_FLOATS` floats (one view's if
    more)."""
    window = filter_window(trace) if window is None else window
    n = mixing.n_peers
    steps = sum(isinstance(e, np.ndarray) for e in trace.events)
    batch = max(_FILTER_FLOATS, _view_floats(trace, mixing, window))
    return 8 * (steps * (1 + window) * n * n + batch)


def filter_work(trace: ViewTrace, mixing: Mixing, window: int | None = None) -> int:
    """The size :data:`MAX_FILTER_WORK` limits (multiply-adds of :func:`filtered_coefficients`,
    counted without running it), over the ``P`` views: each exchange's reading, ``d`` rows
    (the largest in-degree) against the shared covariance and window responses,
    ``d (window + 1) P^2``; each step event's moves of the gains (at most ``P`` columns of
    old ones, ``R``: a step event's new gains each step so far, and the window's, ``F``) and
    the retirement's error responses, ``P^2 (R + 2 F)``; with fewer than 5 exchanges a step
    (a window over 2 step events), where a retired noise's floor is loose
    (:data:`RETIRE_SOLVE`), each retirement's view covariance and solve, ``3 P^3``."""
    window = filter_window(trace) if window is None else window
    n = mixing.n_peers
    steps = sum(isinstance(e, np.ndarray) for e in trace.events)
    exchanges = sum(isinstance(e, tuple) for e in trace.events)
    received = int(np.bincount(mixing.receivers, minlength=n).max(initial=0))
    innovations = _window_innovations(trace, mixing, window)
    per_step = math.ceil(exchanges / max(steps, 1)) * received + 1  # new gains a step event
    old = sum(min(n, s * per_step) for s in range(1, steps + 1))
    solves = 3 * n * max(0, steps - window) if window > 2 else 0
    return n**2 * (
        exchanges * received * (window + 1) * n + n * old + 2 * steps * innovations * n + solves * n
    )
