"""Pairwise network DP of Muffliato (Cyffers et al. 2022): exact over a view, or a certified bound.

**What it bounds, and against whom.** Local DP (the protocols' ``epsilon_spent``) bounds what
*any* neighbour learns from a peer's messages. Pairwise network DP bounds what one peer ``v``
learns about a peer ``u``'s data from its **whole view** of the run: every message ``v``
received (on time or late: a late message is not averaged, but ``v`` has read it), its own
noise and data (so its own model at every moment), over every private step and every
averaging exchange the run made, including those peers keep making after their budget stops
their steps. ``v`` is honest-but-curious and alone: it sees no other peer's messages and does
not collude. A weaker adversary than local DP's, so a smaller number: report it beside local
DP, never as it. Neighbouring relation: replace one record of ``u``'s shard (``full`` and
``fixed`` sampling; a step's sum moves by at most ``Delta = 2 C``).

**The view model** (the linear-Gaussian view of the paper). Per model coordinate (all
coordinates alike; the noise is iid across them), a private step of peer ``i`` is
``x_i <- (1 - eta lam) x_i - (eta / m_i) (g_i + n)``, ``n ~ N(0, sigma^2)``, and an exchange is
``x_i <- x_i + sum_{j delivered} W_ij (x_j - x_i)`` (:mod:`p2pdp.protocols.mixing`), as the
run made them (:class:`ViewTrace`: which peers stepped, which messages arrived, which were
late, which lost). ``v``'s view is then ``A n + b(D)``: ``A`` a linear map of the stacked
noises of the run and ``b`` the gradient terms. Knowing its own noises, ``v`` removes their
columns from ``A``. Changing one record of ``u`` moves ``u``'s gradient term at its ``t``-th
step by some ``c_t`` with ``||c_t|| <= Delta`` (chosen by an adversary, one per step, in any
direction); it enters ``A`` exactly where ``u``'s ``t``-th noise does, so the mean of the view
moves by ``B c``, ``B`` = the columns of ``A`` of ``u``'s noises. Two Gaussians with the
covariance ``sigma^2 A A^T`` and means ``B c`` apart are exactly ``mu``-GDP with
``mu^2 = c^T B^T (A A^T)^+ B c / sigma^2`` (Renyi divergence ``alpha mu^2 / 2`` at every order)
and the worst case over the ``c_t`` is

``mu^2 = (Delta / sigma)^2 * kappa,  kappa = sup_{||a_t|| <= 1} sum_{s,t} M_st a_s . a_t``,

``M = B^T (A A^T)^+ B``: the block of ``u``'s noises in the projection onto the row space of
``A`` (the shift always lies in the range of the covariance: it is a combination of columns of
``A``). ``0 <= M <= I``, so ``kappa <= T_u``, ``u``'s number of steps: never more than local
DP. ``kappa`` is the value of a max-cut-like semidefinite program; :func:`worst_case_shifts`
computes a feasible point (a lower bound) and a dual certificate (an upper bound) and the
columns report the upper bound (closed form, exact, when ``T_u <= 2``; within 1e-8 of the
lower one on the graphs tested; ``network_dp_note`` says so where the gap exceeds 1e-6).
Converted to ``(epsilon, delta)`` at the rows' ``privacy.delta`` exactly (``mu``-GDP, Dong,
Roth & Su), the conversion of the ``gdp`` accountant.

**Which runs.** Those of ``dpsgd`` (one exchange per round) and ``muffliato`` (``K``); the
rows of other protocols say why not (:func:`not_modelled`).

**Poisson sampling** (relation add/remove: the neighbouring shard of ``u`` has one more record,
a step's sum moves by at most ``Delta = C``). The view is then a mixture, over the sampling
outcomes, of Gaussian views. Condition on an outcome (which records every peer's batches
drew, the same distribution under both neighbours for every record but the differing one,
and whether that one was drawn at each of ``u``'s steps): the view is the Gaussian above, with
shifts ``c_t`` of norm at most ``C`` where the record was drawn and 0 where not, so every
outcome is covered by the same ``sup`` over ``||c_t|| <= C``. The hockey-stick divergence is
jointly convex, so the mixtures' ``(epsilon, delta)`` is at most the worst outcome's: the
columns bound the run for every sampling outcome, with no amplification by sampling claimed
(the local DP accounting claims it; the network DP of a Poisson row can therefore exceed its
local DP).

**Churn and lost messages.** The trace records the run as it happened: the peers that stepped
(an offline peer does not), the messages delivered and those read late (a late message to an
offline receiver is counted as read: a superset of the view, so still an upper bound); a lost
message, or one never sent by an offline peer, is in no view. The same computation applies.

**Large views: a certified upper bound.** Views above :data:`MAX_VIEW_ENTRIES` entries take
:func:`filtered_coefficients`: a Kalman filter over the ``P`` models per view (its whitened
innovations are an orthonormal basis of the view, so ``M`` is a sum of their responses),
exact for the noises of the last :func:`filter_window` step events and, for older ones, the
information they can still add bounded by what revealing the models at their retirement would
give (a superset of the view: monotonicity), itself bounded with a covariance floor that is
the same for every view (the fresh noise of the step, plus what the retired noise explains:
no factorisation per view; the view's own solve only where that floor is loose, with few
exchanges a step); Minkowski's inequality then gives
``kappa <= (sqrt(kappa(M_window)) + sum_t sqrt(r_t))^2``, capped by ``T_u``. A view's
covariance is never formed: it is the prior covariance (shared by the views) minus the outer
products of its gains. Cost (:func:`filter_work`): about ``P^3`` x (readings x (window + 1)
+ the gains moved at each step event, at most ``P``), limited by :data:`MAX_FILTER_WORK`
(100 peers of degree 10, 100 rounds of 5 exchanges: yes; 1,000 peers: no).

**Where it says nothing** (NaN, with the reason in ``network_dp_note``): noiseless steps; runs
beyond both limits. ``network_dp_method`` says ``exact`` when the dense computation's
semidefinite certificate met its feasible point (gap <= 1e-6: the value is exact to that
precision), ``bound`` when it did not (the certified upper value is reported) or when the
filtered bound was used.

**Assumption.** Like the paper, the model takes the gradient terms
``g`` as fixed functions of the data; in a real run they also depend on the models, hence on
the noise (the local DP accounting needs no such assumption).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import shortest_path

from p2pdp.privacy.clipped_gaussian import ClippedGaussianSum
from p2pdp.privacy.gdp import gdp_epsilon
from p2pdp.protocols.mixing import Mixing

#: Largest computation: the sum over peers ``v`` of (rows of ``v``'s view) x (noises injected
#: in the run), i.e. the entries of all views' matrices ``A`` (8 bytes each).
MAX_VIEW_ENTRIES = 10_000_000

#: Largest :func:`filter_work` of the filtered bound (views larger than
#: :data:`MAX_VIEW_ENTRIES` take it). On a shared 2-core machine (load 12-16, one BLAS
#: thread), 10-regular overlays, 5 exchanges a round: 100 peers with 20 rounds are 1.1e10
#: (about 3 s of CPU), with 100 rounds 5.5e10 (16 s); 200 peers with 20 rounds 1e11 (22 s),
#: 500 peers 2.1e12 (288 s); 1,000 peers with 20 rounds are 2e13 (20 to 45 min by its first 3
#: rounds, 100 s, and by the growth from 300 to 500 peers): left empty, with the reason.
MAX_FILTER_WORK = 120_000_000_000

#: Barrier rounds (each dividing the barrier weight by 10) and Newton steps per round of
#: :func:`worst_case_shifts` (both stop earlier once converged).
_BARRIER_ROUNDS = 30
_NEWTON_STEPS = 50


@dataclass(slots=True)
class ViewTrace:
    """What a synchronous run did, in order: every step's peers and every exchange's messages.

    ``events[k]`` is either a (k,) int array, the peers that took a private step, or a pair
    ``(delivered, late)`` of (E,) bool arrays over the overlay's edges (``Mixing.indices``):
    the messages averaged, and those that arrived after the exchange's deadline (read by
    their receiver, not averaged). An edge in neither was lost (never seen).
    """

    events: list[np.ndarray | tuple[np.ndarray, np.ndarray]] = field(default_factory=list)

    def step(self, peers: np.ndarray) -> None:
        self.events.append(np.array(peers, dtype=np.int64))

    def exchange(self, delivered: np.ndarray, late: np.ndarray) -> None:
        self.events.append((np.array(delivered, dtype=bool), np.array(late, dtype=bool)))

    def view_entries(self) -> int:
        """The size :data:`MAX_VIEW_ENTRIES` limits (counted without building anything)."""
        noises = sum(e.size for e in self.events if isinstance(e, np.ndarray))
        received = sum(int((e[0] | e[1]).sum()) for e in self.events if isinstance(e, tuple))
        return received * noises


def full_delivery_trace(mixing: Mixing, steps: int, exchanges: int, *, after: int = 0) -> ViewTrace:
    """The trace of a run in which every peer steps ``steps`` times with ``exchanges``
    exchanges after each, every message delivered on time, then ``after`` more exchanges
    without steps (budgets spent)."""
    trace = ViewTrace()
    every = np.ones(len(mixing.indices), dtype=bool)
    for _ in range(steps):
        trace.step(np.arange(mixing.n_peers))
        for _ in range(exchanges):
            trace.exchange(every, ~every)
    for _ in range(after):
        trace.exchange(every, ~every)
    return trace


def worst_case_shifts(M: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``kappa = sup sum_{s,t} M_st a_s . a_t`` over vectors ``||a_t|| <= 1``, for a batch.

    A semidefinite program (the sup over Gram matrices ``G >= 0`` with ``diag G <= 1`` of
    ``tr(M G)``; attained at ``diag G = 1`` since ``M >= 0``), solved by the barrier method
    on its dual ``min sum y s.t. diag(y) - M >= 0`` (Newton steps on
    ``sum y / tau - logdet(diag y - M)``, ``tau`` divided by 10 until ``tau T < 1e-12 sum y``),
    every matrix of the batch at once.

    Parameters
    ----------
    M : (B, T, T) array of symmetric positive semidefinite matrices

    Returns
    -------
    (upper, lower), each (B,): ``upper = sum y + T lambda_max(M - diag y)``, a bound valid for
    every ``y`` (for ``diag G = 1``,
    ``tr(M G) = sum y + tr((M - diag y) G) <= sum y + T lambda_max``), capped by
    ``sum |M_st|`` and ``T lambda_max(M)``; ``lower = tr(M G)`` at
    the primal point ``G`` of the central path (``tau (diag y - M)^-1`` scaled to a unit
    diagonal), or at ``G = I`` or ``G = s s^T`` (``s`` the signs of the top eigenvector),
    attained by unit vectors ``a_t``. For ``T <= 2`` both are the closed form
    ``M_11 + M_22 + 2 |M_12|`` (``max(M_11, 0)`` for ``T = 1``).
    """
    T = M.shape[-1]
    if T <= 2:
        value = np.maximum(np.trace(M, axis1=1, axis2=2), 0.0)
        if T == 2:
            value = value + 2.0 * np.abs(M[:, 0, 1])
        return value, value.copy()
    values, vectors = np.linalg.eigh(M)
    top = np.maximum(values[:, -1], 0.0)
    cap = np.minimum(np.abs(M).sum(axis=(1, 2)), T * top)
    sign = np.where(vectors[:, :, -1] >= 0, 1.0, -1.0)
    lower = np.maximum(np.trace(M, axis1=1, axis2=2), np.einsum("bi,bij,bj->b", sign, M, sign))
    upper = np.maximum(cap, lower)
    hard = np.flatnonzero((cap - lower > 1e-12 * cap) & (top > 0))
    if not hard.size:
        return upper, lower
    M_hard, eye = M[hard], np.eye(T)
    y = np.repeat(2.0 * top[hard, None], T, axis=1)
    tau = top[hard].copy()
    for _ in range(_BARRIER_ROUNDS):
        for _ in range(_NEWTON_STEPS):  # Newton on sum(y) / tau - logdet(diag y - M)
            inverse = np.linalg.inv(y[:, :, None] * eye - M_hard)
            gradient = 1.0 / tau[:, None] - np.diagonal(inverse, axis1=1, axis2=2)
            step = np.linalg.solve(inverse**2, -gradient[:, :, None])[:, :, 0]
            decrement = -np.einsum("bi,bi->b", gradient, step)  # squared Newton decrement
            if decrement.max() < 1e-12:
                break
            length = np.where(decrement < 1e-12, 0.0, 1.0)
            for _ in range(40):  # halve each step until diag y - M stays positive definite
                trial = (y + length[:, None] * step)[:, :, None] * eye - M_hard
                bad = np.linalg.eigvalsh(trial)[:, 0] <= 0
                if not bad.any():
                    break
                length[bad] /= 2.0
            y = y + length[:, None] * step
        if (tau * T < 1e-12 * y.sum(axis=1)).all():
            break
        tau /= 10.0
    G = tau[:, None, None] * np.linalg.inv(y[:, :, None] * eye - M_hard)
    scale = 1.0 / np.sqrt(np.diagonal(G, axis1=1, axis2=2))
    G = G * scale[:, :, None] * scale[:, None, :]
    lower[hard] = np.maximum(lower[hard], np.einsum("bij,bij->b", M_hard, G))
    certificate = y.sum(axis=1) + T * np.linalg.eigvalsh(M_hard - y[:, :, None] * eye)[:, -1]
    upper[hard] = np.maximum(np.minimum(certificate, cap[hard]), lower[hard])
    return upper, lower


def view_coefficients(
    trace: ViewTrace, mixing: Mixing, *, scales: np.ndarray, decay: float
) -> tuple[np.ndarray, float]:
    """``kappa[u, v]`` of every ordered pair (the diagonal NaN) and the largest relative gap.

    Parameters
    ----------
    trace : ViewTrace
        The run.
    mixing : Mixing
        The overlay's weights (``trace``'s masks are over its edges).
    scales : (P,) array
        ``eta / m_i``: how much of a step's noisy sum enters peer ``i``'s model.
    decay : float
        ``1 - eta lam``: what a step keeps of the stepping peer's model.

    Returns
    -------
    (kappa, gap): kappa (P, P), ``u``'s worst-case squared mean shift in ``v``'s view in units
    of ``(Delta / sigma)^2`` (the upper bound of :func:`worst_case_shifts`); gap, the largest
    ``(upper - lower) / upper`` over pairs (0: every value exact).
    """
    n = mixing.n_peers
    steps = [e for e in trace.events if isinstance(e, np.ndarray)]
    owner = np.concatenate(steps) if steps else np.zeros(0, dtype=np.int64)
    X = np.zeros((n, owner.size))  # each peer's model as a combination of the noises
    views: list[list[np.ndarray]] = [[] for _ in range(n)]
    senders, receivers = mixing.indices, mixing.receivers
    column = 0
    for event in trace.events:
        if isinstance(event, np.ndarray):
            X[event] *= decay
            X[event, column + np.arange(event.size)] = -scales[event]
            column += event.size
            continue
        delivered, late = event
        seen = np.flatnonzero(delivered | late)
        for v in np.unique(receivers[seen]).tolist():
            views[v].append(X[senders[seen[receivers[seen] == v]]])
        X = mixing.average(X, delivered)
    kappa = np.full((n, n), np.nan)
    gap = 0.0
    for v in range(n):
        others = owner != v  # v knows its own noises: their columns leave the view
        A = np.concatenate(views[v])[:, others] if views[v] else np.zeros((0, int(others.sum())))
        basis = _row_space(A)
        kept = owner[others]
        peers = [u for u in range(n) if u != v]
        counts = np.array([int((kept == u).sum()) for u in peers])
        for T in np.unique(counts).tolist():  # the peers that took T steps, at once
            same = [u for u, c in zip(peers, counts, strict=True) if c == T]
            blocks = np.stack([basis[:, kept == u] for u in same])  # (k, rank, T)
            upper, lower = worst_case_shifts(np.einsum("bri,brj->bij", blocks, blocks))
            kappa[same, v] = upper
            positive = upper > 0
            if positive.any():
                gap = max(gap, float(((upper - lower)[positive] / upper[positive]).max()))
    return kappa, gap


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
    not ``2 P^3`` for ``C Sigma C^T``); ``R``, whose ``R R^T`` has rank at most ``P``, is
    replaced by a ``P``-column factor (QR) once it has more columns. ``E`` is never formed:
    it is the window's noises' response before any reading (shared by the views) minus
    ``F Z_kept`` (an innovation before a noise does not respond to it), and ``M_act`` is a
    band (two steps of ``u`` in the window are under ``window`` apart).

    Parameters: as :func:`view_coefficients`, plus ``window`` (default
    :func:`filter_window`). Returns the (P, P) upper bounds (the diagonal NaN), each raised
    by :func:`_margin` above the rounding of the arithmetic.
    """
    window = filter_window(trace) if window is None else window
    n, L = mixing.n_peers, window
    scales = np.asarray(scales, dtype=float)
    steps = [e for e in trace.events if isinstance(e, np.ndarray)]
    counts = np.bincount(np.concatenate(steps), minlength=n) if steps else np.zeros(n, int)
    T = int(counts.max(initial=0))
    senders, receivers = mixing.indices, mixing.receivers
    kappa = np.full((n, n), np.nan)
    pending: dict[int, list[tuple[np.ndarray, np.ndarray, int, np.ndarray]]] = {}
    shared = _shared_states(trace, mixing, scales=scales, decay=decay, window=L)
    innovations = _window_innovations(trace, mixing, L)
    per_view = n * (2 * n + innovations + T * (L + 1)) + innovations * L * n
    batch = max(1, min(n, _FILTER_FLOATS // max(1, per_view)))
    u_all = np.arange(n)
    for lo in range(0, n, batch):
        views = np.arange(lo, min(n, lo + batch))
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
        for event in trace.events:
            if isinstance(event, np.ndarray):
                if carry is not None:
                    F, R = _left(carry, F), _left(carry, R)
                    carry = None
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
                    seen = _errors(prior, F, Z_kept, own, slot * n + old, others)
                    floor = fresh[rows_b[:, None], others]  # Sigma >= diag(floor)
                    left = np.maximum(1.0 - M_act[:, old, step_of[slot, old], 0], 0.0)
                    bound = _remainder(seen, floor, left)
                    loose = np.flatnonzero(
                        (bound.max(axis=1, initial=0.0) > RETIRE_SOLVE) & (floor > 0).all(axis=1)
                    )
                    if loose.size:  # Sigma on the peers but v, exactly (P^3 per view)
                        rows = others[loose]
                        cov = _covariance(base, F[loose], R[loose])
                        inner = cov[
                            np.arange(loose.size)[:, None, None], rows[:, :, None], rows[:, None, :]
                        ]
                        solved = np.linalg.solve(inner, seen[loose])
                        exact = np.einsum("bik,bik->bk", seen[loose], solved)
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
                    moved = (H.reshape(B * d, n) @ prior).reshape(B, d, L * n)
                    HE = _errors(moved, HF, Z_kept, own, slice(None), None)
                w, U = np.linalg.eigh(S * mask[:, None, :] * mask[:, :, None])
                scale = np.maximum(variances.max(axis=1), 1e-300)
                keep = w > 1e-10 * scale[:, None]
                white = U * np.where(keep, 1.0 / np.sqrt(np.where(keep, w, 1.0)), 0.0)[:, None]
                gain = HS.transpose(0, 2, 1) @ white  # (B, n, d): Cov(x(tau) error, z)
                Z = white.transpose(0, 2, 1) @ HE  # (B, d, L n): z's response to each noise
                Z4 = Z.reshape(B, d, L, n)
                pairs = np.einsum("brlu,brmu->bulm", Z4, Z4)  # (B, n, L, L)
                for a in range(L):
                    for c in range(L):
                        apart = step_of[c] - step_of[a]
                        both = np.flatnonzero((step_of[a] >= 0) & (step_of[c] >= 0) & (apart >= 0))
                        M_act[:, both, step_of[a, both], apart[both]] += pairs[:, both, a, c]
                F = np.concatenate([F, gain], axis=2)
                Z_kept = np.concatenate([Z_kept, Z], axis=1)
                variances -= (gain**2).sum(axis=2)
            key = delivered.tobytes()
            if key not in matrices:  # few patterns: every message delivered, mostly
                matrices = {key: mixing.matrix(delivered)}
            W = matrices[key]
            carry = W.toarray() if carry is None else W @ carry
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
                if hard.size:  # solved below, all views' at once
                    pending.setdefault(T_u, []).append((M[hard], same[hard], v, tail[hard]))
    for parts in pending.values():  # the semidefinite program where the caps are loose
        value, _ = worst_case_shifts(np.concatenate([p[0] for p in parts]))
        start = 0
        for _, us, v, tail in parts:
            better = _margin((np.sqrt(np.maximum(value[start : start + us.size], 0.0)) + tail) ** 2)
            kappa[us, v] = np.minimum(kappa[us, v], better)
            start += us.size
    return kappa


#: Above this fraction of nonzero entries the exchanges carried to a step event are applied
#: as a dense matrix (BLAS), below it as a sparse one (one exchange of a sparse overlay).
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
    of views: its ``rows`` (B, r) of each view (``None``: ``prior`` (B, r, L P) and ``F``
    (B, r, m) are already those rows) and ``columns`` of the noises; a view's own noises
    (``own`` (B, L), their columns) respond 0 (not unknown to it)."""
    B = F.shape[0]
    picked = np.zeros((B, prior.shape[-1]), dtype=bool)
    picked[np.arange(B)[:, None], own] = True
    prior = prior[..., columns]
    if rows is not None:
        prior, F = prior[rows], np.take_along_axis(F, rows[:, :, None], axis=1)
    errors = prior - F @ Z_kept[..., columns]
    unknown = ~picked[:, columns]
    return errors * unknown[:, None, :]


def _remainder(errors: np.ndarray, floor: np.ndarray, left: np.ndarray) -> np.ndarray:
    """Upper values of what revealing the models would add about retired noises, for a
    batch, without factorising a view's covariance.

    Parameters
    ----------
    errors : (B, r, k) array
        ``e``: the filter error's response to each of k unit-variance noises on r peers,
        ``Cov(x, n_j | view)``.
    floor : (B, r) array
        The variances the r peers have just injected (independent of the view and of the
        retired noises): ``Sigma >= diag(floor) = D``.
    left : (B, k) array
        ``s_j = Var(n_j | view) = 1 - (what n_j has told so far)``.

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
    q = np.einsum("brk,br->bk", errors**2, quotient)
    outside = np.abs(errors * ~stepped[:, :, None]).max(axis=1, initial=0.0) > 0
    combined = q * left / np.maximum(q + left, 1e-300)
    return np.where(outside, left, combined)


def _shared_states(
    trace: ViewTrace, mixing: Mixing, *, scales: np.ndarray, decay: float, window: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """What :func:`filtered_coefficients` shares between its views at each step event, once
    for all its batches: ``base`` (P, P), the models' covariance before any reading (every
    noise so far, the step's included), and ``prior`` (P, window P), the models' response to
    the window's noises (the step's slot not yet renewed), both right after the step's decay
    (2 P^3 + window P^3 each, instead of that for each batch)."""
    n = mixing.n_peers
    base, prior = np.zeros((n, n)), np.zeros((n, window * n))
    carry: np.ndarray | None = None
    states: list[tuple[np.ndarray, np.ndarray]] = []
    matrices: dict[bytes, sp.csr_array] = {}
    slot = 0
    for event in trace.events:
        if isinstance(event, np.ndarray):
            if carry is not None:
                base = _left(carry, _left(carry, base).T)  # carry base carry^T
                prior, carry = _left(carry, prior), None
            base[event, :] *= decay
            base[:, event] *= decay
            base[event, event] += scales[event] ** 2
            prior[event] *= decay
            states.append((base.copy(), prior.copy()))
            prior = _new_slot(prior, event, slot, scales)
            slot = (slot + 1) % window
            continue
        key = event[0].tobytes()
        if key not in matrices:
            matrices = {key: mixing.matrix(event[0])}
        carry = matrices[key].toarray() if carry is None else matrices[key] @ carry
    return states


def _new_slot(prior: np.ndarray, peers: np.ndarray, slot: int, scales: np.ndarray) -> np.ndarray:
    """``prior`` (P, window P) with slot ``slot`` holding the step's noises of ``peers`` (a
    copy: the step's shared state stays as it was)."""
    n = prior.shape[0]
    prior = prior.copy()
    prior[:, slot * n : (slot + 1) * n] = 0.0
    prior[peers, slot * n + peers] = -scales[peers]
    return prior


def _left(carry: np.ndarray, X: np.ndarray) -> np.ndarray:
    """``carry @ X`` for a (P, P) matrix and ``X`` (P, C) or a batch (B, P, C): the state moved
    from the last step event to now through the exchanges since, as a dense matrix (BLAS) or
    a sparse one by ``carry``'s density."""
    if np.count_nonzero(carry) > _DENSE_CARRY * carry.size:
        return np.matmul(carry, X)
    sparse = sp.csr_array(carry)
    if X.ndim == 2:
        return sparse @ X
    B, P, C = X.shape
    out = sparse @ X.transpose(1, 0, 2).reshape(P, B * C)
    return np.ascontiguousarray(out.reshape(P, B, C).transpose(1, 0, 2))


def _covariance(base: np.ndarray, F: np.ndarray, R: np.ndarray) -> np.ndarray:
    """The views' covariances ``base - F F^T - R R^T`` (B, P, P) (see
    :func:`filtered_coefficients`)."""
    return base[None] - F @ F.transpose(0, 2, 1) - R @ R.transpose(0, 2, 1)


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


def _margin(kappa: np.ndarray) -> np.ndarray:
    """``kappa`` raised by ``1e-9`` relative plus ``1e-12``: above the rounding of the filter's
    arithmetic (the tests find it within ~1e-14 of the exact values where both are exact)."""
    return kappa * (1.0 + 1e-9) + 1e-12


def _window_innovations(trace: ViewTrace, mixing: Mixing, window: int) -> int:
    """About the most innovations of a view that respond to a noise of the window (the
    columns of ``F`` in :func:`filtered_coefficients`): the readings of ``window + 1``
    step events' exchanges, each of up to the largest in-degree."""
    steps = sum(isinstance(e, np.ndarray) for e in trace.events)
    exchanges = sum(isinstance(e, tuple) for e in trace.events)
    received = int(np.bincount(mixing.receivers, minlength=mixing.n_peers).max(initial=0))
    return (window + 1) * math.ceil(exchanges / max(steps, 1)) * received


def filter_work(trace: ViewTrace, mixing: Mixing, window: int | None = None) -> int:
    """The size :data:`MAX_FILTER_WORK` limits (multiply-adds of :func:`filtered_coefficients`,
    counted without running it), over the ``P`` views: each exchange's reading, ``d`` rows
    (the largest in-degree) against the shared covariance and window responses,
    ``d (window + 1) P^2``; each step event's moves of the gains (at most ``P`` columns of
    old ones, ``R``: a step event's new gains each step so far, and the window's, ``F``) and
    the retirement's error responses, ``P^2 (R + 2 F)``."""
    window = filter_window(trace) if window is None else window
    n = mixing.n_peers
    steps = sum(isinstance(e, np.ndarray) for e in trace.events)
    exchanges = sum(isinstance(e, tuple) for e in trace.events)
    received = int(np.bincount(mixing.receivers, minlength=n).max(initial=0))
    innovations = _window_innovations(trace, mixing, window)
    per_step = math.ceil(exchanges / max(steps, 1)) * received + 1  # new gains a step event
    old = sum(min(n, s * per_step) for s in range(1, steps + 1))
    return n**2 * (exchanges * received * (window + 1) * n + n * old + 2 * steps * innovations * n)


def _certificate(M: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cheap upper values of ``kappa(M)`` for a batch (B, T, T) of PSD matrices: ``sum |M|``,
    and ``T lambda_max`` for ``T <= 30`` (valid for every ``M``, see
    :func:`worst_case_shifts`); and the indices where they exceed the trace (a lower value)
    by over 2% with ``T <= 12``, for the semidefinite program (beyond, its batched barrier
    costs more than the rest of the bound: 100 peers, 20 steps of one exchange, ~50 s)."""
    T = M.shape[-1]
    upper = np.abs(M).sum(axis=(1, 2))
    none = np.zeros(0, dtype=np.int64)
    if T > 30:
        return upper, none
    upper = np.minimum(upper, T * np.maximum(np.linalg.eigvalsh(M)[:, -1], 0.0))
    if T > 12:
        return upper, none
    return upper, np.flatnonzero(upper - np.trace(M, axis1=1, axis2=2) > 2e-2 * upper)


def _row_space(A: np.ndarray) -> np.ndarray:
    """An orthonormal basis of the row space of ``A`` (rows), numerical rank as numpy's.

    A direction whose singular value is below ``max(A.shape) eps s_max`` is taken as unseen:
    at that level floating point cannot tell it from zero (the tests' brute force decides the
    rank of the covariance independently)."""
    if A.size == 0:
        return np.zeros((0, A.shape[1]))
    _, singular, Vt = np.linalg.svd(A, full_matrices=False)
    tolerance = singular.max(initial=0.0) * max(A.shape) * np.finfo(float).eps
    return Vt[singular > tolerance]


#: The last runs' coefficients, by their inputs (:func:`_coefficients`).
_FOUND: dict[bytes, tuple[np.ndarray, float, bool]] = {}


def _coefficients(
    trace: ViewTrace, mixing: Mixing, *, scales: np.ndarray, decay: float
) -> tuple[np.ndarray, float, bool]:
    """``(kappa, gap, exact)``: the dense computation within :data:`MAX_VIEW_ENTRIES`, else the
    filtered bound (``exact`` False). ``kappa`` does not depend on the noise multiplier, so
    cells that differ only in the budget (the same events, overlay, scales and decay) find
    the coefficients of the one before in this process (the last 4 are kept)."""
    digest = hashlib.blake2b(digest_size=20)
    for event in trace.events:
        for part in event if isinstance(event, tuple) else (event,):
            digest.update(np.ascontiguousarray(part).tobytes() + b"|")
    for array in (mixing.indptr, mixing.indices, mixing.weights, np.asarray(scales, float)):
        digest.update(np.ascontiguousarray(array).tobytes() + b"|")
    dense = trace.view_entries() <= MAX_VIEW_ENTRIES
    digest.update(np.float64(decay).tobytes() + (b"dense" if dense else b"filtered"))
    key = digest.digest()
    found = _FOUND.get(key)
    if found is None:
        if dense:
            kappa, gap = view_coefficients(trace, mixing, scales=scales, decay=decay)
            found = (kappa, gap, gap <= 1e-6)
        else:
            kappa = filtered_coefficients(trace, mixing, scales=scales, decay=decay)
            found = (kappa, 0.0, False)
        try:  # threads of one worker may run cells at once: evicting is best effort
            while len(_FOUND) >= 4:
                _FOUND.pop(next(iter(_FOUND)), None)
        except (RuntimeError, StopIteration):
            pass
        _FOUND[key] = found
    kappa, gap, exact = found
    return kappa.copy(), gap, exact


def pairwise_epsilon(
    kappa: np.ndarray, *, sensitivity_over_sigma: float, delta: float
) -> np.ndarray:
    """``(epsilon, delta)`` of every pair: ``mu = (Delta / sigma) sqrt(kappa)``-GDP.

    NaN (not computed) stays NaN; an infinite ``kappa`` (a view that determines the noise-free
    value) is an infinite epsilon, never NaN, so that ``np.nanmax`` cannot skip a total leak.
    """
    kappa = np.asarray(kappa, dtype=float)
    out = np.full(kappa.shape, np.nan)
    out[np.isinf(kappa)] = np.inf
    ok = np.isfinite(kappa)
    mu = sensitivity_over_sigma * np.sqrt(np.maximum(kappa[ok], 0.0))
    out[ok] = gdp_epsilon(mu, delta)
    return out


def by_distance(mixing: Mixing, epsilon: np.ndarray) -> list[dict[str, float]]:
    """Mean and max of ``epsilon[u, v]`` over pairs at each graph distance (hops)."""
    W = mixing.matrix()
    hops = shortest_path(W, unweighted=True, directed=False)
    rows = []
    for distance in np.unique(hops[np.isfinite(hops) & (hops > 0)]):
        values = epsilon[hops == distance]
        rows.append(
            {
                "distance": int(distance),
                "pairs": int(values.size),
                "mean_epsilon": float(values.mean()),
                "max_epsilon": float(values.max()),
            }
        )
    return rows


def not_modelled(protocol: str) -> str:
    """Why the rows of ``protocol``, whose views the model does not describe, have no network DP
    (every protocol but the synchronous step-then-average ones, ``dpsgd`` and ``muffliato``)."""
    return (
        f"not computed: protocol.name = {protocol!r} is not a synchronous step-then-average "
        "protocol (its views are not modelled)"
    )


def not_computed(mechanism: ClippedGaussianSum, *, churn: bool) -> str:
    """Why a run's correlated-noise views (:mod:`p2pdp.protocols.correlated_dp`) are not
    computed ("" when they are computable). The network DP of :func:`report` refuses only
    noiseless steps: it covers Poisson sampling and churn (see the module docstring)."""
    if not mechanism.private:
        return "not computed: privacy.mechanism = 'none' (no noise, no guarantee)"
    if mechanism.sampling == "poisson":
        return (
            "not computed: protocol.sampling = 'poisson' (the view is a mixture of Gaussians, "
            "its exact divergence is not implemented)"
        )
    if churn:
        return "not computed: gossip.churn = true (views under churn are not implemented)"
    return ""


def report(
    trace: ViewTrace,
    mixing: Mixing,
    mechanism: ClippedGaussianSum,
    *,
    scales: np.ndarray,
    decay: float,
    delta: float,
) -> tuple[dict[str, float | str], list[dict[str, float]]]:
    """A run's network DP columns and its per-distance rows.

    Columns ``network_dp_epsilon_mean`` / ``_max`` over ordered pairs ``u != v``,
    ``_max_beyond_neighbours`` over pairs that are not overlay neighbours,
    ``network_dp_method`` (``exact`` / ``bound``, see the module docstring; "" when not
    computed) and ``network_dp_note``: "" when computed, else why not (the epsilon columns
    then NaN and no per-distance rows). The epsilons are at ``delta`` (the rows'
    ``privacy.delta``) for the mechanism's relation and sensitivity (``2 C`` replace-one;
    ``C`` add/remove under Poisson sampling, for every sampling outcome). ``scales``,
    ``decay``: see :func:`view_coefficients`; the trace: the run as it happened (churn, lost
    and late messages included).
    """
    nan = float("nan")
    empty: dict[str, float | str] = {
        "network_dp_epsilon_mean": nan,
        "network_dp_epsilon_max": nan,
        "network_dp_epsilon_max_beyond_neighbours": nan,
        "network_dp_method": "",
    }
    if not mechanism.private:
        reason = "not computed: privacy.mechanism = 'none' (no noise, no guarantee)"
        return {**empty, "network_dp_note": reason}, []
    entries, work = trace.view_entries(), filter_work(trace, mixing)
    if entries <= MAX_VIEW_ENTRIES or work <= MAX_FILTER_WORK:
        kappa, gap, exact = _coefficients(trace, mixing, scales=scales, decay=decay)
    else:
        reason = (
            f"not computed: the views have {entries:,} entries (received messages x noises "
            f"injected), more than the {MAX_VIEW_ENTRIES:,} of an exact computation, and "
            f"the filtered bound's work is {work:,} (filter_work: about peers^3 x (readings x "
            "(window + 1) + gains moved at step events)), "
            f"more than its {MAX_FILTER_WORK:,}"
        )
        return {**empty, "network_dp_note": reason}, []
    epsilon = pairwise_epsilon(
        kappa,
        sensitivity_over_sigma=mechanism.sensitivity
        / (mechanism.noise_multiplier * mechanism.clip_norm),
        delta=delta,
    )
    n = mixing.n_peers
    neighbours = np.eye(n, dtype=bool)
    neighbours[mixing.receivers, mixing.indices] = True
    beyond = epsilon[~neighbours]
    columns: dict[str, float | str] = {
        "network_dp_epsilon_mean": float(np.nanmean(epsilon)),
        "network_dp_epsilon_max": float(np.nanmax(epsilon)),
        "network_dp_epsilon_max_beyond_neighbours": float(beyond.max()) if beyond.size else 0.0,
        "network_dp_method": "exact" if exact else "bound",
        "network_dp_note": "" if gap <= 1e-6 else f"upper bound: semidefinite gap {gap:.1e}",
    }
    return columns, by_distance(mixing, epsilon)
