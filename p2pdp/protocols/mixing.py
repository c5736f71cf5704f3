"""Gossip averaging over the overlay: Metropolis-Hastings weights and their spectral gap.

The mixing matrix ``W`` of an undirected overlay (CSR ``indptr``, ``indices``, every edge in
both directions) has ``W[i, j] = 1 / (1 + max(deg i, deg j))`` on edges and
``W[i, i] = 1 - sum_j W[i, j]`` (Metropolis-Hastings, Xiao & Boyd 2004): symmetric, doubly
stochastic, nonnegative, so repeated averaging converges to the mean on a connected overlay at
a rate set by the spectral gap ``1 - max(|lambda_2|, |lambda_P|)``.

A message that is lost or late keeps its weight on the receiver's own model (the receiver
averages with what it has): ``x_i <- x_i + sum_{j delivered} W[i, j] (x_j - x_i)``. Every
row still sums to 1, so the models stay a convex combination; the mean is preserved only
when every message arrives.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

#: Overlays up to this many peers get the spectral gap from a dense eigendecomposition.
DENSE_SPECTRUM_PEERS = 3000


@dataclass(frozen=True, slots=True, kw_only=True)
class Mixing:
    """Metropolis-Hastings weights of one overlay.

    Attributes
    ----------
    indptr : (P + 1,) int array
        Row ``i``'s edges are ``indptr[i]:indptr[i + 1]`` of ``indices`` and ``weights``.
    indices : (E,) int array
        ``indices[e]``: the neighbour whose model edge ``e`` carries to row ``i``.
    weights : (E,) float array
        ``W[i, indices[e]]``.
    """

    indptr: np.ndarray
    indices: np.ndarray
    weights: np.ndarray

    @classmethod
    def metropolis_hastings(cls, indptr: np.ndarray, indices: np.ndarray) -> Mixing:
        """The weights of the overlay with CSR ``indptr``, ``indices`` (no self-loops)."""
        indptr = np.asarray(indptr, dtype=np.int64)
        indices = np.asarray(indices, dtype=np.int64)
        degree = np.diff(indptr)
        rows = np.repeat(np.arange(len(degree)), degree)
        weights = 1.0 / (1.0 + np.maximum(degree[rows], degree[indices]))
        return cls(indptr=indptr, indices=indices, weights=weights)

    @property
    def n_peers(self) -> int:
        return len(self.indptr) - 1

    @property
    def receivers(self) -> np.ndarray:
        """(E,) the peer each edge's message goes to (its row)."""
        return np.repeat(np.arange(self.n_peers), np.diff(self.indptr))

    def matrix(self, delivered: np.ndarray | None = None) -> sp.csr_array:
        """``W`` as a sparse (P, P) array, diagonal included; with ``delivered`` (E,) bool,
        the matrix of :meth:`average` for those messages (a lost one's weight stays on the
        receiver's diagonal)."""
        off = self._off(delivered)
        diagonal = 1.0 - np.asarray(off.sum(axis=1)).ravel()
        return sp.csr_array(off + sp.diags_array(diagonal))

    def _off(self, delivered: np.ndarray | None) -> sp.csr_array:
        data = self.weights if delivered is None else np.where(delivered, self.weights, 0.0)
        return sp.csr_array((data, self.indices, self.indptr), shape=(self.n_peers,) * 2)

    def average(self, models: np.ndarray, delivered: np.ndarray | None = None) -> np.ndarray:
        """One gossip step: every peer averages its model with those it received.

        Parameters
        ----------
        models : (P, d) array
            The models the peers sent (row ``j``: peer ``j``'s).
        delivered : (E,) bool array, optional
            Which edges' messages arrived (default: all).

        Returns
        -------
        (P, d) array: ``x_i + sum_{j delivered} W[i, j] (x_j - x_i)``.
        """
        off = self._off(delivered)
        kept = np.asarray(off.sum(axis=1)).ravel()
        return models + off @ models - kept[:, None] * models

    def spectral_gap(self) -> float:
        """``1 - max(|lambda_2|, |lambda_P|)`` of ``W`` (0 for a disconnected overlay)."""
        W = self.matrix()
        if self.n_peers == 1:
            return 1.0
        if self.n_peers <= DENSE_SPECTRUM_PEERS:
            values = np.linalg.eigvalsh(W.toarray())
        else:
            from scipy.sparse.linalg import eigsh

            top = eigsh(W, k=2, which="LA", return_eigenvectors=False)
            bottom = eigsh(W, k=1, which="SA", return_eigenvectors=False)
            values = np.sort(np.concatenate([top, bottom]))
        second = max(abs(values[-2]), abs(values[0]))
        return float(max(0.0, 1.0 - second))
