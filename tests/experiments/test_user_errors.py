"""A careless user (issue 40): no setting silently ignored, no traceback, errors that say what
is wrong and what to do. Each case runs the command line in this process (``main``) and reads
what it prints, or the Python call the guide shows; the Dask cases start a cluster in a
subprocess."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import p2pdp
from p2pdp.config import ScenarioConfig, check_reads
from p2pdp.core.errors import ClusterLostError, ConfigError, DataError
from p2pdp.core.rng import generator
from p2pdp.data.loaders import load_data
from p2pdp.data.settings import DataConfig, PartitionConfig
from p2pdp.experiments.audit.table import AUDIT_SAMPLES, format_audit_table
from p2pdp.experiments.cli import main
from p2pdp.experiments.results import store as results_module
from p2pdp.experiments.results.files import read_manifest, read_results
from p2pdp.experiments.run import dask_backend as run_dask
from p2pdp.experiments.run.cells import make_cells
from p2pdp.experiments.run.cluster import on_dask_worker, scheduler_watch
from p2pdp.experiments.scenarios.scenario import parse_scenario
from p2pdp.learning.settings import EvaluationConfig
from p2pdp.privacy.audit import AuditResult
from p2pdp.privacy.settings import PrivacyConfig
from p2pdp.protocols.settings import GroupsConfig
from p2pdp.sim.world import WorldObserver
from p2pdp.tasks.pipeline import load_fold
from tests.experiments.test_runner import TINY

ROOT = Path(__file__).resolve().parents[2]

SYNTHETIC = TINY  # 12 cells: 2 x 2 grid points x 3 folds

CSV = """
name = "careless_csv"

[data]
dataset = "csv"
path = "rows.csv"
transform = ["minmax", "bias", "project_unit_ball"]

[partition]
n_peers = 10

[groups]
group_size = 2

[evaluation]
cv_folds = 2
"""


def rows(n: int = 120, d: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    return X, (X[:, 0] + 0.3 * rng.normal(size=n) > 0).astype(int)


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """``tmp_path`` as the current folder, holding ``rows.csv`` and the two scenarios."""
    monkeypatch.chdir(tmp_path)
    X, y = rows()
    np.savetxt(tmp_path / "rows.csv", np.column_stack([X, y]), delimiter=",", fmt="%.6f")
    (tmp_path / "synthetic.toml").write_text(SYNTHETIC)
    (tmp_path / "csv.toml").write_text(CSV)
    (tmp_path / "binary").write_bytes(b"\xff\xfe\x00\x93")
    return tmp_path


def error_line(capsys, argv: list[str]) -> str:
    """Run ``p2pdp ARGV``: it must exit 2 with one line on stderr, ``p2pdp: error: ...``."""
    code = main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if not line.startswith("p2pdp run: ")]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("p2pdp: error: "), err
    return lines[0]


# --- silent settings ----------------------------------------------------------------------------
def test_a_test_file_under_cross_validation_is_refused(folder, capsys):
    argv = ["run", "csv.toml", "--out", "out", "--jobs", "1", "--set", "data.test_path=rows.csv"]
    line = error_line(capsys, argv)
    assert "data.test_path = 'rows.csv'" in line and "evaluation.split = 'cv'" in line
    assert "set evaluation.split = 'fixed'" in line and not (folder / "out").exists()
    (folder / "fixed.toml").write_text(CSV.replace("cv_folds = 2", 'split = "fixed"'))
    argv[1] = "fixed.toml"
    assert main(argv) == 0  # the fixed split reads it
    assert read_results(folder / "out")[0]["data.test_path"] == "rows.csv"


def test_folds_under_a_fixed_split_are_refused(folder, capsys):
    (folder / "fixed.toml").write_text(CSV.replace("cv_folds = 2", 'split = "fixed"'))
    argv = ["run", "fixed.toml", "--out", "o", "--set", "data.test_path=rows.csv"]
    line = error_line(capsys, [*argv, "--set", "evaluation.cv_folds=5"])
    assert "evaluation.cv_folds = 5 is read only with evaluation.split = 'cv' (here 'fix" in line
    line = error_line(capsys, [*argv, "--set", "evaluation.folds=[1]"])
    assert "evaluation.folds = (1,) is read only with evaluation.split = 'cv'" in line
    with pytest.raises(ConfigError, match="evaluation.cv_folds = 5 is read only with"):
        fixed = EvaluationConfig(split="fixed", cv_folds=5)
        check_reads(ScenarioConfig(data=DataConfig(dataset="synthetic"), evaluation=fixed))
    config = ScenarioConfig(
        data=DataConfig(dataset="synthetic", synthetic_rows=200, synthetic_features=4),
        partition=PartitionConfig(n_peers=8),
        groups=GroupsConfig(group_size=2),
        evaluation=EvaluationConfig(split="fixed"),
    )
    with pytest.raises(ConfigError, match="fold must be 0 with evaluation.split = 'fixed'"):
        p2pdp.simulate(config, fold=1)


def test_a_data_path_for_the_synthetic_data_set_is_refused(folder, capsys):
    argv = ["run", "synthetic.toml", "--out", "o", "--set", "data.path=rows.csv"]
    line = error_line(capsys, argv)
    assert "data.path = 'rows.csv' is not read by data.dataset = 'synthetic'" in line


@pytest.mark.parametrize("key", ["synthetic_rows", "synthetic_test_rows", "synthetic_features"])
def test_synthetic_sizes_on_another_built_in_data_set_are_refused(folder, capsys, key):
    line = error_line(capsys, ["run", "csv.toml", "--out", "out", "--set", f"data.{key}=50"])
    assert f"data.{key} sizes data.dataset = 'synthetic'" in line
    assert "data.dataset = 'csv'" in line
    with pytest.raises(ConfigError, match=f"data.{key} sizes"):
        DataConfig(dataset="spambase", **{key: 50})
    # the synthetic data set and a loader of your own may read them
    DataConfig(dataset="synthetic", **{key: 50})
    DataConfig(dataset="p2pdp.data.synthetic:synthetic", **{key: 50})


def test_a_test_split_inside_an_npz_file_under_cross_validation_is_refused(tmp_path):
    X, y = rows()
    np.savez(tmp_path / "a.npz", X=X[:90], y=y[:90], X_test=X[90:], y_test=y[90:])
    data = DataConfig(dataset="numpy", path=str(tmp_path / "a.npz"))
    with pytest.raises(ConfigError, match=r"a.npz' holds a test split \(X_test, y_test\), which "):
        load_fold(data, EvaluationConfig(cv_folds=2), seed=0, fold=0)
    fixed = load_fold(data, EvaluationConfig(split="fixed"), seed=0, fold=0)
    assert fixed.X_test.shape[0] == 30  # the fixed split tests on it
    np.savez(tmp_path / "b.npz", X=X, y=y)  # without one, cross-validation runs
    data = DataConfig(dataset="numpy", path=str(tmp_path / "b.npz"))
    assert load_fold(data, EvaluationConfig(cv_folds=2), seed=0, fold=0).X_test.shape[0] == 60


# --- tracebacks ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["audit", "--seed", "-1"], "argument --seed: must be an integer >= 0, got '-1'"),
        (["audit", "--runs", "0"], "--runs must be an integer >= 1, got 0"),
        (["audit", "--seed", "1.5"], "argument --seed: must be an integer >= 0, got '1.5'"),
        (["audit", "--samples", "3"], "--samples must be an integer >= 8, got 3"),
        (["audit", "--samples", "many"], "argument --samples: invalid int value: 'many'"),
        (["audit", "--mechanism", "dpsgd"], "--mechanism must be one of vector-laplace"),
        (["audit", "--bogus"], "unrecognized arguments: --bogus (see `p2pdp audit --help`)"),
        (["run"], "required: scenario (see `p2pdp run --help`)"),
        (["nosuch"], "invalid choice: 'nosuch'"),
        (["run", "synthetic.toml", "--jobs", "two"], "argument --jobs: invalid int value"),
        (["run", "synthetic.toml", "--out", "o", "--jobs", "0"], "--jobs must be an integer >= 1"),
        (["run", "."], "scenario '.' is a folder, not a scenario file"),
        (["report", "nowhere"], "nowhere/results.csv not found"),
        (["report", "rows.csv"], "rows.csv is a file, not a results folder"),
        (["split", "synthetic.toml", "--hosts", "0", "--out", "s"], "--hosts gives 0 hosts"),
        (["datasets", "info", "nosuch"], "dataset must be one of"),
        (["components", "nosuch"], "argument kind: invalid choice: 'nosuch'"),
        (["split", "synthetic.toml", "--hosts", "2", "--out", "rows.csv"], "--out rows.csv is a"),
        (
            ["run", "synthetic.toml", "--out", "o", "--runtime", "network", "--hosts", "binary"],
            "hosts file binary: cannot read it as text",
        ),
    ],
)
def test_bad_arguments_of_every_command_are_one_line(folder, capsys, argv, message):
    assert message in error_line(capsys, argv)


def test_audit_help_shows_percent_signs_once(capsys):
    with pytest.raises(SystemExit) as done:
        main(["audit", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "95%" in out and "%%" not in out


# --- unclear errors -----------------------------------------------------------------------------
def test_epsilon_below_the_swept_per_aggregation_epsilon_names_it(capsys, folder):
    (folder / "zipped.toml").write_text(
        SYNTHETIC.replace(
            '"groups.group_size" = [2, 5]\n"publication.mode" = ["group", "full"]', ""
        )
        + '"privacy.epsilon,privacy.epsilon_per_aggregation" = [[1, 0.1], [10, 1]]\n'
        + '[privacy]\nmechanism = "gaussian"\ndelta = 1e-5\n'
    )
    argv = ["run", "zipped.toml", "--out", "o", "--set", "privacy.epsilon=1e-6"]
    line = error_line(capsys, argv)
    assert "privacy.epsilon_per_aggregation must be <= privacy.epsilon (1e-06), got 0.1" in line
    assert "delta_per_aggregation" not in line  # derived from the two: not the user's doing
    assert "is still swept on its own because --set privacy.epsilon=1e-6" in line
    with pytest.raises(ConfigError, match="epsilon_per_aggregation must be <= privacy.epsilon"):
        PrivacyConfig(epsilon=1e-6, epsilon_per_aggregation=0.1, mechanism="gaussian", delta=1e-5)


@pytest.mark.parametrize("dataset", ["csv", "libsvm", "numpy"])
def test_a_folder_as_the_data_file_says_it_is_a_folder(tmp_path, dataset):
    where = tmp_path / "data.npz"
    where.mkdir()
    with pytest.raises(DataError, match=r"data.path = '.*data.npz' is a folder, not a file"):
        load_data(DataConfig(dataset=dataset, path=str(where)), rng=generator(0, "x"))


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"1,2,0\n3,4,1\n", r"it begins b'1,2,0\\n'\): write it with one of them, or read a"),
        (b"", r"it is empty\)"),
    ],
)
def test_a_text_file_named_npy_is_not_a_numpy_file(folder, capsys, content, says):
    (folder / "rows.npy").write_bytes(content)
    argv = ["run", "csv.toml", "--out", "o", "--set", "data.dataset=numpy"]
    line = error_line(capsys, [*argv, "--set", "data.path=rows.npy"])
    assert "data.path = 'rows.npy' is not a file written by numpy.save or numpy.savez" in line
    assert "pickle" not in line
    with pytest.raises(DataError, match=says):
        load_data(DataConfig(dataset="numpy", path="rows.npy"), rng=None)


def test_a_csv_header_must_be_names_and_names_need_a_header(folder, capsys):
    argv = ["run", "csv.toml", "--out", "o", "--set", "data.header=true"]
    line = error_line(capsys, argv)  # skipping it would drop a data row unseen
    assert "rows.csv, line 1: data.header = true skips this line as column names, but it " in line
    names = "a,b,c,label\n" + (folder / "rows.csv").read_text()
    (folder / "rows.csv").write_text(names)
    line = error_line(capsys, argv[:4])
    assert "non-numeric cell 'a' (column names? set data.header = true)" in line
    assert main([*argv, "--out", "ok"]) == 0
    assert len(read_results(folder / "ok")) == 2


@pytest.mark.parametrize("dataset", ["csv", "libsvm"])
def test_a_numpy_file_read_as_text_says_it_is_numpy(tmp_path, dataset):
    X, y = rows()
    np.savez(tmp_path / "a.npz", X=X, y=y)
    with pytest.raises(DataError, match="a.npz: not a text file .* set data.dataset = 'numpy'"):
        load_data(DataConfig(dataset=dataset, path=str(tmp_path / "a.npz")), rng=None)


def test_an_object_array_says_so_not_allow_pickle(tmp_path):
    np.save(tmp_path / "t.npy", np.array([[1.0, None]], dtype=object), allow_pickle=True)
    with pytest.raises(DataError, match=r"the table holds Python objects \(an object array"):
        load_data(DataConfig(dataset="numpy", path=str(tmp_path / "t.npy")), rng=None)


def audit_row(n_samples: int | None, canaries: int | None = None) -> AuditResult:
    return AuditResult(
        mechanism="clipped-gaussian-unclipped",
        epsilon=1.0,
        delta=1e-5,
        eps_lb=0.5,
        passed=True,
        expected_pass=False,
        guarantee_epsilon=1.0,
        method="threshold-test",
        n_samples=n_samples,
        canaries=canaries,
    )


def test_a_negative_control_passing_on_a_small_sample_says_the_sample_is_small(capsys):
    assert main(["audit", "--mechanism", "clipped-gaussian-unclipped", "--samples", "200"]) == 1
    out = capsys.readouterr().out
    assert "UNEXPECTED: the sample may be too small to catch it (200 outputs per side; " in out
    assert f"the audit's default is --samples {AUDIT_SAMPLES})" in out
    # the default sample: UNEXPECTED alone (a real finding), without blaming the sample
    assert format_audit_table([audit_row(AUDIT_SAMPLES)]).endswith(", UNEXPECTED")
    assert "--runs 100" in format_audit_table([audit_row(None, canaries=1000)])


def test_simulate_takes_settings_as_the_python_guide_shows():
    guide = (ROOT / "docs" / "guide" / "python-api.md").read_text()
    assert 'simulate(config, fold=0, privacy={"epsilon": 1.0}, seed=3)' in guide
    config = ScenarioConfig(
        data=DataConfig(dataset="synthetic", synthetic_rows=200, synthetic_features=4),
        partition=PartitionConfig(n_peers=8),
        groups=GroupsConfig(group_size=2),
    )
    changed = p2pdp.simulate(config, fold=0, privacy={"epsilon": 2.0}, seed=3)
    by_hand = dataclasses.replace(
        config, seed=3, privacy=dataclasses.replace(config.privacy, epsilon=2.0)
    )
    expected = p2pdp.simulate(by_hand, fold=0)
    assert changed.evaluation.summary() == expected.evaluation.summary()
    assert changed.epsilon_spent.tolist() == expected.epsilon_spent.tolist()
    with pytest.raises(ConfigError, match="did you mean 'privacy.epsilon'"):
        p2pdp.simulate(config, fold=0, privacy={"epsilonn": 1.0})
    with pytest.raises(ConfigError, match="simulate\\(\\): privacy.epsilon must be > 0"):
        p2pdp.simulate(config, fold=0, privacy={"epsilon": -1.0})


def test_an_error_has_no_tail_about_an_unrelated_setting(folder, capsys):
    line = error_line(
        capsys, ["run", "synthetic.toml", "--out", "o", "--set", "privacy.mechanism=nosuch"]
    )
    assert "'seed-laplace'" not in line and "seed-laplace" in line  # a name in the list
    assert "comes from" not in line  # not "seed = 7 comes from synthetic.toml"
    # a tail that is related stays
    (folder / "nofolds.toml").write_text(CSV.replace("cv_folds = 2", ""))
    argv = ["run", "nofolds.toml", "--out", "o", "--set", "evaluation.split=fixed"]
    line = error_line(capsys, argv)
    assert line.endswith("for data.dataset = 'csv' (data.dataset = 'csv' comes from nofolds.toml)")
    line = error_line(capsys, ["run", "synthetic.toml", "--out", "o", "--set", "seed=-1"])
    assert line.endswith("seed must be an integer >= 0, got -1")


# --- Dask ---------------------------------------------------------------------------------------
CLUSTER = """
import sys, time
from dask.distributed import LocalCluster
cluster = LocalCluster(
    n_workers=1, threads_per_worker=1, processes=False, protocol="tcp://", dashboard_address=None
)
print(cluster.scheduler_address, flush=True)
time.sleep(600)
"""


@pytest.fixture
def cluster(tmp_path):
    """A one-worker Dask cluster in its own process and folder (``tmp_path/cluster``):
    (address, process)."""
    home = tmp_path / "cluster"
    home.mkdir()
    env = os.environ | {
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    }
    process = subprocess.Popen(
        [sys.executable, "-c", CLUSTER], cwd=home, stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        address = process.stdout.readline().strip()
        assert address.startswith("tcp://"), address
        yield address, process
    finally:
        process.kill()
        process.wait(timeout=60)


def test_on_dask_worker_labels_p2pdp_errors_with_the_worker(tmp_path, monkeypatch):
    import dask.distributed

    worker = type("Worker", (), {"address": "tcp://10.0.0.2:40001"})()
    monkeypatch.setattr(dask.distributed, "get_worker", lambda: worker)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError) as caught, on_dask_worker():
        raise DataError(f"data.path = 'x.csv': no such file ({Path.cwd() / 'x.csv'})")
    assert str(caught.value) == (
        "on Dask worker tcp://10.0.0.2:40001: data.path = 'x.csv': no such file "
        "(<the worker's folder>/x.csv)"
    )
    with pytest.raises(ValueError, match="^a bug$"), on_dask_worker():
        raise ValueError("a bug")  # not p2pdp's: unchanged, its traceback shown


def test_the_dask_tasks_label_their_errors(folder, monkeypatch):
    """What runs on a worker is labelled: the training task (and the cell task, which runs
    the same code through on_dask_worker)."""
    import dask.distributed

    worker = type("Worker", (), {"address": "tcp://10.0.0.3:4", "log_event": print})()
    monkeypatch.setattr(dask.distributed, "get_worker", lambda: worker)
    scenario = parse_scenario(CSV.replace("rows.csv", "elsewhere.csv"))
    (cell,) = [c for c in make_cells(scenario) if c.fold == 0]
    with pytest.raises(DataError, match="^on Dask worker tcp://10.0.0.3:4: data.path = 'else"):
        run_dask._dask_prepare(cell, "topic")


@pytest.mark.slow  # ~12 s; the two tests above cover the same wiring fast
def test_an_error_on_a_dask_worker_says_which_worker_not_its_folder(folder, capsys, cluster):
    address, _ = cluster
    line = error_line(capsys, ["run", "csv.toml", "--out", "out", "--scheduler", address])
    # rows.csv is in this folder, not in the worker's
    assert line.startswith(f"p2pdp: error: on Dask worker {address.rsplit(':', 1)[0]}")
    assert "data.path = 'rows.csv': no such file (<the worker's folder>/rows.csv)" in line
    assert str(folder / "cluster") not in line


def test_a_lost_dask_scheduler_is_one_line_with_the_resume_command(
    folder, capsys, cluster, monkeypatch
):
    address, process = cluster
    append = results_module.ResultsStore.append

    def kill_after_the_first_cell(store, records):
        append(store, records)
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=60)

    monkeypatch.setattr(results_module.ResultsStore, "append", kill_after_the_first_cell)
    argv = ["run", "synthetic.toml", "--out", "out", "--scheduler", address]
    line = error_line(capsys, argv)
    assert f"--scheduler {address}: lost the Dask scheduler mid-run" in line
    assert line.endswith("finish with: p2pdp run synthetic.toml --out out --resume")
    assert read_manifest(folder / "out")["status"] == "failed"
    monkeypatch.undo()
    monkeypatch.chdir(folder)
    assert main(["run", "synthetic.toml", "--out", "out", "--jobs", "1", "--resume"]) == 0
    assert len(read_results(folder / "out")) == 12


def test_scheduler_watch_turns_cancelled_futures_into_one_error():
    from distributed.client import FutureCancelledError

    class Client:
        scheduler = type("Rpc", (), {"address": "tcp://10.0.0.1:8786"})()

    with pytest.raises(ClusterLostError, match=r"tcp://10.0.0.1:8786: lost .* \(gone\)"):
        with scheduler_watch(Client()):
            raise FutureCancelledError("key", "gone")
    with pytest.raises(ValueError, match="a bug"), scheduler_watch(Client()):
        raise ValueError("a bug")  # anything else passes unchanged


# --- re-probe (w5-review) -----------------------------------------------------------------------
def test_a_near_binary_label_is_shown_as_it_is(folder, capsys):
    """A label of 1.0000001 was reported as "label 1 is not 0 or 1", which contradicts itself."""
    lines = (folder / "rows.csv").read_text().splitlines()
    lines[4] = lines[4].rsplit(",", 1)[0] + ",1.0000001"
    (folder / "rows.csv").write_text("\n".join(lines) + "\n")
    line = error_line(capsys, ["run", "csv.toml", "--out", "out"])
    assert line == "p2pdp: error: rows.csv, line 5: label 1.0000001 is not 0 or 1 (or -1 or +1)"


def test_observers_that_are_not_a_tuple_or_never_called_are_refused():
    """simulate(observers=3) raised a bare TypeError; observers given to an iterative protocol
    were accepted and never called."""
    config = ScenarioConfig(
        data=DataConfig(dataset="synthetic", synthetic_rows=200, synthetic_features=4),
        partition=PartitionConfig(n_peers=8),
        groups=GroupsConfig(group_size=2),
        evaluation=EvaluationConfig(cv_folds=2),
    )
    with pytest.raises(ConfigError, match="observers must be a tuple of WorldObserver"):
        p2pdp.simulate(config, fold=0, observers=3)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="observers must be a tuple of WorldObserver"):
        p2pdp.simulate(config, fold=0, observers=WorldObserver())  # type: ignore[arg-type]
    iterative = dataclasses.replace(
        config, partition=PartitionConfig(n_peers=10), groups=GroupsConfig()
    )
    settings = {"protocol": {"name": "dpsgd", "rounds": 2}, "privacy": {"mechanism": "none"}}
    with pytest.raises(ConfigError, match="protocol.name = 'dpsgd' is iterative and would never"):
        p2pdp.simulate(iterative, fold=0, observers=(WorldObserver(),), **settings)


def test_report_of_a_run_stopped_before_its_first_cell_says_how_to_finish(folder, capsys):
    """A run stopped (Ctrl-C) before any cell finished leaves a manifest and no results: the
    report said "run `p2pdp run` with --out out first", as if nothing had been started."""
    assert main(["run", "synthetic.toml", "--out", "out", "--set", "evaluation.folds=[0]"]) == 0
    (folder / "out" / "results.csv").unlink()
    capsys.readouterr()
    line = error_line(capsys, ["report", "out"])
    assert "out holds no finished cell yet" in line
    assert (
        "finish with: p2pdp run synthetic.toml --out out --set 'evaluation.folds=[0]' --resume"
        in line
    )


def test_a_network_only_setting_on_the_simulator_names_the_runtime_option(folder, capsys):
    """network.seeded_noise on the simulator was refused as "read only with runtime = 'network'
    ... select a component that reads it": no scenario setting is called runtime."""
    argv = ["run", "synthetic.toml", "--out", "o", "--set", "network.seeded_noise=true"]
    line = error_line(capsys, argv)
    assert "read only with runtime = 'network' (chosen by `p2pdp run --runtime`" in line


def test_an_unset_given_twice_says_so(folder, capsys):
    """The second of two --unset of one key said the file does not set it, which it does."""
    argv = ["run", "csv.toml", "--out", "o", "--unset", "partition.n_peers"]
    line = error_line(capsys, [*argv, "--unset", "partition.n_peers"])
    assert line == "p2pdp: error: --unset partition.n_peers is given twice; drop one"


def test_the_default_overlay_degree_too_large_for_few_peers_says_what_to_set(folder, capsys):
    """An iterative run on 10 peers failed on gossip.degree, a setting the user never gave
    (its default 10), without saying it is the default or what to set."""
    argv = ["run", "csv.toml", "--out", "o", "--set", "protocol.name=dpsgd"]
    argv += ["--set", "privacy.mechanism=gaussian", "--set", "privacy.delta=1e-5"]
    argv += ["--unset", "groups.group_size", "--set", "protocol.rounds=2"]
    line = error_line(capsys, argv)
    assert line.endswith("got 10 (its default is 10); set gossip.degree = 9 or lower"), line


@pytest.mark.parametrize("command", [["datasets", "list"], ["components", "mechanism"]])
def test_an_extra_argument_points_to_the_sub_command_help(command, capsys):
    """`p2pdp datasets list extra` pointed to `p2pdp --help`, which does not list its options."""
    line = error_line(capsys, [*command, "extra"])
    assert line == f"p2pdp: error: unrecognized arguments: extra (see `p2pdp {command[0]} --help`)"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["datasets", "--bogus"], "unrecognized arguments: --bogus"),
        (["datasets"], "give an ACTION: list, info or fetch"),
    ],
)
def test_datasets_names_an_unknown_option_before_a_missing_action(argv, message, capsys):
    """`p2pdp datasets --bogus` said "the following arguments are required: ACTION"."""
    line = error_line(capsys, argv)
    assert line == f"p2pdp: error: {message} (see `p2pdp datasets --help`)"


def test_a_wrong_type_for_a_setting_of_fixed_choices_lists_them(folder, capsys):
    """`--set data.bounds=[0,1]` said only "must be a string", not which strings."""
    line = error_line(capsys, ["run", "csv.toml", "--out", "o", "--set", "data.bounds=[0,1]"])
    assert "data.bounds must be a string (one of data, manifest), got [0, 1]" in line


def test_force_and_resume_together_are_refused(folder, capsys):
    """--force discarded the folder's cells and --resume, which keeps them, was ignored."""
    line = error_line(capsys, ["run", "csv.toml", "--out", "o", "--force", "--resume"])
    assert "argument --resume: not allowed with argument --force" in line
    assert line.endswith("(see `p2pdp run --help`)")


def test_an_empty_sweep_override_is_refused(folder, capsys):
    """`--set sweep={}` was accepted and changed nothing: the file's axes stayed."""
    line = error_line(capsys, ["run", "synthetic.toml", "--out", "o", "--set", "sweep={}"])
    assert "--set sweep={}: an empty sweep changes nothing (the file's axes stay)" in line


@pytest.mark.parametrize("text", ["", "# a comment only\n\n"])
def test_an_empty_scenario_file_is_refused(folder, capsys, text):
    """An empty file (the wrong file, or one not saved yet) ran every default silently."""
    (folder / "empty.toml").write_text(text)
    line = error_line(capsys, ["run", "empty.toml", "--out", "o"])
    assert "empty.toml: the scenario file sets nothing (it is empty or only comments)" in line
    assert not (folder / "o").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["--set", 'sweep."privacy.epsilon"=[1, 2, 1]'],
        ["--set", 'sweep."privacy.epsilon,groups.group_size"=[[1, 2], [1, 2]]'],
    ],
)
def test_a_sweep_value_given_twice_is_refused(folder, capsys, argv):
    """A value listed twice collapsed into one grid point: a cell the user counted never ran."""
    line = error_line(capsys, ["run", "synthetic.toml", "--out", "o", *argv])
    assert "lists " in line and " twice; each value is one grid point" in line


def test_a_simulated_transport_setting_on_the_network_runtime_says_how_to_drop_it(capsys, tmp_path):
    """gossip_vs_central sets network.latency: on the network runtime the refusal used to say
    only that it "would change nothing"; it now says the real network's latency is its own,
    how to drop the setting, and how to emulate latency instead."""
    argv = ["run", "gossip_vs_central", "--runtime", "network", "--out", str(tmp_path / "o")]
    line = error_line(capsys, argv)
    assert "network.latency = 'exponential' is read only with runtime = 'simulation'" in line
    assert "`--unset` it" in line and "benchmarks/netns_run.py" in line
