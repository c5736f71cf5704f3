"""One large run split over a Dask cluster (issue 30 item 5): the local run's rows, no
training rows in the client, and the contiguous partition the plan needs."""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest
from dask.distributed import Client, LocalCluster

from p2pdp.core.errors import ConfigError
from p2pdp.data import synthetic
from p2pdp.data.partition import contiguous_starts, partition, partition_contiguous
from p2pdp.data.synthetic import SYNTHETIC_BLOCK_ROWS
from p2pdp.experiments.results.files import read_results
from p2pdp.experiments.run import cells as run_cells
from p2pdp.experiments.run import cluster as plan
from p2pdp.experiments.run import dask_backend as run_dask
from p2pdp.experiments.run import runner
from p2pdp.experiments.scenarios.scenario import parse_scenario
from p2pdp.learning.evaluation import PARALLEL_MIN_PEERS
from p2pdp.learning.newton import STREAM_MIN_ROWS
from p2pdp.tasks import pipeline

ROWS, TEST_ROWS, PEERS, FEATURES = 261_000, 2_000, PARALLEL_MIN_PEERS, 10

#: 4 blocks of training rows (the last one partial, the streamed centralised reference's
#: blocks), test rows across blocks 3 and 4, and shards of 13 or 14 rows, so some shards
#: straddle a block boundary; the peers are enough to be scored in slices.
LARGE = f"""
name = "cluster_large"
seed = 11

[data]
dataset = "synthetic"
synthetic_rows = {ROWS}
synthetic_test_rows = {TEST_ROWS}
synthetic_features = {FEATURES}

[partition]
n_peers = {PEERS}
scheme = "contiguous"

[groups]
group_size = 10

[publication]
mode = "full"

[evaluation]
split = "fixed"
"""


def test_the_run_covers_what_the_plan_needs() -> None:
    starts = contiguous_starts(ROWS, PEERS)
    crossing = (starts[:-1] // SYNTHETIC_BLOCK_ROWS) != ((starts[1:] - 1) // SYNTHETIC_BLOCK_ROWS)
    assert crossing.sum() >= 3  # a shard straddles every inner block boundary
    assert ROWS >= STREAM_MIN_ROWS and math.ceil(ROWS / SYNTHETIC_BLOCK_ROWS) >= 4
    assert ROWS // SYNTHETIC_BLOCK_ROWS < (ROWS + TEST_ROWS - 1) // SYNTHETIC_BLOCK_ROWS
    assert plan.plan_gap(parse_scenario(LARGE).config) is None


@pytest.fixture(scope="module")
def address():
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as dask_cluster:
        yield dask_cluster.scheduler_address


def rows_as_text(folder) -> list[dict[str, str]]:
    """The results rows as written (text), without the ``wall_*`` timing columns."""
    return [
        {k: v for k, v in row.items() if not k.startswith("wall_")} for row in read_results(folder)
    ]


def test_a_run_split_over_the_cluster_gives_the_local_rows(tmp_path, address, monkeypatch):
    """Every column but wall_*, compared as text: the cluster's rows, local models,
    centralised reference and scores are the local run's, bit for bit (the same blocks,
    summed in the same order; integer error counts). The client draws no row: the loader
    and the block function raise in this process, and its largest allocation stays below
    half the training rows (the Dask workers are other processes)."""
    scenario = parse_scenario(LARGE)
    for jobs in (1, 2):
        runner.run_experiment(scenario, tmp_path / f"jobs{jobs}", jobs=jobs)
    local = rows_as_text(tmp_path / "jobs1")
    assert rows_as_text(tmp_path / "jobs2") == local
    assert float(local[0]["centralized_error"]) < 0.4  # the run learns something

    def no_rows_here(*args, **kwargs):
        raise AssertionError("the client drew or loaded training rows")

    monkeypatch.setattr(pipeline, "load_fold", no_rows_here)
    monkeypatch.setattr(synthetic, "make_synthetic", no_rows_here)
    monkeypatch.setattr(plan, "synthetic_block", no_rows_here)
    peaks, prepare = [], run_dask.prepare_on_cluster

    def measured(*args, **kwargs):  # the client's allocations while the run is trained
        tracemalloc.start()
        try:
            return prepare(*args, **kwargs)
        finally:
            peaks.append(tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()

    monkeypatch.setattr(run_dask, "prepare_on_cluster", measured)
    runner.run_experiment(scenario, tmp_path / "dask", scheduler=address)
    assert rows_as_text(tmp_path / "dask") == local
    # The client holds the local models (P x (d + 1): 1.8 MB, gathered by block and then
    # joined) and Dask's message buffers: peaks of 5.3 MB, once 7.4 MB (results arriving
    # together), against 23 MB for the training rows, which never come here
    training_rows = ROWS * (FEATURES + 1) * 8  # bytes, transformed
    assert len(peaks) == 1 and peaks[0] < training_rows / 2, (peaks, training_rows)
    manifest = (tmp_path / "dask" / "manifest.json").read_text()
    assert "1 of 1 cells split in blocks over the workers" in manifest


def test_the_cluster_trains_the_local_models_bit_for_bit(address):
    """The training the client gets from the workers is the local one: every local model,
    its gradient norm and shard size, the centralised model (the streamed Newton's block
    sums added in block order) and the test rows, exactly; and no training row."""
    config = parse_scenario(LARGE).config
    local = pipeline.train_in_memory(config, fold=0)  # every row in memory
    with Client(address) as client:
        split = plan.prepare_on_cluster(client, config, fold=0, repetition=0)
    assert split.key == local.key
    for name in ("weights", "grad_norms", "shard_sizes"):
        np.testing.assert_array_equal(getattr(split.models, name), getattr(local.models, name))
    assert split.models.iterations == local.models.iterations
    np.testing.assert_array_equal(split.centralized, local.centralized)
    np.testing.assert_array_equal(split.fold.X_test, local.fold.X_test)
    np.testing.assert_array_equal(split.fold.y_test, local.fold.y_test)
    assert split.fold.data_dependent_bounds and local.fold.data_dependent_bounds
    assert split.fold.X_train.shape == (0, FEATURES + 1) and split.shards == ()


def test_the_evaluation_runs_on_the_workers(address, monkeypatch):
    """The evaluation's blocks (the published models' sums on every test row, then every
    peer's errors with the local-only errors) are Dask tasks, one run of blocks per worker,
    not local forks."""
    calls = []
    with Client(address) as client:
        pieces = plan.dask_pieces(client)

        def counting(function, shared, items):
            calls.append((function.__name__, len(items)))
            return pieces(function, shared, items)

        monkeypatch.setattr(run_dask, "dask_pieces", lambda client: counting)
        cells = run_cells.make_cells(parse_scenario(LARGE))
        records = list(run_dask._run_dask(cells, client, "p2pdp-progress-test"))
    assert len(records) == 1  # 2 workers of 1 thread: 2 runs of blocks each time
    assert calls == [("_published_partials", 2), ("_count_tallied", 2)]


def test_cells_outside_the_plan_say_which_setting() -> None:
    config = parse_scenario(LARGE, overrides=["partition.scheme=iid"]).config
    assert plan.plan_gap(config) == (
        "partition.scheme = 'iid' (the cluster plan needs 'contiguous')"
    )
    config = parse_scenario(LARGE, overrides=["evaluation.vote=local-validated"]).config
    assert "evaluation.vote = 'local-validated'" in plan.plan_gap(config)
    config = parse_scenario(LARGE, overrides=["evaluation.best_lambda_reference=true"]).config
    assert "evaluation.best_lambda_reference = True" in plan.plan_gap(config)
    with pytest.raises(ConfigError, match="partition.scheme = 'iid'"):
        plan.prepare_on_cluster(
            None,
            parse_scenario(LARGE, overrides=["partition.scheme=iid"]).config,
            fold=0,
            repetition=0,
        )


# --- the contiguous partition -----------------------------------------------------------------
@pytest.mark.parametrize(("n_rows", "n_peers"), [(10, 3), (7, 7), (1000, 1), (261_000, 20_000)])
def test_contiguous_shards_are_ranges_of_nearly_equal_size(n_rows: int, n_peers: int) -> None:
    shards = partition(np.zeros(n_rows), n_peers, scheme="contiguous", rng=np.random.default_rng(0))
    sizes = np.array([len(shard) for shard in shards])
    assert len(shards) == n_peers and sizes.max() - sizes.min() <= 1
    assert sizes.min() == n_rows // n_peers and sizes.sum() == n_rows
    np.testing.assert_array_equal(np.concatenate(shards), np.arange(n_rows))  # disjoint, all
    for p, shard in enumerate(shards):
        assert shard[0] == p * n_rows // n_peers and shard.dtype == np.int64


def test_contiguous_refuses_too_small_shards_naming_the_field() -> None:
    with pytest.raises(ConfigError, match="min_shard_size 4 is too large: 10 rows over 3 peers"):
        partition_contiguous(np.zeros(10), 3, min_shard_size=4)
    assert [len(s) for s in partition_contiguous(np.zeros(10), 3, min_shard_size=3)] == [3, 3, 4]
