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
:func:`~p2pdp.protocols.network_dp_filter.filtered_coefficients`: a Kalman filter over the
``P`` models per view (its whitened innovations are an orthonormal basis of the view, so
``M`` is a sum of their responses), exact for the noises of the last
:func:`~p2pdp.protocols.network_dp_filter.filter_window` step events and, for older ones, the
information they can still add bounded by what revealing the models at their retirement would
give (a superset of the view: monotonicity), itself bounded with a covariance floor that is
the same for every view (the fresh noise of the step, plus what the retired noise explains:
no factorisation per view; the view's own solve only where that floor is loose, with few
exchanges a step); Minkowski's inequality then gives
``kappa <= (sqrt(kappa(M_window)) + sum_t sqrt(r_t))^2``, capped by ``T_u``. A view's
covariance is never formed: it is the prior covariance (shared by the views) minus the outer
products of its gains. The views are independent given what they share: their batches run
in the run's local worker processes. Cost (:func:`filter_work`): about ``P^3`` x (readings x
(window + 1) + the gains moved at each step event, at most ``P``; + each retirement's solve
with fewer than 5 exchanges a step), limited by :data:`MAX_FILTER_WORK` (1,000 peers of
degree 10 with 20 rounds of 5 exchanges: yes; with 30 rounds, or one exchange a step: no),
and its memory (:func:`filter_bytes`, the states the views share) by
:data:`MAX_FILTER_BYTES`. On a periodic run
(every round alike, every message delivered) the filter stops once the views' covariances
settle and bounds a larger view whose later rounds are copies of the settled one
(:class:`~p2pdp.protocols.network_dp_steady._Steady`: the proof): 100 peers, 100 rounds, in
1.0 s of CPU (Muffliato) and 3.3 s (D-PSGD) instead of 15 and 13 s.

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

import numpy as np
from scipy.sparse.csgraph import shortest_path

from p2pdp.privacy.clipped_gaussian import ClippedGaussianSum
from p2pdp.privacy.gdp import gdp_epsilon
from p2pdp.protocols.mixing import Mixing
from p2pdp.protocols.network_dp_filter import filter_bytes, filter_work, filtered_coefficients
from p2pdp.protocols.views import ViewTrace, _row_space, worst_case_shifts

#: Largest computation: the sum over peers ``v`` of (rows of ``v``'s view) x (noises injected
#: in the run), i.e. the entries of all views' matrices ``A`` (8 bytes each).
MAX_VIEW_ENTRIES = 10_000_000

#: Largest :func:`filter_work` of the filtered bound (views larger than
#: :data:`MAX_VIEW_ENTRIES` take it). On a shared 2-core machine (load 10-16, one BLAS
#: thread), 10-regular overlays, 5 exchanges a round: 100 peers with 20 rounds are 1.1e10
#: (about 3 s of CPU), with 100 rounds 5.5e10 (16 s); 200 peers with 20 rounds 1e11 (22 s),
#: 500 peers 2.1e12 (about 210 s); 1,000 peers with 20 rounds 2e13 (about 370 s of CPU in
#: each of 2 processes, 740 s in all: under 10 min on 2 cores). 30 rounds (3.4e13), 1,500
#: peers (6.7e13) and one exchange a step at 1,000 peers (4.9e13, its solves counted) are
#: left empty, with the reason. Those costs filter every round; a periodic run stops once its
#: covariances settle (the limits still count every round).
MAX_FILTER_WORK = 25_000_000_000_000

#: Largest :func:`filter_bytes` of the filtered bound: the states its views share (held by
#: every process computing it) and one batch's. 1,000 peers with 20 rounds of 5 exchanges hold
#: 0.72 GB; 100 peers with 100 rounds 0.26 GB.
MAX_FILTER_BYTES = 1_500_000_000


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
    The pairs are converted together (:func:`~p2pdp.privacy.gdp.gdp_epsilon`, one vectorised
    root-finding, each epsilon an upper bound on its pair's exact one).
    """
    kappa = np.asarray(kappa, dtype=float)
    out = np.full(kappa.shape, np.nan)
    out[np.isinf(kappa)] = np.inf
    ok = np.isfinite(kappa)
    out[ok] = gdp_epsilon(sensitivity_over_sigma * np.sqrt(np.maximum(kappa[ok], 0.0)), delta)
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
    memory = filter_bytes(trace, mixing)
    if entries <= MAX_VIEW_ENTRIES or (work <= MAX_FILTER_WORK and memory <= MAX_FILTER_BYTES):
        kappa, gap, exact = _coefficients(trace, mixing, scales=scales, decay=decay)
    else:
        reason = (
            f"not computed: the views have {entries:,} entries (received messages x noises "
            f"injected), more than the {MAX_VIEW_ENTRIES:,} of an exact computation, and "
            + (
                f"the filtered bound's work is {work:,} (filter_work: about peers^3 x "
                "(readings x (window + 1) + gains moved at step events)), "
                f"more than its {MAX_FILTER_WORK:,}"
                if work > MAX_FILTER_WORK
                else f"the filtered bound's memory is {memory:,} bytes (filter_bytes: peers^2 "
                f"x (window + 1) floats a step event), more than its {MAX_FILTER_BYTES:,}"
            )
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
