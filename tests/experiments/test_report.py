"""Report: figures and report.md from a small hand-written results.csv."""

from __future__ import annotations

import csv
import itertools

import numpy as np
import pytest

from p2pdp.core.errors import ConfigError
from p2pdp.experiments.cli import main
from p2pdp.experiments.report.write import write_report
from p2pdp.experiments.results.files import ROC_FPR

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
                    "training.lambda": 0.01,
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
    assert "Error vs regularisation: skipped, `training.lambda` is not swept" in text
    # folds have errors 0.1 and 0.2 with no spread over peers: mean 0.15, pooled std 0.05
    assert "| 1 | 0.1 | 1 | group | 2 | 0.150 ± 0.050 |" in text
    assert text.count("| 2 | 0.150 ± 0.050 |") == 8  # one table row per grid point
    # results written before the non_private_steps column: derived from data_dependent_bounds
    assert "## Non-private steps" in text
    assert "- min-max bounds fitted on the pooled training rows of each fold\n" in text


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


def write_grid(directory, axes, *, messages=lambda s: 30 * s["partition.n_peers"]):
    """results.csv over the product of ``axes`` ({key: values}), 2 folds, error by formula."""
    rows = []
    keys = list(axes)
    for point, values in enumerate(itertools.product(*axes.values())):
        settings = {"partition.n_peers": 10, **dict(zip(keys, values, strict=True))}
        for fold in range(2):
            rows.append(
                {
                    "cell_id": f"p{point:03d}-f{fold}-r0",
                    "name": "grid",
                    "seed": 1,
                    "training.lambda": 0.01,
                    "privacy.epsilon": 1.0,
                    "network.loss": 0.0,
                    **settings,
                    "fold": fold,
                    "mean_error": 0.1 + 0.01 * point + 0.05 * fold,
                    "std_error": 0.02,
                    "min_error": 0.05,
                    "best_peer_auc": 0.9,
                    "aggregations": 10 + point,
                    "centralized_error": 0.08,
                    "local_only_error": 0.12,
                    "messages_sent": messages(settings),
                    "wall_cell_s": 0.01,
                    "non_private_steps": "",
                }
            )
    with (directory / "results.csv").open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


@pytest.fixture
def drawn(monkeypatch):
    """Figures as saved, by file stem (kept open for inspection)."""
    from p2pdp.experiments.report import figures as report

    figures = {}
    original = report.write_figure

    def save(figure, path, **options):
        original(figure, path, **options)
        figures[path.stem] = figure

    monkeypatch.setattr(report, "write_figure", save)
    yield figures
    import matplotlib.pyplot as plt

    plt.close("all")


def test_many_lambdas_are_a_colour_scale_with_a_colour_bar(tmp_path, drawn):
    lambdas = [2.0**k for k in range(-14, 1)]
    write_grid(tmp_path, {"training.lambda": lambdas, "privacy.epsilon": [1.0, 10.0]})
    text = write_report(tmp_path).read_text()
    figure = drawn["error_vs_epsilon"]
    colour_bars = [a for a in figure.axes if a.get_ylabel() == "regularisation λ"]
    assert len(colour_bars) == 1
    (panel,) = [a for a in figure.axes if a not in colour_bars]
    assert len([line for line in panel.get_lines() if line.get_marker() == "o"]) == 15
    assert not panel.collections  # no bands under 15 lines
    (legend,) = figure.legends
    assert len(legend.get_texts()) == 2  # the two reference lines only
    assert "λ = " not in " ".join(t.get_text() for t in legend.get_texts())
    assert "Colour: regularisation λ (colour bar)" in text


def test_legends_are_inside_the_saved_image(tmp_path, drawn):
    """A legend wider than its single panel must widen the image, not be cut off."""
    import matplotlib.image
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    write_grid(
        tmp_path,
        {
            "privacy.mechanism": ["coordinate-laplace", "vector-laplace"],
            "privacy.sensitivity": ["group-mean", "pathak"],
            "groups.group_size": [10, 50],
        },
    )
    write_report(tmp_path)
    assert "error_vs_group_size" in drawn
    for stem, figure in drawn.items():
        renderer = FigureCanvasAgg(figure).get_renderer()
        height, width = matplotlib.image.imread(tmp_path / f"{stem}.png").shape[:2]
        for legend in [*figure.legends, *(a.get_legend() for a in figure.axes if a.get_legend())]:
            box = legend.get_window_extent(renderer)  # pixels at figure.dpi
            assert (width + 2) / 110 >= box.width / figure.dpi, stem  # saved at dpi 110
            assert (height + 2) / 110 >= box.height / figure.dpi, stem


def test_costs_that_coincide_are_drawn_once(tmp_path, drawn):
    write_grid(
        tmp_path,
        {
            "partition.n_peers": [10, 20, 50],
            "privacy.epsilon": [1.0, 10.0],
            "publication.mode": ["group", "full"],
        },
        messages=lambda s: (
            30 * s["partition.n_peers"] * (2 if s["publication.mode"] == "full" else 1)
        ),
    )
    write_report(tmp_path)
    messages = drawn["cost_vs_peers"].axes[0]
    labels = sorted(frozenset(line.get_label().split("; ")) for line in messages.get_lines())
    assert set(labels) == {
        frozenset({"ε = 1, 10", "full publication"}),
        frozenset({"ε = 1, 10", "group publication"}),
    }
    assert len(labels) == 2


def test_loss_sweep_draws_aggregations_and_error_per_sampler(tmp_path, drawn):
    write_grid(tmp_path, {"groups.sampler": ["central", "gossip"], "network.loss": [0.0, 0.1, 0.2]})
    text = write_report(tmp_path).read_text()
    assert "![Aggregations and error vs message loss](error_vs_loss.png)" in text
    aggregations, error = drawn["error_vs_loss"].axes
    assert aggregations.get_ylabel() == "aggregations completed per run"
    for axis in (aggregations, error):
        samplers = [l for l in axis.get_lines() if l.get_label().startswith("sampler = ")]
        assert sorted(l.get_label() for l in samplers) == ["sampler = central", "sampler = gossip"]
        assert all(list(l.get_xdata()) == [0.0, 0.1, 0.2] for l in samplers)
    central = next(l for l in aggregations.get_lines() if l.get_label() == "sampler = central")
    assert list(central.get_ydata()) == [10, 11, 12]  # points 0, 1, 2 of the grid


def test_rule_and_mechanism_name_the_lines_and_the_best_lambda_reference_is_drawn(tmp_path):
    import matplotlib.pyplot as plt

    from p2pdp.experiments.report import figures, summary
    from p2pdp.experiments.results.files import read_results

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
    parsed = [{k: summary._parse(v) for k, v in r.items()} for r in read_results(tmp_path)]
    swept = [c for c in parsed[0] if "." in c and len({r[c] for r in parsed}) > 1]
    summaries = summary._summarise(parsed, swept, {})
    panel, lines = summary._split(summaries, swept, "privacy.epsilon", "groups.group_size")
    assert panel == "groups.group_size"
    assert lines[:2] == ["privacy.mechanism", "evaluation.vote"]
    assert "privacy.delta" not in lines
    figure, axis = plt.subplots()
    figures._references(axis, summaries, "privacy.epsilon")
    labels = axis.get_legend_handles_labels()[1]
    plt.close(figure)
    assert "centralized, non-private, own best λ" in labels


def test_seven_panels_wrap_into_three_columns_with_the_legend_in_the_free_slot(tmp_path, drawn):
    sizes = [1, 2, 5, 10, 20, 50, 100]
    write_grid(
        tmp_path,
        {
            "groups.group_size": sizes,
            "privacy.epsilon": [0.1, 1.0],
            "publication.mode": ["group", "full"],
        },
        messages=lambda s: 30,
    )
    write_report(tmp_path)
    figure = drawn["error_vs_epsilon"]
    panels = [a for a in figure.axes if a.axison]
    assert len(panels) == 7
    assert panels[0].get_subplotspec().get_gridspec().ncols == 3
    (holder,) = [a for a in figure.axes if not a.axison]  # the empty slots hold the legend
    assert holder.get_legend() is not None and not figure.legends


def test_lines_that_coincide_stay_distinguishable(tmp_path, drawn):
    write_grid(tmp_path, {"publication.mode": ["group", "full"], "privacy.epsilon": [1.0, 10.0]})
    write_report(tmp_path)
    (panel,) = [a for a in drawn["error_vs_epsilon"].axes if a.axison]
    data = [
        line
        for line in panel.get_lines()
        if line.get_label() in ("group publication", "full publication")
    ]
    assert len(data) == 2
    looks = {(l.get_linestyle(), l.get_marker(), l.get_markerfacecolor() == "none") for l in data}
    assert len(looks) == 2 and all(len({a, b}) == 2 for a, b in zip(*looks, strict=True))


def test_the_header_says_which_runtime_made_the_rows(tmp_path, monkeypatch, capsys):
    """A network run's report read exactly like the simulator's, though its times are wall
    seconds between processes: the header says which runtime ran (from the manifest)."""
    import json

    from tests.experiments.test_runner import TINY

    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.toml").write_text(TINY)
    assert main(["run", "tiny.toml", "--out", "out", "--set", "evaluation.folds=[0]"]) == 0
    assert "; simulated; started" in (tmp_path / "out" / "report.md").read_text()
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    manifest.update(runtime="network", hosts="3")
    (tmp_path / "out" / "manifest.json").write_text(json.dumps(manifest))
    header = write_report(tmp_path / "out").read_text().splitlines()[2]
    assert "run on the network runtime (3 hosts; its times, `sim_time` included, are wall" in (
        header
    )
