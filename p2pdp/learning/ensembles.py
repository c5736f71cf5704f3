"""Ensemble rules that use only public information (pure maths, vectorised over peers).

Every peer ``p`` ends a run with

* its own unperturbed local model ``W_own[p]`` (it never leaves the peer),
* the published (noisy) models it received, and for each release the per-coordinate standard
  deviation of its noise, ``noise_std[k]``: a public quantity, since the mechanism, its
  epsilon and the release's L2 sensitivity (group size, smallest shard size, lambda) are all
  part of the published protocol,
* its own shard of training rows.

A rule turns these into one predictor per peer. None of them reads another peer's data, an
unpublished model, or the test rows, so each is post-processing of what the peer already holds:
it costs no privacy budget and changes no guarantee (the releases are already public; a peer's
own data and own model stay with that peer, and the rule's result is used only by that peer).

Rules (:data:`ENSEMBLE_RULES`):

``majority``
    Sign of the vote of all models the peer holds (own included); a tied vote goes to the
    peer's own model. (:mod:`p2pdp.learning.evaluation` breaks ties by the summed margin, which
    hands
    them to the noisiest member.) Reads: received models, own model.
``mean-margin``
    Sign of the sum of all margins (own included), as in :mod:`p2pdp.learning.evaluation`.
``average``
    The received models averaged with inverse-noise-variance weights (the least-variance
    unbiased combination of the releases), then shrunk towards the own model by a James-Stein
    factor computed from that average's public noise variance, trusting the average only where
    it stands out of its noise by a 4-sigma test: a fixed rule, no tuning. Reads: received
    models, their noise scales, own model.
``local-validated``
    The peer mixes its own model with the received average; which mix (the ``average`` rule's,
    the own model alone, or the plain James-Stein one) is chosen by k-fold cross validation on
    its own shard (its own model refitted on each training part, batched). Reads: received
    models, noise scales, own shard (and the own model refitted on it).

Measured but not registered: :func:`personalised_refit_rule`, the peer re-solves its own
problem with the regulariser centred on ``c`` times the received average instead of 0, ``c``
chosen by the same k-fold cross validation. On Spambase (10 folds) it was best where one good
release or many moderate ones arrive (epsilon = 10, g = 10, vector Laplace: 0.120 against
0.126 for ``local-validated``) but broke the never-hurts bound in noisy cells (up to 0.007
above the own model) and cost 8.4 s per run against 0.04 s.

Outputs: a :class:`LinearPredictors` (effective linear weights, (P, d)) for the rules that
produce one linear model per peer, a :class:`VotePredictors` (decision scores) for the votes.
Both have ``scores(X) -> (n_rows, P)``; the label is +1 where the score is >= 0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from p2pdp.core.errors import ConfigError
from p2pdp.core.parallel import one_blas_thread
from p2pdp.learning.models import fit_local_models

if TYPE_CHECKING:  # scipy and scikit-learn are imported where used, not to validate a config
    import scipy.sparse as sp

__all__ = [
    "ENSEMBLE_RULES",
    "CrossValidation",
    "HeldModels",
    "LinearPredictors",
    "OwnShards",
    "PublicView",
    "VotePredictors",
    "apply_rule",
    "average_rule",
    "cross_validate_own_models",
    "fit_towards",
    "local_validated_rule",
    "majority_rule",
    "mean_margin_rule",
    "personalised_refit_rule",
    "received_average",
    "shrinkage_weights",
]

#: Threshold of the ``average`` rule's shrinkage test, in standard deviations of the squared
#: norm of pure noise, and its cap on the noise the mix may carry, as a fraction of the own
#: model's norm (see :func:`shrinkage_weights`).
DEFAULT_KAPPA = 2.0
DEFAULT_NOISE_CAP = 0.2
#: Candidates of ``local-validated`` besides the own model, as ``(kappa, noise_cap)`` pairs;
#: the first (the ``average`` rule) is the default a peer keeps unless its own shard says
#: otherwise.
VALIDATED_CANDIDATES: tuple[tuple[float, float], ...] = (
    (DEFAULT_KAPPA, DEFAULT_NOISE_CAP),
    (0.0, 0.3),
)
#: Centre scales ``c`` of ``personalised-refit`` (regulariser centred on ``c`` times the average).
CENTRE_GRID: np.ndarray = np.array([0.0, 0.25, 0.5, 0.75, 1.0])
DEFAULT_FOLDS = 5


# -- inputs -----------------------------------------------------------------------------------
class HeldModels(Protocol):
    """Who holds which model, as :meth:`PublicView.from_ensembles` reads it: a
    :class:`p2pdp.learning.rules.Ensembles` is one (the rules module imports this module,
    which does not import it back)."""

    @property
    def local_weights(self) -> np.ndarray: ...

    @property
    def published(self) -> np.ndarray: ...

    @property
    def shared(self) -> np.ndarray: ...

    @property
    def receipts(self) -> sp.csr_matrix: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class PublicView:
    """Everything an ensemble rule may read about releases, plus each peer's own model.

    Attributes
    ----------
    own_weights : (P, d) float array
        Each peer's own unperturbed model (used by that peer only).
    published : (K, d) float array
        Every published (noisy) model, in publication order.
    noise_std : (K,) float array, >= 0
        Public per-coordinate standard deviation of each release's noise
        (``Mechanism.noise_std(sensitivity, d)`` at that release's sensitivity).
    shared : (K,) bool array
        True where the model reached every peer.
    receipts : (P, K) scipy.sparse CSR of 0/1
        The models received by specific peers (rows of ``shared`` models not stored), as in
        :class:`p2pdp.learning.rules.Ensembles`.
    """

    own_weights: np.ndarray
    published: np.ndarray
    noise_std: np.ndarray
    shared: np.ndarray
    receipts: sp.csr_matrix

    def __post_init__(self) -> None:
        import scipy.sparse as sp

        own = np.asarray(self.own_weights, dtype=np.float64)
        if own.ndim != 2 or own.shape[0] == 0:
            raise ConfigError(f"own_weights must be a non-empty (P, d) array, got {own.shape}")
        n_peers, dim = own.shape
        published = np.asarray(self.published, dtype=np.float64).reshape(-1, dim)
        n_models = published.shape[0]
        noise_std = np.asarray(self.noise_std, dtype=np.float64).reshape(-1)
        if noise_std.shape != (n_models,) or np.any(~(noise_std >= 0)):
            raise ConfigError(
                f"noise_std must be ({n_models},) values >= 0, got {np.asarray(self.noise_std)!r}"
            )
        shared = np.asarray(self.shared, dtype=bool).reshape(-1)
        if shared.shape != (n_models,):
            raise ConfigError(f"shared must have shape ({n_models},), got {shared.shape}")
        receipts = sp.csr_matrix(self.receipts, dtype=np.float64)
        if receipts.shape != (n_peers, n_models):
            raise ConfigError(
                f"receipts must have shape ({n_peers}, {n_models}), got {receipts.shape}"
            )
        if receipts.nnz and not np.all(receipts.data == 1.0):
            raise ConfigError("receipts must hold only 0/1 entries")
        for name, value in (
            ("own_weights", own),
            ("published", published),
            ("noise_std", noise_std),
            ("shared", shared),
            ("receipts", receipts),
        ):
            object.__setattr__(self, name, value)

    @classmethod
    def from_ensembles(cls, ensembles: HeldModels, noise_std: np.ndarray) -> PublicView:
        """From a :class:`p2pdp.learning.rules.Ensembles` (read by attribute) plus noise
        scales."""
        return cls(
            own_weights=ensembles.local_weights,
            published=ensembles.published,
            noise_std=noise_std,
            shared=ensembles.shared,
            receipts=ensembles.receipts,
        )

    @property
    def n_peers(self) -> int:
        return int(self.own_weights.shape[0])

    def received_counts(self) -> np.ndarray:
        """Number of published models each peer received, (P,) int."""
        extra = np.asarray(self.receipts.sum(axis=1)).ravel()
        return (int(self.shared.sum()) + extra).astype(np.int64)

    def per_peer_sum(self, values: np.ndarray) -> np.ndarray:
        """``sum over the models peer p received of values[k]``: (K,) -> (P,), (K, m) -> (P, m)."""
        values = np.asarray(values, dtype=np.float64)
        common = self.shared.astype(np.float64) @ values
        return common[None, ...] + self.receipts @ values


@dataclass(frozen=True, slots=True, kw_only=True)
class OwnShards:
    """The peers' own training rows (each peer reads only its own shard).

    ``X`` (N, d) rows with L2 norm <= 1, ``y`` (N,) labels in {-1, +1}, ``shards`` P integer
    index arrays into ``X``, ``lam`` the regularisation of the local models.
    """

    X: np.ndarray
    y: np.ndarray
    shards: tuple[np.ndarray, ...]
    lam: float

    def __post_init__(self) -> None:
        if not (np.isfinite(self.lam) and self.lam > 0):
            raise ConfigError(f"lam must be > 0 and finite, got {self.lam!r}")
        object.__setattr__(
            self, "shards", tuple(np.asarray(s, dtype=np.int64) for s in self.shards)
        )


# -- outputs ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class LinearPredictors:
    """One linear model per peer: ``weights`` (P, d); scores ``X @ weights.T`` (n, P)."""

    weights: np.ndarray

    def scores(self, X: np.ndarray) -> np.ndarray:
        return np.asarray(X) @ self.weights.T


@dataclass(frozen=True, slots=True, kw_only=True)
class VotePredictors:
    """Vote of every model a peer holds, computed from shared work (one product per model).

    ``vote`` is ``"majority"`` (score = sum of signs + tanh(own margin)/2, so a tied vote goes to
    the own model) or ``"mean-margin"`` (score = sum of margins).
    """

    view: PublicView
    vote: str

    def scores(self, X: np.ndarray) -> np.ndarray:
        rows_t = np.ascontiguousarray(np.asarray(X).T)
        own = self.view.own_weights @ rows_t  # (P, n)
        published = self.view.published @ rows_t  # (K, n)
        if self.vote == "mean-margin":
            return (own + self.view.per_peer_sum(published)).T
        votes = np.sign(own) + self.view.per_peer_sum(np.sign(published))
        return (votes + 0.5 * np.tanh(own)).T


# -- building blocks --------------------------------------------------------------------------
def received_average(view: PublicView) -> tuple[np.ndarray, np.ndarray]:
    """Inverse-noise-variance weighted average of the models each peer received.

    Weights ``1 / noise_std[k]^2``: for independent noises this is the unbiased combination of
    least variance. Noise-free releases (``noise_std = 0``, the test-only ``none`` mechanism)
    take all the weight when a peer received any.

    Returns
    -------
    average : (P, d) array
        Row ``p``: the average over the models peer ``p`` received (zeros if none).
    noise_variance : (P,) array
        Per-coordinate variance of that average's noise, ``1 / sum_k 1/noise_std[k]^2``
        (``inf`` if the peer received nothing, 0 if it received a noise-free release).
    """
    std = view.noise_std
    exact = std == 0
    precision = np.where(exact, 0.0, 1.0 / np.where(exact, 1.0, std) ** 2)
    totals = view.per_peer_sum(precision)
    numerator = view.per_peer_sum(precision[:, None] * view.published)
    variance = np.full(view.n_peers, np.inf)
    average = np.zeros_like(view.own_weights)
    has = totals > 0
    average[has] = numerator[has] / totals[has, None]
    variance[has] = 1.0 / totals[has]
    if exact.any():
        n_exact = view.per_peer_sum(exact.astype(np.float64))
        exact_mean = view.per_peer_sum(exact[:, None] * view.published)
        hit = n_exact > 0
        average[hit] = exact_mean[hit] / n_exact[hit, None]
        variance[hit] = 0.0
    return average, variance


def shrinkage_weights(
    view: PublicView, kappa: float = DEFAULT_KAPPA, noise_cap: float = DEFAULT_NOISE_CAP
) -> tuple[np.ndarray, np.ndarray]:
    """Trust ``beta`` in the received average, from its public noise variance.

    With ``A`` the peer's :func:`received_average`, ``s2`` its per-coordinate noise variance
    and ``D = A - W_own``: if ``A`` were pure noise around ``W_own``, ``||D||^2`` would be about
    ``d s2`` with standard deviation about ``sqrt(2 d) s2``. The weight on ``A`` is::

        beta = min(1 - min(1, (d - 2 + kappa sqrt(2 d)) s2 / ||D||^2),
                   noise_cap * ||W_own|| / sqrt(d s2))

    The first term with ``kappa = 0`` is the positive-part James-Stein estimator (Stein 1961;
    Baranchik 1964): the MSE-optimal shrink of ``A`` towards ``W_own``. But the MSE of a weight
    vector is not the error of its sign: when the noise is 20-70 times a model's norm, the
    residual noise ``beta * noise`` still decides the sign, and the one draw of ``||noise||^2``
    that every peer shares (full publication) decides for all of them. Hence ``kappa > 0``
    (trust ``A`` only where ``||D||^2`` exceeds the noise level by ``kappa`` of its standard
    deviations) and the cap, which keeps the expected norm of the noise carried into the mix,
    ``beta sqrt(d s2)``, below ``noise_cap`` times the own model's norm (so the noise can turn
    the own model by at most about ``atan(noise_cap)``). Measured on Spambase (P = 100,
    10 folds): ``kappa = 0`` without cap costs up to 0.1 in error at epsilon = 0.1;
    ``(kappa, noise_cap) = (2, 0.2)`` stayed within 0.002 of the own model in every noisy cell
    and reaches the centralised level where the noise is small.

    Parameters
    ----------
    view : PublicView
    kappa : float, >= 0
    noise_cap : float, > 0 (``inf`` for no cap)

    Returns
    -------
    average : (P, d) array
        :func:`received_average`.
    beta : (P,) array in [0, 1]
        0 where the peer received nothing; 1 where the average is noise-free.
    """
    if not (np.isfinite(kappa) and kappa >= 0):
        raise ConfigError(f"kappa must be >= 0 and finite, got {kappa!r}")
    if not noise_cap > 0:
        raise ConfigError(f"noise_cap must be > 0, got {noise_cap!r}")
    average, variance = received_average(view)
    own_weights = view.own_weights
    dim = own_weights.shape[1]
    diff = average - own_weights
    sq = np.einsum("ij,ij->i", diff, diff)
    threshold = (max(dim - 2, 0) + kappa * np.sqrt(2.0 * dim)) * variance
    with np.errstate(divide="ignore", invalid="ignore"):
        shrink = np.where(sq > 0, threshold / sq, 1.0)
        cap = noise_cap * np.linalg.norm(own_weights, axis=1) / np.sqrt(dim * variance)
    shrink = np.clip(np.nan_to_num(shrink, nan=1.0, posinf=1.0), 0.0, 1.0)
    beta = np.minimum(1.0 - shrink, np.nan_to_num(cap, nan=0.0, posinf=1.0))
    beta = np.where(variance == 0, 1.0, beta)  # noise-free average: take it
    beta[view.received_counts() == 0] = 0.0
    return average, beta


@dataclass(frozen=True, slots=True, kw_only=True)
class CrossValidation:
    """k-fold refits of every peer's own model on its own shard (reusable across runs).

    Held-out rows are listed peer by peer: ``rows`` (M,) index into ``X``, ``peer`` (M,) their
    owner, ``fold`` (M,) their fold, ``own_margin`` (M,) the margin of the owner's model
    refitted without that fold. ``models`` (P, k, d) holds the refits (zeros where a peer has
    fewer than k folds). Depends only on the shards, lambda, k and ``rng``, not on any release,
    so one computation serves every run of a fold (like the local training).
    """

    rows: np.ndarray
    peer: np.ndarray
    fold: np.ndarray
    own_margin: np.ndarray
    models: np.ndarray
    n_folds: int

    def indicator(self, n_peers: int) -> sp.csr_matrix:
        """(M, P) 0/1 matrix: held-out row ``i`` belongs to peer ``peer[i]``."""
        import scipy.sparse as sp

        m = len(self.rows)
        return sp.csr_matrix((np.ones(m), (np.arange(m), self.peer)), shape=(m, n_peers))


def _fold_assignment(
    shards: Sequence[np.ndarray], y: np.ndarray, n_folds: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rows, owners, stratified fold numbers and folds per peer, sorted by (peer, fold).

    Within each shard, rows are ordered by label then at random and dealt round robin into
    ``min(n_folds, n_p)`` folds, so every fold of a peer has both labels where it can.
    """
    sizes = np.array([len(s) for s in shards], dtype=np.int64)
    rows = np.concatenate(shards) if len(shards) else np.zeros(0, np.int64)
    peer = np.repeat(np.arange(len(shards)), sizes)
    order = np.lexsort((rng.random(len(rows)), y[rows], peer))
    rows, peer = rows[order], peer[order]
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    folds_per_peer = np.minimum(n_folds, sizes)
    fold = (np.arange(len(rows)) - starts[peer]) % folds_per_peer[peer]
    order = np.lexsort((fold, peer))
    return rows[order], peer[order], fold[order], folds_per_peer


def cross_validate_own_models(
    own: OwnShards, *, n_folds: int = DEFAULT_FOLDS, rng: np.random.Generator
) -> CrossValidation:
    """Refit every peer's own model on each k-fold training part of its own shard (batched).

    One :func:`p2pdp.learning.models.fit_local_models` call fits all ``P * k`` training parts (peers
    with fewer than 2 rows are skipped: they have nothing to validate on). Reads only each
    peer's own rows; its result stays with the peer.

    Parameters
    ----------
    own : OwnShards
    n_folds : int, >= 2
    rng : numpy.random.Generator
        Shuffles rows within each shard before the stratified deal into folds.
    """
    if not (isinstance(n_folds, (int, np.integer)) and n_folds >= 2):
        raise ConfigError(f"n_folds must be an integer >= 2, got {n_folds!r}")
    X, y = np.asarray(own.X, dtype=np.float64), np.asarray(own.y)
    rows, peer, fold, folds_per_peer = _fold_assignment(own.shards, y, n_folds, rng)
    n_peers, dim = len(own.shards), X.shape[1]
    usable = folds_per_peer >= 2
    held = usable[peer]
    rows, peer, fold = rows[held], peer[held], fold[held]
    # training part (p, f) = the peer's rows outside fold f; rows are sorted by (peer, fold)
    parts: list[np.ndarray] = []
    owners: list[tuple[int, int]] = []
    for f in range(n_folds):
        keep = fold != f
        peers_with_f = np.flatnonzero(usable & (folds_per_peer > f))
        if peers_with_f.size == 0:
            continue
        train_rows, train_peer = rows[keep], peer[keep]
        bounds = np.searchsorted(train_peer, np.arange(n_peers + 1))
        pieces = np.split(train_rows, bounds[1:-1])
        parts.extend(pieces[p] for p in peers_with_f.tolist())
        owners.extend((p, f) for p in peers_with_f.tolist())
    models = np.zeros((n_peers, n_folds, dim))
    if parts:
        fitted = fit_local_models(X, y, parts, own.lam)
        index = np.array(owners, dtype=np.int64)
        models[index[:, 0], index[:, 1]] = fitted.weights
    own_margin = np.einsum("ij,ij->i", X[rows], models[peer, fold])
    return CrossValidation(
        rows=rows, peer=peer, fold=fold, own_margin=own_margin, models=models, n_folds=n_folds
    )


def _choose_per_peer(errors: np.ndarray, margin: int) -> np.ndarray:
    """Index per peer (column) of the chosen candidate (row); row 0 is the default.

    ``errors`` (G, P) held-out error counts. A peer leaves its default only for a candidate
    with at least ``margin + 1`` fewer errors; among the best it takes the first listed.
    """
    best = errors.min(axis=0)
    first_best = np.argmax(errors == best[None, :], axis=0)
    return np.where(errors[0] - best > margin, first_best, 0)


def _held_out_errors(
    view: PublicView, own: OwnShards, cv: CrossValidation, own_part: np.ndarray, betas: np.ndarray
) -> np.ndarray:
    """Held-out error counts (G, P) of ``(1 - beta) W_own^(-f) + beta A`` per candidate.

    ``own_part`` (M,): margins of the refitted own models on the held-out rows; ``betas``
    (P, G): each peer's candidate weights on its received average.
    """
    average, _ = received_average(view)
    avg_part = np.einsum("ij,ij->i", np.asarray(own.X)[cv.rows], average[cv.peer])
    b = betas[cv.peer]  # (M, G)
    scores = (1.0 - b) * own_part[:, None] + b * avg_part[:, None]
    wrong = (np.where(scores >= 0, 1, -1) != np.asarray(own.y)[cv.rows][:, None]).astype(float)
    return np.rint(np.asarray(wrong.T @ cv.indicator(view.n_peers))).astype(np.int64)


# -- rules ------------------------------------------------------------------------------------
def majority_rule(view: PublicView, own: OwnShards | None = None, **_: object) -> VotePredictors:
    """Majority of the signs of all models the peer holds; a tie goes to the own model.

    Reads: the received models and the own model. Costs no privacy: post-processing of
    releases plus the peer's own model, used by that peer only.
    """
    return VotePredictors(view=view, vote="majority")


def mean_margin_rule(view: PublicView, own: OwnShards | None = None, **_: object) -> VotePredictors:
    """Sign of the summed margins of all models the peer holds (as
    :mod:`p2pdp.learning.evaluation`).

    Reads and privacy as :func:`majority_rule`.
    """
    return VotePredictors(view=view, vote="mean-margin")


def average_rule(
    view: PublicView,
    own: OwnShards | None = None,
    *,
    kappa: float = DEFAULT_KAPPA,
    noise_cap: float = DEFAULT_NOISE_CAP,
    **_: object,
) -> LinearPredictors:
    """Inverse-variance average of the received models, shrunk towards the own model.

    The peer uses ``(1 - beta) W_own + beta A``: ``A`` its :func:`received_average` (weights
    ``1 / noise_std^2``), ``beta`` from :func:`shrinkage_weights` (James-Stein with a
    ``kappa``-sigma test against pure noise and a cap on the noise carried into the mix). A
    fixed rule, no tuning: when the average is mostly noise the peer keeps its own model, when
    the noise is small it takes the average.

    Reads: received models, their public noise scales, the own model. Costs no privacy
    (post-processing of releases plus the peer's own model; the result stays with the peer).
    """
    average, beta = shrinkage_weights(view, kappa, noise_cap)
    weights = (1.0 - beta)[:, None] * view.own_weights + beta[:, None] * average
    return LinearPredictors(weights=weights)


def local_validated_rule(
    view: PublicView,
    own: OwnShards,
    *,
    rng: np.random.Generator | None = None,
    cv: CrossValidation | None = None,
    n_folds: int = DEFAULT_FOLDS,
    candidates: Sequence[tuple[float, float]] = VALIDATED_CANDIDATES,
    margin: int = 1,
) -> LinearPredictors:
    """Own model mixed with the received average, the mix validated on the peer's own shard.

    Candidates ``(1 - beta) W_own + beta A`` with ``beta`` from :func:`shrinkage_weights` at
    each ``(kappa, noise_cap)`` of ``candidates`` plus ``beta = 0`` (the own model alone); the
    first candidate (the ``average`` rule) is the default. Each peer counts each candidate's
    errors by k-fold cross validation on its own shard, its own model refitted without the
    held-out fold (:func:`cross_validate_own_models`, batched; pass ``cv`` to share it between
    runs of a fold), and leaves the default only for a candidate with at least ``margin + 1``
    fewer errors (the own model before the other candidates on ties). The default
    ``margin = 1`` asks for 2 fewer errors, about one standard deviation of a paired
    difference on 40 rows: with ``margin = 0`` peers left a good default for their own model
    by luck and lost 0.001-0.002 in the Gaussian cells where the average is good. One (M, G)
    error matrix for all peers: no per-peer loop.

    The candidates already follow the public noise (they reduce to the own model when the
    average is noise), so a wrong choice on a 40-row shard costs little; the validation
    adds trust where the own shard shows the average is better than the noise test allows.
    ``A`` contains the peer's own model (with weight ``1/g`` in each release it joined, under
    noise), so the held-out rows are not entirely unseen by ``A``: a small optimism in favour
    of the average, largest for small groups.

    Reads: received models, public noise scales, the own model and own shard. Costs no
    privacy: post-processing of releases plus the peer's own data; the result stays with it.
    """
    if cv is None:
        if rng is None:
            raise ConfigError("local-validated needs rng (or a precomputed cv)")
        cv = cross_validate_own_models(own, n_folds=n_folds, rng=rng)
    candidates = tuple(candidates)
    if not candidates:
        raise ConfigError("candidates must list at least one (kappa, noise_cap), got ()")
    trusts = [shrinkage_weights(view, kappa, cap)[1] for kappa, cap in candidates]
    average = received_average(view)[0]
    zero = np.zeros(view.n_peers)
    betas = np.stack([trusts[0], zero, *trusts[1:]], axis=1)  # (P, G)
    errors = _held_out_errors(view, own, cv, cv.own_margin, betas)
    choice = _choose_per_peer(errors, margin)
    beta = betas[np.arange(view.n_peers), choice]
    weights = (1.0 - beta)[:, None] * view.own_weights + beta[:, None] * average
    return LinearPredictors(weights=weights)


def fit_towards(
    X: np.ndarray,
    y: np.ndarray,
    shards: Sequence[np.ndarray],
    lam: float,
    centres: np.ndarray,
    *,
    tol: float = 1e-8,
    max_iter: int = 50,
) -> np.ndarray:
    """Minimise ``(1/n_j) sum log(1 + exp(-y x.w)) + (lam/2) ||w - centres[j]||^2`` per shard.

    Batched damped Newton over shards of equal size (as
    :func:`p2pdp.learning.models.fit_local_models`,
    which is the case ``centres = 0``). Not used for any release, so no privacy tolerance is
    needed: ``tol`` bounds the gradient norm.

    Returns
    -------
    (P, d) array of minimisers.
    """
    from scipy.special import expit, log_expit

    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    centres = np.asarray(centres, dtype=np.float64)
    sizes = np.array([len(s) for s in shards], dtype=np.int64)
    dim = X.shape[1]
    result = np.empty((len(shards), dim))
    eye = lam * np.eye(dim)
    order = np.argsort(sizes, kind="stable")
    with one_blas_thread():
        for group in np.split(order, np.flatnonzero(np.diff(sizes[order])) + 1):
            if group.size == 0:
                continue
            rows = np.stack([np.asarray(shards[j]) for j in group])
            Xb, yb, mb = X[rows], y[rows], centres[group]
            n = rows.shape[1]
            offset = np.einsum("bnd,bd->bn", Xb, mb)
            u = np.zeros((len(group), dim))

            def objective(uu: np.ndarray, Xb=Xb, yb=yb, offset=offset) -> np.ndarray:
                m = yb * (offset + np.einsum("bnd,bd->bn", Xb, uu))
                return -log_expit(m).mean(axis=1) + 0.5 * lam * np.einsum("bd,bd->b", uu, uu)

            values = objective(u)
            for _ in range(max_iter):
                margins = yb * (offset + np.einsum("bnd,bd->bn", Xb, u))
                coef = -yb * expit(-margins) / n
                grad = np.einsum("bn,bnd->bd", coef, Xb) + lam * u
                if np.linalg.norm(grad, axis=1).max() <= tol:
                    break
                curvature = expit(margins) * expit(-margins) / n
                hessian = np.einsum("bnd,bn,bne->bde", Xb, curvature, Xb) + eye
                step = -np.linalg.solve(hessian, grad[:, :, None])[:, :, 0]
                slope = np.einsum("bd,bd->b", grad, step)
                length = np.ones(len(group))
                for _ in range(60):
                    trial = objective(u + length[:, None] * step)
                    bad = trial > values + 1e-4 * length * slope + 1e-14 * np.abs(values)
                    if not bad.any():
                        break
                    length[bad] *= 0.5
                u = u + length[:, None] * step
                values = objective(u)
            result[group] = mb + u
    return result


def personalised_refit_rule(
    view: PublicView,
    own: OwnShards,
    *,
    rng: np.random.Generator | None = None,
    cv: CrossValidation | None = None,
    n_folds: int = DEFAULT_FOLDS,
    grid: np.ndarray = CENTRE_GRID,
    margin: int = 0,
) -> LinearPredictors:
    """Each peer re-solves its own problem regularised towards ``c`` times its received average.

    ``w_p = argmin (1/n_p) sum_{own rows} loss + (lam/2) ||w - c_p A_p||^2``; ``c_p`` in ``grid``
    (0 = the own model) chosen by k-fold cross validation on the peer's own shard, with the
    same folds, tie rule and ``margin`` as :func:`local_validated_rule`. Costs
    ``len(grid) * (k + 1)`` batched refits per run.

    Reads: received models, the own shard. Costs no privacy (post-processing; the refitted
    model stays with the peer).
    """
    if cv is None:
        if rng is None:
            raise ConfigError("personalised-refit needs rng (or a precomputed cv)")
        cv = cross_validate_own_models(own, n_folds=n_folds, rng=rng)
    X, y = np.asarray(own.X, dtype=np.float64), np.asarray(own.y)
    average, _ = received_average(view)
    n_peers = view.n_peers
    grid = np.asarray(grid, dtype=np.float64)
    # training parts, in the same (peer, fold) layout as cv
    parts, owners = [], []
    for f in range(cv.n_folds):
        held = cv.fold == f
        peers_f = np.unique(cv.peer[held])
        for p in peers_f.tolist():  # list building only; the fits below are batched
            mine = cv.peer == p
            parts.append(cv.rows[mine & (cv.fold != f)])
            owners.append((p, f))
    owners_arr = np.array(owners, dtype=np.int64).reshape(-1, 2)
    errors = np.zeros((len(grid), n_peers))
    indicator = cv.indicator(n_peers)
    for g, c in enumerate(grid):
        if c == 0:
            margins = cv.own_margin
        else:
            models = np.zeros((n_peers, cv.n_folds, X.shape[1]))
            fitted = fit_towards(X, y, parts, own.lam, c * average[owners_arr[:, 0]])
            models[owners_arr[:, 0], owners_arr[:, 1]] = fitted
            margins = np.einsum("ij,ij->i", X[cv.rows], models[cv.peer, cv.fold])
        wrong = (np.where(margins >= 0, 1, -1) != y[cv.rows]).astype(np.float64)
        errors[g] = wrong @ indicator
    choice = _choose_per_peer(np.rint(errors).astype(np.int64), margin)
    centre_scale = np.where(view.received_counts() == 0, 0.0, grid[choice])
    weights = view.own_weights.copy()
    moved = centre_scale > 0
    if moved.any():
        idx = np.flatnonzero(moved)
        weights[idx] = fit_towards(
            X,
            y,
            [own.shards[p] for p in idx.tolist()],
            own.lam,
            centre_scale[idx, None] * average[idx],
        )
    return LinearPredictors(weights=weights)


RuleFunction = Callable[..., LinearPredictors | VotePredictors]

#: Built-in rules by name; each is ``rule(view, own, *, rng=..., cv=...) -> predictors``.
ENSEMBLE_RULES: dict[str, RuleFunction] = {
    "majority": majority_rule,
    "mean-margin": mean_margin_rule,
    "average": average_rule,
    "local-validated": local_validated_rule,
}


def apply_rule(
    name: str,
    view: PublicView,
    own: OwnShards | None = None,
    *,
    rng: np.random.Generator | None = None,
    cv: CrossValidation | None = None,
) -> LinearPredictors | VotePredictors:
    """Run the rule ``name`` of :data:`ENSEMBLE_RULES`."""
    if name not in ENSEMBLE_RULES:
        raise ConfigError(
            f"evaluation.vote must be one of {', '.join(ENSEMBLE_RULES)}; got {name!r}"
        )
    if name == "local-validated":
        if own is None:
            raise ConfigError(f"rule {name!r} needs the peers' own shards")
        return ENSEMBLE_RULES[name](view, own, rng=rng, cv=cv)
    return ENSEMBLE_RULES[name](view, own)
