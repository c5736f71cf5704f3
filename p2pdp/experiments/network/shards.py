"""Per-host shard files: each host of a network run holds only its own peers' training rows.

``p2pdp split SCENARIO --hosts N|HOSTSFILE --out DIR`` (:func:`write_host_shards`) cuts the
scenario's data set the way the simulator does (every fold and repetition the scenario runs,
the same preprocessing and partition, :func:`p2pdp.tasks.pipeline.peer_shards`) and writes, per
host ``i`` (peers split over hosts as :func:`p2pdp.net.hosts.hosts_of` splits them):

``host-i.npz`` (format ``p2pdp-host-shards``, version 1; numpy ``savez``, no pickles)
    For each fold ``f`` and repetition ``r``: ``X_f_r`` (n, d) float64, the preprocessed
    training rows of the host's peers; ``y_f_r`` (n,) int8 labels in {-1, +1}; ``peer_f_r``
    (n,) int64, the peer of each row (rows grouped by peer in increasing id, each peer's rows
    in the simulator's shard order); ``bounds_f_r`` () bool, true when the preprocessing's
    bounds were fitted on the pooled training fold (``data_dependent_bounds``).
``host-i.json`` (the manifest, what a hosts file's ``data`` names)
    ``format``, ``version``, ``scenario`` (name) and ``scenario_digest``, ``shard_key`` (the
    SHA-256 of the settings the rows depend on: seed, data, split, CV folds, partition), ``host``,
    ``hosts``, ``peers``, ``folds``, ``repetitions``, ``file`` (the ``.npz``, beside the
    manifest) and its ``sha256``.

A host given its manifest (:func:`read_host_shards`) checks every field against its launch
(the scenario's settings, its index, the host count, its peers, the fold) and the file's
SHA-256, and reads nothing else: it never derives, opens or receives another peer's rows.
Privacy: the rows are the peers' own data, as private as the data set; the preprocessing is
the simulator's, so with data-dependent bounds (``bounds_f_r`` true, the row's
``data_dependent_bounds``) every row was scaled with statistics of the pooled training fold, a
global step outside the DP guarantee, made by whoever ran ``split``.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from p2pdp.config import ScenarioConfig
from p2pdp.core.errors import ConfigError
from p2pdp.experiments.results.lock import make_folder
from p2pdp.net.hosts import hosts_of
from p2pdp.net.iterative_coordinator import check_iterative
from p2pdp.tasks import check_own_rows, make_task
from p2pdp.tasks.pipeline import fold_name, load_training_rows, shard_key

__all__ = ["SHARD_FORMAT", "SHARD_VERSION", "PeerRows", "read_host_shards", "write_host_shards"]

#: The ``format`` and ``version`` of the manifests this module writes and reads.
SHARD_FORMAT = "p2pdp-host-shards"
SHARD_VERSION = 1


def _shard_digest(config: ScenarioConfig) -> str:
    """SHA-256 (hex) of the settings a peer's training rows depend on
    (:func:`p2pdp.tasks.pipeline.shard_key`)."""
    return hashlib.sha256(repr(shard_key(config)).encode("utf-8")).hexdigest()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_host_shards(scenario: Any, hosts: int, out: str | os.PathLike[str]) -> list[Path]:
    """Write one shard file and its manifest per host (module docstring) into ``out``.

    ``scenario``: a :class:`~p2pdp.experiments.scenarios.scenario.Scenario`; its grid points
    must agree on every setting the rows depend on (else ConfigError naming the first that
    differs: one set of files could not serve them all). ``hosts``: from 1 to ``partition.n_peers``.
    Returns the manifests' paths, host by host.
    """
    target = make_folder(Path(out))  # one line if it cannot be a folder, before any data is cut
    points = [point.config for point in scenario.points]
    config = points[0]
    names = ("seed", "data", "evaluation.split", "evaluation.cv_folds", "partition")
    for point in points[1:]:
        for name, a, b in zip(names, shard_key(config), shard_key(point), strict=True):
            if a != b:
                raise ConfigError(
                    f"p2pdp split: the scenario's grid points differ in {name} ({a!r} and "
                    f"{b!r}): their peers hold different rows; split each value separately"
                )
    check_own_rows(make_task(config))  # rows cut by the shared pipeline: a task that reads them
    if config.protocol.iterative:  # D-PSGD and Muffliato run from shard files too
        try:
            check_iterative(config)
        except ConfigError as error:
            raise ConfigError(f"p2pdp split: {error}") from None
    n_peers = config.partition.n_peers
    if not 1 <= hosts <= n_peers:
        raise ConfigError(
            f"p2pdp split: --hosts gives {hosts} hosts for partition.n_peers = {n_peers}: "
            "it must be from 1 to the number of peers"
        )
    folds = sorted({fold for point in points for fold in point.evaluation.fold_indices()})
    owner = hosts_of(n_peers, hosts)
    arrays: list[dict[str, Any]] = [{} for _ in range(hosts)]
    for repetition in range(config.repetitions):
        for fold in folds:
            data, shards = load_training_rows(config, fold=fold, repetition=repetition)
            for host in range(hosts):
                peers = np.flatnonzero(owner == host)
                rows = np.concatenate([shards[peer] for peer in peers])
                arrays[host].update(
                    {
                        f"X_{fold}_{repetition}": data.X_train[rows],
                        f"y_{fold}_{repetition}": data.y_train[rows].astype(np.int8),
                        f"peer_{fold}_{repetition}": np.repeat(
                            peers, [len(shards[peer]) for peer in peers]
                        ).astype(np.int64),
                        f"bounds_{fold}_{repetition}": np.array(data.data_dependent_bounds),
                    }
                )
    manifests = []
    for host in range(hosts):
        shard_file = target / f"host-{host}.npz"
        np.savez(shard_file, **arrays[host])
        manifest = {
            "format": SHARD_FORMAT,
            "version": SHARD_VERSION,
            "scenario": scenario.name,
            "scenario_digest": scenario.digest,
            "shard_key": _shard_digest(config),
            "host": host,
            "hosts": hosts,
            "n_peers": n_peers,
            "peers": np.flatnonzero(owner == host).tolist(),
            "folds": folds,
            "repetitions": config.repetitions,
            "file": shard_file.name,
            "sha256": _sha256(shard_file),
        }
        path = target / f"host-{host}.json"
        path.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        manifests.append(path)
    return manifests


@dataclass(frozen=True, slots=True, kw_only=True)
class PeerRows:
    """One host's peers' training rows of one fold, from its shard file.

    Attributes
    ----------
    peers : (m,) int64 array
        The host's peers, increasing.
    X : (n, d) float64 array
        Their preprocessed training rows.
    y : (n,) int8 array
        Their labels in {-1, +1}.
    shards : tuple of m int64 arrays
        Per peer (in ``peers`` order): the indices of its rows in ``X``.
    data_dependent_bounds : bool
        The preprocessing's bounds were fitted on the pooled training fold.
    """

    peers: np.ndarray
    X: np.ndarray
    y: np.ndarray
    shards: tuple[np.ndarray, ...]
    data_dependent_bounds: bool


def read_host_shards(
    path: str | os.PathLike[str],
    config: ScenarioConfig,
    *,
    host: int,
    hosts: int,
    fold: int,
    repetition: int,
) -> PeerRows:
    """Host ``host`` of ``hosts``'s own rows of ``fold`` / ``repetition``, from the manifest at
    ``path`` (written by :func:`write_host_shards`) and the shard file it names.

    Opens the manifest and that one file, nothing else.

    Raises
    ------
    ConfigError
        Naming the file and the field: a file missing or unreadable, another format or
        version, a manifest for other settings (``shard_key``), another host or host count,
        peers other than this host's, a fold or repetition it does not hold, a shard file whose
        SHA-256 is not the manifest's, or arrays of the wrong shape or values.
    """
    manifest, peers, shard_file = _host_manifest(path, config, host=host, hosts=hosts)
    X, y, owner, bounds = _fold_arrays(shard_file, manifest, fold=fold, repetition=repetition)
    held = np.unique(owner)
    if held.shape != peers.shape or (held != peers).any():
        raise ConfigError(
            f"shard file {shard_file}: peer_{fold}_{repetition} holds rows of peers "
            f"{held.tolist()}, expected exactly this host's {peers.tolist()}"
        )
    shards = tuple(np.flatnonzero(owner == peer) for peer in peers)
    return PeerRows(
        peers=peers,
        X=np.asarray(X, dtype=np.float64),
        y=np.asarray(y, dtype=np.int8),
        shards=shards,
        data_dependent_bounds=bool(bounds),
    )


def _host_manifest(
    path: str | os.PathLike[str], config: ScenarioConfig, *, host: int, hosts: int
) -> tuple[dict[str, Any], np.ndarray, Path]:
    """``(manifest, peers, shard_file)``: the manifest at ``path``, checked against this run
    (format, version, settings, hosts, this host and its peers), the peers it holds and the
    shard file it names, whose SHA-256 is the manifest's (see :func:`read_host_shards`)."""
    where = os.fspath(path)
    try:
        manifest = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ConfigError(f"shard manifest {where}: cannot be read: {error}") from None
    if not isinstance(manifest, dict):
        raise ConfigError(f"shard manifest {where}: must be a JSON object")

    rerun = (
        ": rerun `p2pdp split SCENARIO --hosts N --out DIR` with this run's scenario and hosts, "
        "and give each host its new manifest"
    )

    def field(name: str, expected: Any, what: str, advice: str = "") -> None:
        value = manifest.get(name)
        if value != expected:
            raise ConfigError(
                f"shard manifest {where}: {name} = {value!r}, expected {expected!r} "
                f"({what}){advice}"
            )

    field("format", SHARD_FORMAT, "a manifest written by `p2pdp split`")
    field("version", SHARD_VERSION, "the version this p2pdp reads", rerun)
    n_peers = config.partition.n_peers
    if manifest.get("n_peers", n_peers) != n_peers:  # (manifests of version 1 may lack it)
        raise ConfigError(
            f"shard manifest {where}: split for partition.n_peers = {manifest['n_peers']!r}, "
            f"this run has {n_peers}{rerun}"
        )
    field("shard_key", _shard_digest(config), "the rows of this run's seed, data and partition",
          rerun)  # fmt: skip
    field("hosts", hosts, "this run's number of hosts", rerun)
    field("host", host, "this host's index: the hosts file names another host's data")
    peers = np.flatnonzero(hosts_of(config.partition.n_peers, hosts) == host)
    field("peers", peers.tolist(), "the peers this run gives this host")
    name = manifest.get("file")
    if not isinstance(name, str) or Path(name).name != name:
        raise ConfigError(
            f"shard manifest {where}: file = {name!r}, expected the name of a file beside it"
        )
    shard_file = Path(path).parent / name
    try:
        digest = _sha256(shard_file)
    except OSError as error:
        raise ConfigError(f"shard manifest {where}: file {shard_file}: {error}") from None
    field("sha256", digest, f"the SHA-256 of {shard_file}")
    return manifest, peers, shard_file


def _fold_arrays(
    shard_file: Path, manifest: dict[str, Any], *, fold: int, repetition: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, Any]:
    """``(X, y, owner, bounds)`` of ``fold`` / ``repetition`` in ``shard_file``: the rows
    (shape (n, d), finite), their labels (shape (n,), -1 or +1), each row's peer and whether
    the data's bounds depend on the data; ConfigError naming the array that is missing or
    wrong."""
    suffix = f"_{fold}_{repetition}"
    with np.load(shard_file, allow_pickle=False) as arrays:
        missing = [n for n in ("X", "y", "peer", "bounds") if f"{n}{suffix}" not in arrays]
        if missing:
            raise ConfigError(
                f"shard file {shard_file}: holds no {missing[0]}{suffix}, the rows of "
                f"{fold_name(fold, repetition)} (folds {manifest.get('folds')}, repetitions "
                f"{manifest.get('repetitions')})"
            )
        X, y = arrays[f"X{suffix}"], arrays[f"y{suffix}"]
        owner, bounds = arrays[f"peer{suffix}"], arrays[f"bounds{suffix}"]
    n = len(owner)
    if X.ndim != 2 or X.shape[0] != n or y.shape != (n,) or not np.isfinite(X).all():
        raise ConfigError(
            f"shard file {shard_file}: X{suffix} {X.shape} and y{suffix} {y.shape} must be "
            f"finite (n, d) and (n,) with n = {n} rows"
        )
    if not np.isin(y, (-1, 1)).all():
        raise ConfigError(f"shard file {shard_file}: y{suffix} must hold labels -1 and +1")
    return X, y, owner, bounds
