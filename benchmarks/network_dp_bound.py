"""Network DP: the filtered upper bound against the exact value, and their times.

On the small graphs where the exact whole-view computation runs (a ring of 10, a star of 9,
a 3-regular graph of 14, an Erdos-Renyi graph of 12), every peer steps ``T`` times with ``K``
exchanges after each (all delivered, unequal step scales, decay 0.97), and the reported
columns (mean and max over ordered pairs of epsilon at ``Delta / sigma = 0.5``,
``delta = 1e-5``) are computed both ways. Prints, per graph and ``(T, K)``, both columns,
their ratios, the worst excess of any pair's coefficient (never negative) and the two
computations' times in the same run; writes ``network_dp_bound.csv`` and
``network_dp_bound.png`` (bound vs exact, the mean and max columns) into ``--out``
(default: the current directory; the guide's figure is ``docs/network_dp_bound.png``).
Usage: ``python benchmarks/network_dp_bound.py [--out DIR]``.
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

import matplotlib.pyplot as plt
import networkx as nx
import numpy as np
import scipy.sparse as sp

from p2pdp.core.figures import legend_below, write_figure
from p2pdp.protocols import network_dp, network_dp_filter, views
from p2pdp.protocols.mixing import Mixing

GRAPHS = {
    "ring, 10 peers": nx.cycle_graph(10),
    "star, 9 peers": nx.star_graph(8),
    "3-regular, 14 peers": nx.random_regular_graph(3, 14, seed=1),
    "Erdos-Renyi p = 0.3, 12 peers": nx.erdos_renyi_graph(12, 0.3, seed=2),
}
GRID = [(T, K) for K in (1, 2, 5) for T in (2, 4, 6, 8, 12)]


def _mixing(graph: nx.Graph) -> Mixing:
    n = graph.number_of_nodes()
    adjacency = sp.csr_array(nx.to_scipy_sparse_array(graph, nodelist=range(n)))
    adjacency.sort_indices()
    return Mixing.metropolis_hastings(adjacency.indptr, adjacency.indices)


def rows() -> list[dict[str, float | str]]:
    """One row per graph and (T, K): both computations' columns, ratios and seconds."""
    out: list[dict[str, float | str]] = []
    for name, graph in GRAPHS.items():
        mixing = _mixing(graph)
        P = mixing.n_peers
        scales = np.linspace(0.5, 1.5, P)
        off = ~np.eye(P, dtype=bool)
        for steps, gossip in GRID:
            trace = views.full_delivery_trace(mixing, steps, gossip)
            start = time.perf_counter()
            exact, _ = network_dp.view_coefficients(trace, mixing, scales=scales, decay=0.97)
            exact_s = time.perf_counter() - start
            start = time.perf_counter()
            bound = network_dp_filter.filtered_coefficients(
                trace, mixing, scales=scales, decay=0.97
            )
            bound_s = time.perf_counter() - start
            columns = {}
            for label, kappa in (("exact", exact), ("bound", bound)):
                eps = network_dp.pairwise_epsilon(kappa, sensitivity_over_sigma=0.5, delta=1e-5)
                columns[f"{label}_mean"] = float(np.nanmean(eps))
                columns[f"{label}_max"] = float(np.nanmax(eps))
            out.append(
                {
                    "graph": name,
                    "steps": steps,
                    "exchanges": gossip,
                    **columns,
                    "mean_ratio": columns["bound_mean"] / columns["exact_mean"],
                    "max_ratio": columns["bound_max"] / columns["exact_max"],
                    "worst_kappa_excess": float((bound[off] - exact[off]).min()),
                    "exact_s": exact_s,
                    "bound_s": bound_s,
                }
            )
    return out


def figure(table: list[dict[str, float | str]], path: Path) -> None:
    """Bound vs exact epsilon, the mean column (filled) and the max column (open)."""
    fig, axis = plt.subplots(figsize=(5.6, 5.0), layout="constrained")
    markers = ("o", "s", "^", "D")
    for number, name in enumerate(GRAPHS):
        mine = [r for r in table if r["graph"] == name]
        x = [float(r["exact_mean"]) for r in mine]
        y = [float(r["bound_mean"]) for r in mine]
        (drawn,) = axis.plot(x, y, markers[number], ls="", label=f"{name}: mean over pairs")
        axis.plot(
            [float(r["exact_max"]) for r in mine],
            [float(r["bound_max"]) for r in mine],
            markers[number], ls="", mfc="none", color=drawn.get_color(),
            label=f"{name}: max over pairs",
        )  # fmt: skip
    limit = max(float(r["bound_max"]) for r in table) * 1.05
    axis.plot([0, limit], [0, limit], "k-", lw=0.8, label="bound = exact")
    axis.plot([0, limit], [0, 1.5 * limit], "k:", lw=0.8, label="bound = 1.5 x exact")
    axis.set_xlim(0, limit)
    axis.set_ylim(0, limit)
    axis.set_xlabel("exact network DP ε (whole view, dense computation)")
    axis.set_ylabel("filtered upper bound ε")
    axis.set_title("T in {2..12} steps, K in {1, 2, 5} exchanges a step", fontsize=9)
    axis.grid(alpha=0.3)
    legend_below(fig, [axis], ncols=2)
    write_figure(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".", help="output directory")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table = rows()
    with open(out / "network_dp_bound.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(table)
    figure(table, out / "network_dp_bound.png")
    print(f"{'graph':32s} {'T':>3s} {'K':>2s} {'mean ex/bd':>15s} {'max ex/bd':>15s} "
          f"{'ratios':>12s} {'excess':>9s} {'exact s':>8s} {'bound s':>8s}")  # fmt: skip
    for r in table:
        print(
            f"{r['graph']:32s} {r['steps']:3d} {r['exchanges']:2d} "
            f"{r['exact_mean']:7.3f}/{r['bound_mean']:7.3f} "
            f"{r['exact_max']:7.3f}/{r['bound_max']:7.3f} "
            f"{r['mean_ratio']:5.3f} {r['max_ratio']:5.3f} {r['worst_kappa_excess']:+9.1e} "
            f"{r['exact_s']:8.3f} {r['bound_s']:8.3f}"
        )
    print(f"worst mean ratio {max(float(r['mean_ratio']) for r in table):.3f}, "
          f"worst max ratio {max(float(r['max_ratio']) for r in table):.3f}, "
          f"smallest excess {min(float(r['worst_kappa_excess']) for r in table):+.1e}")  # fmt: skip


if __name__ == "__main__":
    main()
