"""Convergence diagnostics of the posterior sampler's chains: split R-hat and effective sample size.

They say how far from converged a run looks; they do not certify privacy (the guarantee holds
for an exact draw only), and they are computed from every chain, so they are never released:
they stay with the data holder and the simulator's evaluation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def split_rhat(trace: np.ndarray) -> np.ndarray:
    """Split R-hat (Gelman et al., BDA3 11.4): chains halved, between/within variance.

    Parameters
    ----------
    trace : ndarray, shape (C, T, ...)
        ``C`` chains of ``T >= 4`` states each.

    Returns
    -------
    ndarray, shape (...)
        ~1 for mixed chains; > 1.01-1.1 signals chains that disagree. ``nan`` when every state
        is identical.
    """
    trace = np.asarray(trace, float)
    half = trace.shape[1] // 2
    halves = np.concatenate([trace[:, :half], trace[:, trace.shape[1] - half :]], axis=0)
    n = halves.shape[1]
    within = halves.var(axis=1, ddof=1).mean(axis=0)
    between = n * halves.mean(axis=1).var(axis=0, ddof=1)
    pooled = (n - 1) / n * within + between / n
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.sqrt(pooled / within)


def effective_sample_size(trace: np.ndarray) -> np.ndarray:
    """Multi-chain effective sample size (Stan's estimator, Geyer's initial monotone sequence).

    Parameters
    ----------
    trace : ndarray, shape (C, T, ...)

    Returns
    -------
    ndarray, shape (...)
        In ``(0, C * T]``-ish (antithetic chains can exceed ``C T``); ``nan`` for constant traces.
    """
    trace = np.asarray(trace, float)
    C, T = trace.shape[:2]
    centred = trace - trace.mean(axis=1, keepdims=True)
    size = 1 << (2 * T - 1).bit_length()
    spectrum = np.fft.rfft(centred, n=size, axis=1)
    autocov = np.fft.irfft(spectrum * np.conj(spectrum), n=size, axis=1)[:, :T] / T
    chain_var = autocov[:, 0] * T / (T - 1)
    within = chain_var.mean(axis=0)
    pooled = (T - 1) / T * within + (trace.mean(axis=1).var(axis=0, ddof=1) if C > 1 else 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = 1.0 - (within - autocov.mean(axis=0)) / pooled  # (T, ...)
    rho[0] = 1.0
    n_pairs = T // 2
    pairs = rho[: 2 * n_pairs].reshape(n_pairs, 2, *rho.shape[1:]).sum(axis=1)
    positive = np.cumprod(pairs > 0, axis=0).astype(bool)  # initial positive sequence
    monotone = np.minimum.accumulate(np.where(positive, pairs, np.inf), axis=0)
    tau_hat = -1.0 + 2.0 * np.where(positive, monotone, 0.0).sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return C * T / np.maximum(tau_hat, 1.0 / math.log10(max(C * T, 10)))


@dataclass(frozen=True, slots=True, kw_only=True)
class ChainDiagnostics:
    """Convergence statistics of the chains behind one release (never released themselves).

    Attributes
    ----------
    rhat, ess : ndarray, shape (2p,)
        Split R-hat and effective sample size of every coordinate of ``z`` (means first, then
        log standard deviations), from the kept sampling-phase states of all chains.
    final_step_size : float
        ``h`` of the last step (preconditioned units).
    chains, n_burnin, n_samples, draws : int
        Chains run (chain 0 is released), burn-in and sampling steps, Monte-Carlo draws ``L``.
    """

    rhat: np.ndarray
    ess: np.ndarray
    final_step_size: float
    chains: int
    n_burnin: int
    n_samples: int
    draws: int

    @property
    def max_rhat_means(self) -> float:
        return float(np.nanmax(self.rhat[: len(self.rhat) // 2]))

    @property
    def min_ess_means(self) -> float:
        return float(np.nanmin(self.ess[: len(self.ess) // 2]))

    @property
    def max_rhat(self) -> float:
        return float(np.nanmax(self.rhat))

    @property
    def min_ess(self) -> float:
        return float(np.nanmin(self.ess))
