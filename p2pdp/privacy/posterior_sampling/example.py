"""The example of Nguyễn's article: private Bayesian linear regression on synthetic data.

``Y = 2 X1 - 3.5 X2 - 5 + N(0, 0.1^2)``, ``X ~ U(-0.5, 0.5)^2``, ``N = 4,000``. For each
``(epsilon, tau)`` of a grid we release one mean-field posterior ``z`` with
:func:`p2pdp.privacy.posterior_sampling.posterior.private_posterior` and compare it with the
non-private MAP.

Rows (:func:`posterior_rows`) carry, for each parameter name in :data:`PARAMETERS`,
``truth.<name>``, ``map.<name>``, ``private_mean.<name>`` (the released mean; for ``sigma``:
``exp`` of the released mean of ``log sigma``) and ``private_std.<name>`` (the released standard
deviation ``exp(rho)``; for ``sigma`` it is the standard deviation of ``log sigma``), plus the
chain diagnostics and the guarantee label: epsilon-DP holds for an exact draw from ``f``, the
finite chain only approximates it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from p2pdp.core.rng import generator
from p2pdp.privacy.posterior_sampling.langevin import SamplerSettings
from p2pdp.privacy.posterior_sampling.posterior import (
    GUARANTEE_LABEL,
    map_estimate,
    private_posterior,
)
from p2pdp.privacy.posterior_sampling.utility import LinearRegression

TRUTH: dict[str, float] = {"x1": 2.0, "x2": -3.5, "intercept": -5.0, "sigma": 0.1}
PARAMETERS: tuple[str, ...] = ("x1", "x2", "intercept", "sigma")
EPSILONS: tuple[float, ...] = (0.1, 1.0, 10.0)
TAUS: tuple[float, ...] = (0.5, 2.0, 8.0)
N_RECORDS = 4000


def seed_data(
    n_records: int = N_RECORDS, *, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """``X`` (n, 2) uniform on ``(-0.5, 0.5)^2`` and ``y = 2 x1 - 3.5 x2 - 5 + N(0, 0.1^2)``."""
    X = rng.uniform(-0.5, 0.5, size=(n_records, 2))
    y = X @ np.array([TRUTH["x1"], TRUTH["x2"]]) + TRUTH["intercept"]
    return X, y + TRUTH["sigma"] * rng.standard_normal(n_records)


def _named(theta: np.ndarray) -> dict[str, float]:
    return {"x1": theta[0], "x2": theta[1], "intercept": theta[2], "sigma": math.exp(theta[3])}


def posterior_rows(
    *,
    seed: int = 0,
    epsilons: Sequence[float] = EPSILONS,
    taus: Sequence[float] = TAUS,
    n_records: int = N_RECORDS,
    chains: int = 4,
    draws: int = 2,
    settings: SamplerSettings | None = None,
) -> list[dict[str, object]]:
    """One row per ``(epsilon, tau)``: truth, non-private MAP, the private release, diagnostics.

    The data come from stream ``(seed, "posterior-example", "data")``, each release from
    ``(seed, "posterior-example", epsilon, tau)``, so a cell does not depend on the others.
    """
    X, y = seed_data(n_records, rng=generator(seed, "posterior-example", "data"))
    model = LinearRegression()
    map_named = _named(map_estimate(X, y, model=model))
    rows = []
    for epsilon in epsilons:
        for tau in taus:
            started = time.perf_counter()
            sample = private_posterior(
                X, y, model=model, epsilon=epsilon, tau=tau, chains=chains, draws=draws,
                settings=settings, rng=generator(seed, "posterior-example", str(epsilon), str(tau)),
            )  # fmt: skip
            stds = np.exp(sample.log_stds)
            diagnostics = sample.diagnostics
            row: dict[str, object] = {
                "seed": seed,
                "n_records": n_records,
                "epsilon": float(epsilon),
                "tau": float(tau),
                "sensitivity": sample.sensitivity,
                "guarantee": GUARANTEE_LABEL,
            }
            for name, std in zip(PARAMETERS, stds, strict=True):
                row[f"truth.{name}"] = TRUTH[name]
                row[f"map.{name}"] = float(map_named[name])
                row[f"private_mean.{name}"] = sample.point_estimate[
                    "sigma" if name == "sigma" else name
                ]
                row[f"private_std.{name}"] = float(std)
            row.update(
                {
                    "rhat_max.means": diagnostics.max_rhat_means,
                    "ess_min.means": diagnostics.min_ess_means,
                    "rhat_max.log_stds": float(np.nanmax(diagnostics.rhat[4:])),
                    "ess_min.log_stds": float(np.nanmin(diagnostics.ess[4:])),
                    "final_step_size": diagnostics.final_step_size,
                    "chains": diagnostics.chains,
                    "draws": diagnostics.draws,
                    "n_burnin": diagnostics.n_burnin,
                    "n_samples": diagnostics.n_samples,
                    "seconds": time.perf_counter() - started,
                }
            )
            rows.append(row)
    return rows


def format_rows(rows: Sequence[dict[str, object]]) -> str:
    """Fixed-width table: private mean (MAP) per parameter and the chain diagnostics."""
    header = (
        f"{'eps':>5} {'tau':>4} "
        + " ".join(f"{name:>17}" for name in PARAMETERS)
        + f" {'Rhat mu':>7} {'ESS mu':>6} {'Rhat rho':>8} {'ESS rho':>7} {'h_end':>6}"
    )
    lines = [header, "-" * len(header)]
    for row in rows:
        cells = " ".join(
            f"{row[f'private_mean.{n}']:>8.3f} ({row[f'map.{n}']:>6.3f})" for n in PARAMETERS
        )
        lines.append(
            f"{row['epsilon']:>5g} {row['tau']:>4g} {cells} {row['rhat_max.means']:>7.3f} "
            f"{row['ess_min.means']:>6.0f} {row['rhat_max.log_stds']:>8.2f} "
            f"{row['ess_min.log_stds']:>7.0f} {row['final_step_size']:>6.3g}"
        )
    lines.append(f"private mean (MAP); guarantee: {GUARANTEE_LABEL}")
    return "\n".join(lines)


def plot_bounded_log_likelihood(path: str, *, taus: Sequence[float] = (2.0,)) -> None:
    """The seed's Figure 1: ``l`` against ``gamma = tau tanh(l / tau)`` on ``[-3, 3]``."""
    import matplotlib.pyplot as plt

    from p2pdp.privacy.posterior_sampling.utility import bounded_log_likelihood

    l = np.linspace(-3, 3, 200)
    figure, axes = plt.subplots(figsize=(4.5, 3.5))
    axes.plot(l, l, "r-", label=r"$\ell$")
    for tau in taus:
        axes.plot(l, bounded_log_likelihood(l, tau)[0], label=rf"$\gamma$, $\tau$ = {tau:g}")
    axes.set_xlabel(r"log-likelihood $\ell$ of one record")
    axes.set_ylabel("value")
    axes.set_title("Bounded log-likelihood")
    axes.legend()
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def plot_estimates_vs_epsilon(rows: Sequence[dict[str, Any]], path: str) -> None:
    """Private means (± released std) against epsilon, one panel per parameter, truth marked."""
    import matplotlib.pyplot as plt

    taus = sorted({row["tau"] for row in rows})
    figure, axes = plt.subplots(1, len(PARAMETERS), figsize=(14, 3.6))
    for panel, name in zip(axes, PARAMETERS, strict=True):
        for offset, tau in enumerate(taus):
            cell = sorted((r for r in rows if r["tau"] == tau), key=lambda r: r["epsilon"])
            eps = np.array([r["epsilon"] for r in cell]) * 1.08 ** (offset - 1)
            mean = np.array([r[f"private_mean.{name}"] for r in cell])
            std = np.array([r[f"private_std.{name}"] for r in cell])
            if name == "sigma":  # std of log sigma -> multiplicative band
                lower, upper = mean - mean * np.exp(-std), mean * np.exp(std) - mean
            else:
                lower = upper = std
            panel.errorbar(eps, mean, yerr=[lower, upper], fmt="o-", capsize=3,
                           label=rf"private, $\tau$ = {tau:g}")  # fmt: skip
        panel.axhline(TRUTH[name], color="k", linestyle="--", label="truth")
        panel.axhline(rows[0][f"map.{name}"], color="grey", linestyle=":", label="MAP")
        panel.set_xscale("log")
        panel.set_xlabel(r"$\epsilon$")
        panel.set_title(name)
        panel.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    figure.suptitle(
        "Private posterior means (bars: released std) vs epsilon; " + GUARANTEE_LABEL,
        fontsize=10,
    )
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
