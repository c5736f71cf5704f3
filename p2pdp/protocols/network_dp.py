"""Pairwise network DP of Muffliato (Cyffers, Even, Bellet & Massoulie 2022).

**What it bounds, and against whom.** Local DP (the protocols' ``epsilon_spent``) bounds what
*any* neighbour learns from a peer's messages. Pairwise network DP bounds what a peer ``v``
learns about a peer ``u``'s data from the messages ``v`` itself receives, when every peer
follows the protocol and ``v`` sees nothing else (no other peer's messages, no collusion).
It is a weaker adversary, so a smaller number: report it beside local DP, never as it.

**The bound used** (the paper's Theorem 1, each observation of an injected noise a Gaussian
mechanism, summed over observations, applied to every injection of the run): every peer
injects noise at every private step (``T`` of them), then the models are averaged ``K``
times per step with the Metropolis-Hastings matrix ``W`` (``K`` = ``protocol.gossip_steps``);
``s`` gossip steps after an injection, ``v`` receives ``(W^s y)_w`` from each neighbour ``w``,
in which ``u``'s contribution moves by ``(W^s)_{wu} Delta`` under noise of variance
``sigma^2 ||W^s e_w||^2``. With ``Delta`` the sensitivity of a step's sum and ``sigma`` its
noise standard deviation, ``u``'s Renyi loss towards ``v`` at order ``alpha`` is at most

``alpha Delta^2 / (2 sigma^2) * min(T, sum_{s=0}^{TK-1} (T - floor(s / K))
sum_{w in N(v)} (W^s)_{uw}^2 / ||W^s e_w||^2)``

(``T - floor(s / K)`` injections are observed ``s`` gossip steps later), where the ``min``
with ``T`` is the local DP bound in Renyi form (a neighbour sees each injection directly;
every other view is post-processing of ``u``'s messages). Converted to ``(epsilon, delta)``
like the ``rdp`` accountant, and reported as the smaller of that and the run's local DP
epsilon (both are valid bounds). We implement the paper's expression; we did not re-derive
it, and the local DP columns are the guarantee p2pdp states. Only for steps without sampling
amplification (``full``, ``fixed``); exact arithmetic on a dense ``W``, so only for overlays
of at most :data:`MAX_PEERS` peers; and only for runs in which every message arrived (no loss,
no late message, no churn: the bound is for the gossip matrix ``W`` applied in full). NaN
otherwise.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.sparse.csgraph import shortest_path

from p2pdp.privacy.clipped_gaussian import ClippedGaussianSum
from p2pdp.protocols.mixing import Mixing

#: Largest overlay whose pairwise network DP is computed (dense (P, P) powers of W).
MAX_PEERS = 500

#: Renyi orders over which the conversion to (epsilon, delta) is minimised.
ORDERS = 1.0 + np.geomspace(1e-2, 1e4, 300)


def pairwise_coefficients(mixing: Mixing, steps: int, gossip_steps: int) -> np.ndarray:
    """``c[u, v]``: the bound above without ``alpha Delta^2 / (2 sigma^2)``, (P, P).

    The diagonal (a peer towards itself) is NaN.
    """
    W = mixing.matrix().toarray()
    n = W.shape[0]
    adjacency = np.zeros((n, n), dtype=bool)
    adjacency[mixing.receivers, mixing.indices] = True  # adjacency[v, w]: w sends to v
    total = np.zeros((n, n))
    power = np.eye(n)
    for s in range(steps * gossip_steps):
        weight = steps - s // gossip_steps
        column_norms = (power**2).sum(axis=0)  # ||W^s e_w||^2
        ratio = power**2 / column_norms[None, :]  # (W^s)_{uw}^2 / ||W^s e_w||^2
        total += weight * (ratio @ adjacency.T.astype(float))  # sum over w in N(v)
        power = power @ W
    total = np.minimum(total, float(steps))
    np.fill_diagonal(total, np.nan)
    return total


def pairwise_epsilon(
    coefficients: np.ndarray, *, sensitivity_over_sigma: float, delta: float
) -> np.ndarray:
    """``(epsilon, delta)`` of every pair from its coefficient, same shape (NaN kept)."""
    flat = coefficients.ravel()
    out = np.full(flat.shape, np.nan)
    ok = np.isfinite(flat)
    rdp = flat[ok, None] * ORDERS[None, :] * sensitivity_over_sigma**2 / 2.0
    conversion = np.log1p(-1.0 / ORDERS) - (math.log(delta) + np.log(ORDERS)) / (ORDERS - 1)
    out[ok] = np.where(flat[ok] > 0, np.maximum((rdp + conversion).min(axis=1), 0.0), 0.0)
    return out.reshape(coefficients.shape)


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


def report(
    mixing: Mixing,
    mechanism: ClippedGaussianSum,
    *,
    steps: int,
    gossip_steps: int,
    delta: float,
    local_epsilon: float,
) -> tuple[dict[str, float], list[dict[str, float]]]:
    """A run's network DP columns and its per-distance rows (nothing where not computed).

    Columns ``network_dp_epsilon_mean`` / ``_max`` over ordered pairs ``u != v`` and
    ``_max_beyond_neighbours`` over pairs that are not overlay neighbours; each pair's value is
    the smaller of the bound and ``local_epsilon`` (both valid). Empty results for noiseless
    or Poisson-sampled steps and for more than :data:`MAX_PEERS` peers.
    """
    n = mixing.n_peers
    if not mechanism.private or mechanism.sampling == "poisson" or n > MAX_PEERS:
        return {}, []
    epsilon = pairwise_epsilon(
        pairwise_coefficients(mixing, steps, gossip_steps),
        sensitivity_over_sigma=mechanism.sensitivity
        / (mechanism.noise_multiplier * mechanism.clip_norm),
        delta=delta,
    )
    epsilon = np.minimum(epsilon, local_epsilon)  # NaN (the diagonal) stays NaN
    neighbours = np.zeros((n, n), dtype=bool)
    neighbours[mixing.receivers, mixing.indices] = True
    beyond = epsilon[~neighbours & np.isfinite(epsilon)]
    columns = {
        "network_dp_epsilon_mean": float(np.nanmean(epsilon)),
        "network_dp_epsilon_max": float(np.nanmax(epsilon)),
        "network_dp_epsilon_max_beyond_neighbours": float(beyond.max()) if beyond.size else 0.0,
    }
    return columns, by_distance(mixing, epsilon)
