"""The core workload: local logistic models averaged with noise, voted by peers.

Each peer trains an exact L2-regularised logistic regression on its own shard (the
``training.model`` learner); a group's curator releases the *mean* of its members' models
plus noise at the group's L2 sensitivity ``2 (L/n_min + tau) / (K lambda)`` (or the seed's
``2 (L/n_min + tau) / lambda`` with ``privacy.sensitivity = "pathak"``), where ``L`` is the
loss's Lipschitz constant (1) and ``tau`` the solver's gradient tolerance.

Neighbouring relation: replace one record of one peer's shard (rows of L2 norm <= 1). Released
to: the group or every peer (``publication.mode``). Every peer classifies the test rows with
its ensemble (``evaluation.vote``) of its own model and the models it received.

Non-private reference lines (computed for the experimenter, never released): the centralised
model on all training rows of the fold at the peers' lambda, each peer's own model alone, and
(``evaluation.best_lambda_reference = true``) the centralised model at its own lambda chosen
by cross-validation on the training fold only
(:func:`p2pdp.learning.references.centralised_best_lambda`).

Rules that need each peer's own shard (``local-validated``) get :class:`PeerData`; its k-fold
refits of the own models, like the best-lambda reference, are computed once per training key
and kept in :attr:`TrainedPeers.cache`, so every cell of a fold reuses them.

With ``privacy.mechanism = "posterior-sampling"`` (groups of one only) a peer publishes, in
place of its output-perturbed model, the mean of a private sample of its own model's
mean-field posterior (the exponential mechanism of Nguyễn's article,
:mod:`p2pdp.privacy.posterior_sampling.posterior`). The
task draws every release of the cell before the simulation (:func:`posterior_statistics`):
peer ``j``'s ``r``-th release is ``statistics[j, r]``, and the release path adds nothing.
The guarantee (epsilon-DP per record of the peer's shard, per release) holds for exact
sampling only; the Langevin chains approximate it, and their diagnostics are in the row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from p2pdp.config import ScenarioConfig
from p2pdp.core.errors import ConfigError
from p2pdp.core.reads import Read, When
from p2pdp.core.rng import generator
from p2pdp.learning.ensembles import OwnShards, cross_validate_own_models
from p2pdp.learning.evaluation import Metrics, evaluate_ensembles, linear_error
from p2pdp.learning.models import make_model
from p2pdp.learning.references import CentralisedReference, centralised_best_lambda
from p2pdp.learning.rules import PeerData, build_ensembles, make_ensemble_rule
from p2pdp.privacy.accounting import affordable_aggregations
from p2pdp.privacy.calibration import group_sensitivity
from p2pdp.privacy.posterior_sampling.posterior import PEER_SETTINGS, private_logistic_peers
from p2pdp.privacy.posterior_sampling.utility import LogisticRegression as PosteriorLogistic
from p2pdp.privacy.posterior_sampling.utility import utility_sensitivity
from p2pdp.privacy.release import record_column
from p2pdp.tasks import Outcome
from p2pdp.tasks.pipeline import TrainedPeers, own_peers, prepare_peers, training_key

#: Folds of the cross validation that picks the centralised reference's lambda (5 rather
#: than 10: about 3 s per Spambase fold instead of 9, the same lambda chosen on fold 0).
BEST_LAMBDA_CV_FOLDS = 5

#: Chain diagnostics of posterior-sampling releases in every results row (nan otherwise).
POSTERIOR_COLUMNS = (
    "posterior_max_rhat",
    "posterior_max_rhat_means",
    "posterior_min_ess",
    "posterior_min_ess_means",
    "posterior_final_step_size",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class PosteriorReleases:
    """Every private posterior sample of one cell, drawn before the simulation.

    Attributes
    ----------
    models : ndarray, shape (P, R, d)
        ``models[j, r]``: the mean ``mu`` of peer ``j``'s ``r``-th released sample ``z``,
        the vector it publishes (``R`` = releases its budget affords).
    diagnostics : dict of str to float
        :data:`POSTERIOR_COLUMNS` over all peers and releases (max split R-hat over every
        coordinate and over the means only, min effective sample size likewise, final step
        size). Computed from every chain: not released, not covered by the guarantee.
    """

    models: np.ndarray
    diagnostics: dict[str, float]


def posterior_statistics(
    prepared: TrainedPeers, *, lam: float, epsilon: float, tau: float, releases: int, seed: int
) -> PosteriorReleases:
    """Draw every peer's ``releases`` private posterior samples from its own shard.

    Release ``r`` of all peers is one batch of
    :func:`p2pdp.privacy.posterior_sampling.posterior.private_logistic_peers`
    on its own stream ``(seed, "posterior-sampling", fold, repetition, r)`` (fold and
    repetition from ``prepared.key``; 0 for a hand-built ``prepared``), so the first releases
    do not change with the budget and cells differing only in epsilon share their streams.
    Each sample depends on its peer's shard only (its chains, common random numbers and
    starting points are its own; the batch only shares numpy calls and one L-BFGS call).

    Neighbouring relation: replace one record of one peer's shard. Released to: whoever
    receives the peer's model (``publication.mode``), ``models[j, r]`` only. Guarantee:
    epsilon-DP per release for exact sampling; approximate for the finite chains.
    """
    fold, repetition = (prepared.key[1], prepared.key[2]) if prepared.key else (0, 0)
    rows, shards = prepared.training_rows()
    X, y = rows.X_train, rows.y_train
    Xs = [X[shard] for shard in shards]
    ys = [y[shard] for shard in shards]
    models, rhat, ess, steps = [], [], [], []
    for r in range(releases):
        samples = private_logistic_peers(
            Xs, ys, lam=lam, epsilon=epsilon, tau=tau, settings=PEER_SETTINGS,
            rng=generator(seed, "posterior-sampling", fold, repetition, r),
        )  # fmt: skip
        models.append(np.asarray(samples.means))
        rhat.append(np.asarray(samples.rhat))
        ess.append(np.asarray(samples.ess))
        steps.append(samples.final_step_size)
    d = X.shape[1]
    rhat_all, ess_all = np.stack(rhat), np.stack(ess)  # (R, P, 2d)
    diagnostics = {
        "posterior_max_rhat": float(np.nanmax(rhat_all)),
        "posterior_max_rhat_means": float(np.nanmax(rhat_all[..., :d])),
        "posterior_min_ess": float(np.nanmin(ess_all)),
        "posterior_min_ess_means": float(np.nanmin(ess_all[..., :d])),
        "posterior_final_step_size": float(steps[-1]),
    }
    return PosteriorReleases(models=np.stack(models, axis=1), diagnostics=diagnostics)


@dataclass(frozen=True, slots=True, kw_only=True)
class LogisticEvaluation:
    """Scores of one run of :class:`LogisticEnsembles`.

    ``metrics``: every peer's ensemble on the test rows; ``centralized_error``: the
    non-private model on all training rows; ``local_only_errors``: each peer's own model
    alone, (P,); ``ensemble_sizes``: models in each peer's ensemble, own included, (P,);
    ``centralized_best_lambda_error`` / ``centralized_best_lambda``: the non-private model at
    its own cross-validated lambda, and that lambda (None unless
    ``evaluation.best_lambda_reference``).
    ``posterior_diagnostics``: the chains' :data:`POSTERIOR_COLUMNS` (posterior sampling only).
    """

    metrics: Metrics
    centralized_error: float
    local_only_errors: np.ndarray
    ensemble_sizes: np.ndarray
    centralized_best_lambda_error: float | None = None
    centralized_best_lambda: float | None = None
    posterior_diagnostics: dict[str, float] = field(default_factory=dict)

    @property
    def local_only_error(self) -> float:
        return float(self.local_only_errors.mean())

    def summary(self) -> dict[str, Any]:
        row: dict[str, Any] = {
            **self.metrics.summary(),
            "centralized_error": self.centralized_error,
            "local_only_error": self.local_only_error,
            "mean_ensemble_size": float(self.ensemble_sizes.mean()),
            **{name: self.posterior_diagnostics.get(name, math.nan) for name in POSTERIOR_COLUMNS},
        }
        if self.centralized_best_lambda_error is not None:
            row["centralized_best_lambda_error"] = self.centralized_best_lambda_error
            row["centralized_best_lambda"] = self.centralized_best_lambda
        return row

    def roc(self) -> tuple[np.ndarray, np.ndarray]:
        """The best peer's ROC curve ``(fpr, tpr)``."""
        return self.metrics.roc_fpr, self.metrics.roc_tpr

    def peer_columns(self) -> dict[str, np.ndarray]:
        return {
            "error": self.metrics.errors,
            "local_only_error": self.local_only_errors,
            "ensemble_size": self.ensemble_sizes,
        }


class LogisticEnsembles:
    """The core workload: noisy averages of exact local logistic models, ensembles per peer.

    See the module docstring for the neighbouring relation and what is released to whom.
    """

    name: ClassVar[str] = "logistic"
    aggregate: ClassVar[str] = "mean"
    #: The settings it reads (:mod:`p2pdp.core.reads`); the one-shot protocol's sensitivity
    #: mode and ensemble rule only under that protocol (iterative peers keep one model).
    reads: ClassVar[tuple[Read, ...]] = (
        "data.*",
        "partition.scheme",
        "partition.min_shard_size",
        "training.lambda",
        "training.lambda_source",
        "training.model",
        "evaluation.best_lambda_reference",
        "protocol.name",
        When("protocol.name", "one-shot", ("privacy.sensitivity", "evaluation.vote")),
    )

    def __init__(self, config: ScenarioConfig) -> None:
        self.config = config
        self.model = make_model(config.training.model)
        self.rule = make_ensemble_rule(config.evaluation.vote)
        self.posterior = config.privacy.needs_records  # posterior sampling
        self._diagnostics: dict[int, dict[str, float]] = {}

    def training_key(self, *, fold: int, repetition: int) -> tuple:
        return training_key(self.config, fold=fold, repetition=repetition)

    def prepare(self, *, fold: int, repetition: int) -> TrainedPeers:
        return prepare_peers(self.config, fold=fold, repetition=repetition)

    def prepare_own(
        self,
        X: np.ndarray,
        y: np.ndarray,
        shards: tuple[np.ndarray, ...],
        *,
        data_dependent_bounds: bool,
        fold: int,
        repetition: int,
    ) -> TrainedPeers:
        """:meth:`prepare` for one host's peers from their own rows only (a per-host shard
        file): ``X`` (n, d), ``y`` (n,), one index array into them per peer. No test rows, no
        centralised model (see :func:`p2pdp.tasks.pipeline.own_peers`)."""
        return own_peers(
            self.config,
            X,
            y,
            shards,
            data_dependent_bounds=data_dependent_bounds,
            key=self.training_key(fold=fold, repetition=repetition),
        )

    def statistics(self, prepared: TrainedPeers) -> tuple[np.ndarray, np.ndarray]:
        """Local models (P, d) and shard sizes (P,); refuses models not solved to ``tau``."""
        worst = float(prepared.models.grad_norms.max())
        tolerance = self.model.gradient_tolerance
        if worst > tolerance:  # the sensitivity bound assumes it
            raise ConfigError(
                f"local models must be solved to gradient norm <= {tolerance}, got {worst}"
            )
        if self.posterior:
            return self._posterior_statistics(prepared), prepared.models.shard_sizes
        return prepared.models.weights, prepared.models.shard_sizes

    def _posterior_statistics(self, prepared: TrainedPeers) -> np.ndarray:
        """(P, R, d): every peer's private posterior samples, one per affordable release."""
        if self.config.training.model != "logistic":
            raise ConfigError(
                "privacy.mechanism = 'posterior-sampling' samples a logistic posterior: "
                f"training.model must be 'logistic', got {self.config.training.model!r}"
            )
        privacy = self.config.privacy
        releases = affordable_aggregations(
            privacy.epsilon, privacy.step_epsilon, accountant=privacy.resolved_accountant
        )
        drawn = posterior_statistics(
            prepared,
            lam=self.config.training.lam,
            epsilon=privacy.step_epsilon,
            tau=privacy.tau,
            releases=releases,
            seed=self.config.seed,
        )
        self._diagnostics[id(prepared)] = drawn.diagnostics
        return drawn.models

    def sensitivity(self, sizes: list[int]) -> float:
        """L2 sensitivity of the group's mean model; for posterior sampling, that of the
        exponential mechanism's utility, ``Delta_U = tau`` (not an L2 sensitivity)."""
        if self.posterior:
            return utility_sensitivity(
                PosteriorLogistic(lam=self.config.training.lam), self.config.privacy.tau
            )
        return group_sensitivity(
            sizes,
            self.config.training.lam,
            mode=self.config.privacy.sensitivity,
            gradient_tolerance=self.model.gradient_tolerance,
            lipschitz=self.model.lipschitz,
        )

    def score_columns(self) -> tuple[str, ...]:
        """The row columns :meth:`evaluate`'s summary fills: scores on the test rows and of
        the centralised model, all empty (NaN) in a run nobody scored (a network coordinator
        that holds no data, :data:`p2pdp.experiments.run.oneshot.UNSCORED`)."""
        metrics = ("mean_error", "std_error", "min_error", "median_error", "max_error")
        best = ("centralized_best_lambda_error", "centralized_best_lambda")
        return (
            *metrics,
            "best_peer_auc",
            "centralized_error",
            "local_only_error",
            "mean_ensemble_size",
            *POSTERIOR_COLUMNS,
            *(best if self.config.evaluation.best_lambda_reference else ()),
        )

    def evaluate(self, prepared: TrainedPeers, outcome: Outcome) -> LogisticEvaluation:
        prepared.centralized_soon()  # read at the end (_fixed_errors)
        weights = prepared.models.weights
        ensembles = build_ensembles(
            weights,
            outcome.published,
            outcome.shared,
            outcome.receipt_peers,
            outcome.receipt_models,
            noise_std=record_column(outcome.releases, "noise_std"),
        )
        own = self.peer_data(prepared) if self.rule.needs_own_data else None
        return self._evaluation(prepared, ensembles, self.rule, own)

    def evaluate_models(self, prepared: TrainedPeers, models: np.ndarray) -> LogisticEvaluation:
        """Scores of peers that each classify with one model of their own, ``models`` (P, d).

        For the iterative protocols (:mod:`p2pdp.protocols`): a peer's model already merges
        what it received, so its "ensemble" is that one model (``mean_ensemble_size`` 1).
        """
        prepared.centralized_soon()  # read at the end (_fixed_errors)
        empty = np.zeros((0, models.shape[1]))
        none = np.zeros(0, dtype=np.int64)
        ensembles = build_ensembles(models, empty, np.zeros(0, dtype=bool), none, none)
        return self._evaluation(prepared, ensembles, make_ensemble_rule("majority"), None)

    def _evaluation(
        self, prepared: TrainedPeers, ensembles: Any, rule: Any, own: PeerData | None
    ) -> LogisticEvaluation:
        data = prepared.fold
        # the ensembles' own models are the local models (one-shot runs): until the training
        # key's local-only errors are known, count them from the scoring's own margins
        local = (
            "fixed_errors" not in prepared.cache
            and ensembles.local_weights is prepared.models.weights
        )
        metrics = evaluate_ensembles(
            ensembles, data.X_test, data.y_test, vote=rule, own=own, own_errors=local
        )
        best_error = best_lam = None
        if self.config.evaluation.best_lambda_reference:
            reference = self.best_lambda_reference(prepared)
            best_lam = reference.lam
            best_error = float(linear_error(reference.weights, data.X_test, data.y_test)[0])
        centralized_error, local_only_errors = self._fixed_errors(prepared, metrics.own_errors)
        return LogisticEvaluation(
            metrics=metrics,
            centralized_error=centralized_error,
            local_only_errors=local_only_errors,
            ensemble_sizes=ensembles.sizes(),
            centralized_best_lambda_error=best_error,
            centralized_best_lambda=best_lam,
            posterior_diagnostics=self._diagnostics.get(id(prepared), {}),
        )

    @staticmethod
    def _fixed_errors(
        prepared: TrainedPeers, own_errors: np.ndarray | None = None
    ) -> tuple[float, np.ndarray]:
        """Test errors of the centralised model and of each local model alone (read-only,
        (P,)): the same for every run of the training key, computed once (``prepared.cache``).
        ``own_errors``: the local models' errors if a scoring already counted them."""
        if "fixed_errors" not in prepared.cache:
            X, y = prepared.fold.X_test, prepared.fold.y_test
            local = (
                linear_error(prepared.models.weights, X, y) if own_errors is None else own_errors
            )
            local.flags.writeable = False
            centralized = float(linear_error(prepared.centralized, X, y)[0])
            prepared.cache["fixed_errors"] = (centralized, local)
        return prepared.cache["fixed_errors"]

    def _stream(self, prepared: TrainedPeers, name: str) -> np.random.Generator:
        key = prepared.key
        fold, repetition = (key[1], key[2]) if key is not None else (0, 0)
        return generator(self.config.seed, name, fold, repetition)

    def peer_data(self, prepared: TrainedPeers) -> PeerData:
        """Each peer's own shard and its k-fold refits (computed once per training key).

        Reads only each peer's own rows; the refits never leave the peer (not released).
        """
        if "peer_data" not in prepared.cache:
            rows, own = prepared.training_rows()
            shards = OwnShards(
                X=rows.X_train,
                y=rows.y_train,
                shards=own,
                lam=self.config.training.lam,
            )
            cv = cross_validate_own_models(shards, rng=self._stream(prepared, "own-cv"))
            prepared.cache["peer_data"] = PeerData(shards=shards, cv=cv)
        return prepared.cache["peer_data"]

    def best_lambda_reference(self, prepared: TrainedPeers) -> CentralisedReference:
        """The centralised model at its own lambda (5-fold CV on the training fold; cached).

        Non-private reference for the experimenter: reads every training row, never released.
        """
        if "best_lambda" not in prepared.cache:
            rows, _ = prepared.training_rows()
            prepared.cache["best_lambda"] = centralised_best_lambda(
                rows.X_train,
                rows.y_train,
                cv_folds=BEST_LAMBDA_CV_FOLDS,
                rng=self._stream(prepared, "best-lambda"),
            )
        return prepared.cache["best_lambda"]
