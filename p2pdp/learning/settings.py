"""Settings of the learning layer: the ``[training]`` and ``[evaluation]`` tables.

:class:`TrainingConfig` (the local model, read by :mod:`p2pdp.learning.models`) and
:class:`EvaluationConfig` (folds and the ensemble rule, read by :mod:`p2pdp.learning.ensembles`
and the engine) live with the code that reads them; :mod:`p2pdp.config` composes them into a
:class:`~p2pdp.config.ScenarioConfig`. Fields declare their constraints
(:mod:`p2pdp.core.validation`), checked on construction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from p2pdp.core.errors import ConfigError
from p2pdp.core.reads import When
from p2pdp.core.validation import (
    Boolean,
    ComponentName,
    IntAtLeast,
    NonNegative,
    OneOf,
    Positive,
    as_list,
    check,
    invalid,
    validate_fields,
)

SPLITS = ("cv", "fixed")


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingConfig:
    """Local training: L2 regularisation ``lam`` (TOML key, ``--set`` key and results column
    ``training.lambda``), optional simulated time.

    ``model`` is the local learner (a ``model`` component: ``"logistic"`` or an import
    string). ``seconds_per_row`` > 0 makes a peer available only after
    ``n_j * seconds_per_row`` seconds of simulated training time. ``lambda_source`` says
    where ``lambda`` came from when it was chosen by looking at data (e.g. ``"chosen by the
    lambda_grid sweep on Spambase (reads every peer's data and the test folds)"``); empty
    means the user chose it without looking at the data. A non-empty value is listed as a
    non-private step (:mod:`p2pdp.experiments.scenarios.disclosure`).
    """

    lam: float = field(default=1e-2, metadata=check(Positive()))
    model: str = field(default="logistic", metadata=check(ComponentName("model")))
    seconds_per_row: float = field(default=0.0, metadata=check(NonNegative()))
    lambda_source: str = ""

    def __post_init__(self) -> None:
        validate_fields(self, "training", {"lam": "lambda"})
        if not isinstance(self.lambda_source, str) or ";" in self.lambda_source:
            raise invalid(
                "training.lambda_source",
                "a string without ';' (results join non-private steps with '; ')",
                self.lambda_source,
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class EvaluationConfig:
    """How runs are evaluated.

    ``split = "cv"``: stratified ``cv_folds``-fold cross-validation; ``"fixed"``: the data
    set's predefined train/test split (adult). ``folds`` limits which folds run (empty = all).
    ``vote``: ensemble rule, ``"majority"`` of signs (ties broken by the summed margin, then
    +1), ``"mean-margin"`` (sign of the mean margin, 0 -> +1), ``"majority-own"`` (ties to
    the own model), ``"average"`` or ``"local-validated"`` (noise-aware, see
    :mod:`p2pdp.learning.evaluation`). ``best_lambda_reference``: also report the non-private
    centralised model at its own cross-validated lambda (``centralized_best_lambda_error``;
    a few seconds per fold, computed once per training key).
    """

    vote: str = field(default="majority", metadata=check(ComponentName("ensemble")))
    split: str = field(default="cv", metadata=check(OneOf(SPLITS)))
    cv_folds: int = field(default=10, metadata=check(IntAtLeast(2)))
    folds: tuple[int, ...] = ()
    best_lambda_reference: bool = field(default=False, metadata=check(Boolean()))

    #: Settings read only for some values of this table's options, while the option itself is
    #: read (:func:`p2pdp.config.settings_read`).
    option_reads: ClassVar[tuple[When, ...]] = (
        When("evaluation.split", "cv", ("evaluation.cv_folds", "evaluation.folds")),
    )

    def __post_init__(self) -> None:
        validate_fields(self, "evaluation")
        object.__setattr__(self, "folds", as_list("evaluation.folds", self.folds))
        for fold in self.folds:
            if isinstance(fold, bool) or not isinstance(fold, int) or not 0 <= fold < self.cv_folds:
                raise invalid("evaluation.folds", f"fold indices in [0, {self.cv_folds})", fold)
        repeated = sorted({fold for fold in self.folds if self.folds.count(fold) > 1})
        if repeated:
            raise ConfigError(
                f"evaluation.folds must not repeat a fold (each fold is one set of cells), "
                f"got {list(self.folds)}: {repeated} more than once"
            )

    def fold_indices(self) -> tuple[int, ...]:
        """Folds a run covers: ``(0,)`` for a fixed split, else ``folds`` or all."""
        if self.split == "fixed":
            return (0,)
        return self.folds or tuple(range(self.cv_folds))
