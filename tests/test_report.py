"""Report: figures and report.md from a small hand-written results.csv."""

from __future__ import annotations

import csv
import itertools

import numpy as np
import pytest

from p2pdp.cli import main
from p2pdp.errors import ConfigError
from p2pdp.report import write_report
from p2pdp.results import ROC_FPR

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_results(directory, *, n_peers=(10,), folds=2, roc=False):
    """A results.csv over g in {1, 5}, epsilon in {1, 10} (zipped with epsilon / 10), modes.

    Cell error = 0.1 + 0.1 * fold (so the pooled mean is known) with per-peer std 0.
    """
    rows = []
    grid = itertools.product(n_peers, (1, 5), ((1.0, 0.1), (10.0, 1.0)), ("group", "full"))
    for point, (peers, group_size, (epsilon, per_aggregation), mode) in enumerate(grid):
        for fold in range(folds):
            rows.append(
                {
                    "cell_id": f"p{point:02d}-f{fold}-r0",
                    "point": point,
                    "name": "tiny",
                    "seed": 1,
                    "data.dataset": "spambase",
                    "partition.n_peers": peers,
                    "training.lam": 0.01,
                    "privacy.epsilon": epsilon,
                    "privacy.epsilon_per_aggregation": per_aggregation,
                    "groups.group_size": group_size,
                    "publication.mode": mode,
                    "fold": fold,
                    "repetition": 0,
                    "mean_error": 0.1 + 0.1 * fold,
                    "std_error": 0.0,
                    "min_error": 0.05,
                    "best_peer_auc": 0.9,
                    "aggregations": 20 // group_size,
                    "centralized_error": 0.08,
                    "local_only_error": 0.12,
                    "messages_sent": 30 * peers,
                    "data_dependent_bounds": True,
                    "wall_cell_s": 0.01 * peers,
                }
            )
    with (directory / "results.csv").open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    if roc:
        with (directory / "roc.csv").open("w", newline="") as file:
            writer = csv.writer(file)
            writer.writerow(["cell_id", "fpr", "tpr"])
            for row in rows:
                writer.writerows((row["cell_id"], x, np.sqrt(x)) for x in ROC_FPR)
    return rows


def assert_png(path):
    assert path.read_bytes()[:8] == PNG_MAGIC
    assert path.stat().st_size > 10_000  # something was drawn


def test_report_figures_and_markdown(tmp_path):
    write_results(tmp_path, roc=True)
    report = write_report(tmp_path)
    text = report.read_text()
    for name in ("error_vs_group_size", "error_vs_epsilon", "roc_best_peer"):
        assert_png(tmp_path / f"{name}.png")
        assert f"({name}.png)" in text
    for name in ("error_vs_peers", "error_vs_lambda", "cost_vs_peers"):
        assert not (tmp_path / f"{name}.png").exists()
    assert "Error vs number of peers: skipped, `partition.n_peers` is not swept" in text
    assert "Error vs regularisation: skipped, `training.lam` is not swept" in text
    # folds have errors 0.1 and 0.2 with no spread over peers: mean 0.15, pooled std 0.05
    assert "| 1 | 0.1 | 1 | group | 2 | 0.150 ± 0.050 |" in text
    assert text.count("| 2 | 0.150 ± 0.050 |") == 8  # one table row per grid point
    assert "non-private step" in text


def test_peer_sweep_draws_error_and_cost_vs_peers(tmp_path):
    write_results(tmp_path, n_peers=(10, 20, 50))
    text = write_report(tmp_path).read_text()
    for name in ("error_vs_peers", "cost_vs_peers"):
        assert_png(tmp_path / f"{name}.png")
        assert f"({name}.png)" in text
    assert "ROC of the best peer: skipped, no roc.csv" in text


def test_stale_figures_are_removed(tmp_path):
    write_results(tmp_path, n_peers=(10, 20))
    write_report(tmp_path)
    assert (tmp_path / "error_vs_peers.png").exists()
    write_results(tmp_path, n_peers=(10,))
    write_report(tmp_path)
    assert not (tmp_path / "error_vs_peers.png").exists()


def test_report_command(tmp_path, capsys):
    write_results(tmp_path)
    assert main(["report", str(tmp_path)]) == 0
    assert str(tmp_path / "report.md") in capsys.readouterr().out


def test_missing_results(tmp_path):
    with pytest.raises(ConfigError, match="results.csv not found"):
        write_report(tmp_path)
    assert main(["report", str(tmp_path)]) == 2


def test_rule_and_mechanism_name_the_lines_and_the_best_lambda_reference_is_drawn(tmp_path):
    import matplotlib.pyplot as plt

    from p2pdp import report as report_module
    from p2pdp.results import read_results

    rows = write_results(tmp_path, folds=1)
    mechanisms = (("vector-laplace", 0.0), ("gaussian", 1e-5))
    extended = []
    for row, ((mechanism, delta), vote) in itertools.product(
        rows, itertools.product(mechanisms, ("majority", "local-validated"))
    ):
        extended.append(
            row
            | {
                "cell_id": f"{row['cell_id']}-{mechanism}-{vote}",
                "privacy.delta": delta,  # tied to the mechanism, listed before it
                "privacy.mechanism": mechanism,
                "evaluation.vote": vote,
                "centralized_best_lambda_error": 0.07,
            }
        )
    with (tmp_path / "results.csv").open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(extended[0]))
        writer.writeheader()
        writer.writerows(extended)
    text = write_report(tmp_path).read_text()
    assert "centralized, own best λ" in text and "| 0.070 | 0.120 |" in text
    parsed = [{k: report_module._parse(v) for k, v in r.items()} for r in read_results(tmp_path)]
    swept = [c for c in parsed[0] if "." in c and len({r[c] for r in parsed}) > 1]
    summaries = report_module._summarise(parsed, swept, {})
    panel, lines = report_module._split(summaries, swept, "privacy.epsilon", "groups.group_size")
    assert panel == "groups.group_size"
    assert lines[:2] == ["privacy.mechanism", "evaluation.vote"]
    assert "privacy.delta" not in lines
    figure, axis = plt.subplots()
    report_module._references(axis, summaries, "privacy.epsilon")
    labels = axis.get_legend_handles_labels()[1]
    plt.close(figure)
    assert "centralized, non-private, own best λ" in labels
