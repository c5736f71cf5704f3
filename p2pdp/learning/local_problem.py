"""Every peer's shard of a decentralized linear model and its clipped per-record gradients.

:class:`LocalProblem` holds the peers' training rows peer by peer (peer ``j``: rows
``indptr[j]:indptr[j + 1]``) and computes, for the iterative protocols
(:mod:`p2pdp.protocols.iterative`), each stepping peer's sum of clipped per-record loss
gradients at its model: the data-dependent part of one private step, whose sensitivity the
clipping bounds (the noise and its accounting are the caller's,
:class:`~p2pdp.privacy.clipped_gaussian.ClippedGaussianSum`). The loss is the ``model``'s
(:class:`~p2pdp.learning.models.GradientModel`: any ``training.model`` that declares the
derivative of its loss in the score; the logistic loss ``log(1 + exp(-y x.w))`` by default).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import scipy.sparse as sp

from p2pdp.core.boundary import calling, check_numbers, is_builtin
from p2pdp.core.errors import ConfigError
from p2pdp.learning.models import GradientModel, LogisticModel, make_model
from p2pdp.privacy.clipped_gaussian import ClippedGaussianSum

__all__ = ["LocalProblem", "gradient_model"]


def gradient_model(name: str, protocol: str) -> GradientModel:
    """The model ``training.model = name`` names, whose per-record gradients the iterative
    protocol ``protocol`` steps along; ConfigError, naming both, if it declares none (no
    ``loss_derivative``: :class:`~p2pdp.learning.models.GradientModel`)."""
    model = make_model(name)
    if not callable(getattr(model, "loss_derivative", None)):
        raise ConfigError(
            f"protocol.name = {protocol!r} takes private steps along per-record gradients, "
            f"but training.model = {name!r} ({type(model).__name__}) declares none: give it "
            "a method loss_derivative(scores, y), the derivative of its loss in the score x.w "
            "(p2pdp.learning.models.GradientModel), or use training.model = 'logistic'"
        )
    return cast(GradientModel, model)


@dataclass(frozen=True, slots=True, kw_only=True)
class LocalProblem:
    """Every peer's shard, stored peer by peer, for an L2-regularised linear model.

    Attributes
    ----------
    X : (N, d) array
        Training rows; peer ``j`` holds rows ``indptr[j]:indptr[j + 1]``.
    y : (N,) array of -1.0 / +1.0
    indptr : (P + 1,) int64 array
    lam : float
        The L2 regularisation ``lambda``.
    model : GradientModel
        Whose loss the records' gradients are of (``training.model``; logistic by default).
    """

    X: np.ndarray
    y: np.ndarray
    indptr: np.ndarray
    lam: float
    model: GradientModel = field(default_factory=LogisticModel)

    @classmethod
    def from_shards(
        cls,
        X: np.ndarray,
        y: np.ndarray,
        shards: tuple[np.ndarray, ...],
        lam: float,
        model: GradientModel | None = None,
    ) -> LocalProblem:
        """Rows of ``X``, ``y`` regrouped so that each shard's rows are contiguous; ``model``:
        whose loss (None: logistic)."""
        order = np.concatenate(shards)
        sizes = np.array([len(shard) for shard in shards], dtype=np.int64)
        indptr = np.concatenate([[0], np.cumsum(sizes)])
        return cls(
            X=X[order],
            y=np.asarray(y, float)[order],
            indptr=indptr,
            lam=lam,
            model=LogisticModel() if model is None else model,
        )

    @property
    def n_peers(self) -> int:
        return len(self.indptr) - 1

    @property
    def sizes(self) -> np.ndarray:
        """Shard sizes, (P,)."""
        return np.diff(self.indptr)

    def shard(self, peer: int) -> LocalProblem:
        """Peer ``peer``'s shard alone (views, no copy): what its machine holds."""
        start, stop = int(self.indptr[peer]), int(self.indptr[peer + 1])
        return LocalProblem(
            X=self.X[start:stop],
            y=self.y[start:stop],
            indptr=np.array([0, stop - start], dtype=np.int64),
            lam=self.lam,
            model=self.model,
        )

    def _loss_derivatives(self, scores: np.ndarray, y: np.ndarray) -> np.ndarray:
        """``model.loss_derivative(scores, y)``, (n,); a plug-in's output is checked (finite
        numbers of the scores' shape: a wrong shape would broadcast into a wrong sum)."""
        if is_builtin(self.model):
            return self.model.loss_derivative(scores, y)
        with calling("model", self.model, "loss_derivative"):
            value = self.model.loss_derivative(scores, y)
        return check_numbers(value, "model", self.model, "loss_derivative", shape=scores.shape)

    def clipped_sums(
        self,
        models: np.ndarray,
        peers: np.ndarray,
        mechanism: ClippedGaussianSum,
        rng: np.random.Generator | Sequence[np.random.Generator],
    ) -> np.ndarray:
        """Each of ``peers``' sum of clipped per-record loss gradients at its model.

        Parameters
        ----------
        models : (P, d) array
        peers : (m,) int array, distinct, increasing
        mechanism : ClippedGaussianSum
            Clipping norm and the sampling of records.
        rng : numpy.random.Generator, or one per entry of ``peers``
            The sampling's uniforms (:meth:`ClippedGaussianSum.select`): each peer's own
            stream when given one per peer.

        Returns
        -------
        (m, d) array: ``sum_r clip(grad_r)`` over the sampled records of each peer, where
        record ``r``'s gradient is ``model.loss_derivative(x_r.w, y_r) x_r`` (for the logistic
        loss ``log(1 + exp(-y x.w))``: ``-y sigmoid(-y x.w) x``).
        """
        if len(peers) == self.n_peers:
            rows: slice | np.ndarray = slice(None)
            indptr = self.indptr
        elif len(peers) == 1:  # one peer (gossip learning): its rows are one slice
            start, stop = self.indptr[peers[0]], self.indptr[peers[0] + 1]
            rows, indptr = slice(start, stop), np.array([0, stop - start])
        else:
            sizes = self.sizes[peers]
            indptr = np.concatenate([[0], np.cumsum(sizes)])
            rows = np.repeat(self.indptr[peers] - indptr[:-1], sizes) + np.arange(indptr[-1])
        X, y = self.X[rows], self.y[rows]
        owner = np.repeat(np.arange(len(peers)), np.diff(indptr))
        derivatives = self._loss_derivatives(np.einsum("ij,ij->i", X, models[peers][owner]), y)
        norms = np.abs(derivatives) * np.linalg.norm(X, axis=1)  # each record's gradient's
        coefficients = derivatives * (mechanism.clip_factors(norms) * mechanism.select(indptr, rng))
        if len(peers) == 1:
            return (coefficients @ X)[None, :]
        weights = sp.csr_array(
            (coefficients, np.arange(len(coefficients)), indptr), shape=(len(peers), len(y))
        )
        return np.asarray(weights @ X)
