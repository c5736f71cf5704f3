"""One host process of a network run: what it computes and serves, cell after cell.

A host reads its cells' launch bundles (from its standard input, :func:`host_from_stdin`, or
from the pipe of the process that spawned it), and for each computes its own peers'
statistics (:func:`host_main`: from its shard file ``data`` alone, or from the whole fold
derived from the seed, keeping its own) and serves them (:func:`p2pdp.net.host.serve`) until
the coordinator ends the cell. The launch bundle carries no private key: the host makes its
own key pair and enrolls with a one-time ticket. ``python -m p2pdp.experiments.network``
runs :func:`host_from_stdin`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import sys
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from p2pdp.config import ScenarioConfig
from p2pdp.core.errors import P2PDPError
from p2pdp.core.parallel import worker_signals
from p2pdp.core.rng import generator, os_generator
from p2pdp.net.gossip_host import GossipSetup
from p2pdp.net.host_process import serve
from p2pdp.net.hosts import EXPLAINED, HostError, HostSettings, Ticket, hosts_of
from p2pdp.privacy.release import Releaser
from p2pdp.sim.world import budget_ledger
from p2pdp.tasks import (
    check_min_shard_size,
    make_task,
    prepared,
    prepared_own,
    release_path,
    sensitivity_of,
    task_statistics,
)

__all__ = ["host_from_stdin", "host_main"]


def _settings(
    config: ScenarioConfig, releaser: Releaser | None, hosts: int, allowed: tuple[str, ...] = ()
) -> HostSettings:
    """What every host knows of the run; ``releaser`` None: the coordinator's, which holds
    no statistic (it reads none of what the releases' dimension decides)."""
    affords = {}
    if releaser is not None:
        ledger = budget_ledger(config, releaser, config.partition.n_peers)
        affords = dict(releases_per_peer=int(ledger.max_aggregations))
    return HostSettings(
        n_peers=config.partition.n_peers,
        hosts=hosts,
        full_publication=config.publication.mode == "full",
        min_shard_size=config.privacy.min_shard_size or 1,
        collect_timeout=config.groups.collect_timeout,
        # waits for a frame, a connection or a report: as long as a group, within [1, 10] s
        timeout=min(10.0, max(1.0, config.groups.collect_timeout)),
        seeded_noise=config.network.seeded_noise,
        group_size=config.groups.group_size,
        max_concurrent=config.groups.max_concurrent_groups,
        allowed=allowed,
        **affords,
    )


def host_main(
    config: ScenarioConfig,
    fold: int,
    repetition: int,
    host: int,
    hosts: int,
    ticket: Ticket,
    coordinator: str = "127.0.0.1",
    address: str = "127.0.0.1",
    allowed: tuple[str, ...] = (),
    data: str | None = None,
    kept: dict[tuple, Any] | None = None,
) -> None:
    """Host process ``host`` of ``hosts``, one cell: its peers' statistics (from its own
    shard file ``data``, else from the whole fold derived from the seed), enroll with
    ``ticket`` (a key pair of its own, made here) and serve them on ``address`` until the
    coordinator at ``coordinator`` ends the cell (mutual TLS), accepting connections only
    from ``allowed`` (if any). ``kept``: the previous cell's statistics, reused if this cell
    has the same training key (cleared and refilled otherwise)."""
    logging.basicConfig(level=logging.WARNING, format=f"host {host}: %(message)s")
    worker_signals()  # a Ctrl-C is the coordinator's to handle: it ends the run, and the hosts
    if config.protocol.iterative:
        from p2pdp.experiments.network.iterative import iterative_host_main

        iterative_host_main(config, fold, repetition, host, hosts, ticket, coordinator=coordinator,
                            address=address, allowed=allowed, data=data)  # fmt: skip
        return
    task = make_task(config)
    try:
        key = (task.training_key(fold=fold, repetition=repetition), host, hosts, data)
        if kept is None or key not in kept:
            made = _own_statistics(task, config, fold, repetition, host, hosts, data)
            if kept is not None:  # one training key at a time: a run's cells come by key
                kept.clear()
                kept[key] = made
        else:
            made = kept[key]
        peers, own, own_sizes, bounds = made
        if config.privacy.min_shard_size is not None:  # its own peers', named by their ids
            sizes = np.full(config.partition.n_peers, config.privacy.min_shard_size)
            sizes[peers] = own_sizes
            check_min_shard_size(sizes, config.privacy.min_shard_size)
    except P2PDPError as error:  # one line, not a traceback: it names what to fix
        print(f"p2pdp host {host}: {error}", file=sys.stderr)
        sys.exit(EXPLAINED)
    _, releaser, rngs = release_path(config, task, own.shape[-1], fold=fold, repetition=repetition)
    gossip = None
    if config.groups.sampler == "gossip":
        gossip = _gossip_setup(config, peers, releaser, rngs["protocol"], host, fold, repetition)
    try:
        asyncio.run(
            serve(
                peers,
                own,
                own_sizes,
                releaser=releaser,
                sensitivity=sensitivity_of(task, config.privacy.min_shard_size),
                settings=_settings(config, releaser, hosts, allowed),
                host_index=host,
                ticket=ticket,
                coordinator=coordinator,
                address=address,
                data_dependent_bounds=bounds,
                gossip=gossip,
            )
        )
    except (HostError, P2PDPError) as error:  # one line, not a traceback: it names what to fix
        print(f"p2pdp host {host}: {error}", file=sys.stderr)
        sys.exit(EXPLAINED)


def _gossip_setup(
    config: ScenarioConfig,
    peers: np.ndarray,
    releaser: Releaser,
    protocol: np.random.Generator,
    host: int,
    fold: int,
    repetition: int,
) -> GossipSetup:
    """What host ``host`` needs to run its ``peers``' gossip formation: their first views
    (the simulator's bootstrap from the overlay, both drawn from the run's protocol stream as
    the simulator draws them: public, every host derives the same), and the host's formation
    stream: from the OS CSPRNG, or with ``network.seeded_noise`` from the seed (per host)."""
    from p2pdp.sim.gossip.views import Newscast, merge_views
    from p2pdp.sim.overlay import build_overlay

    n_peers = config.partition.n_peers
    views = Newscast(build_overlay(config.gossip, n_peers, rng=protocol),
                     config.gossip.view_size, rng=protocol)  # fmt: skip
    seeded = config.network.seeded_noise
    ledger = budget_ledger(config, releaser, n_peers)
    return GossipSetup(
        params=config.gossip,
        group_size=config.groups.group_size,
        max_failed=config.groups.max_failed_attempts,
        collect_timeout=config.groups.collect_timeout,
        ids=views.ids[peers],
        stamps=views.stamps[peers],
        merge=merge_views,
        rng=generator(config.seed, "gossip host", host, fold, repetition)
        if seeded
        else os_generator(),
        solvent=bool(ledger.max_aggregations),
    )


def _own_statistics(
    task: Any,
    config: ScenarioConfig,
    fold: int,
    repetition: int,
    host: int,
    hosts: int,
    data: str | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """Host ``host``'s peers (m,), their statistics (m, d), shard sizes (m,) and whether
    their rows were scaled with bounds fitted on the pooled training fold: from its shard
    file ``data`` alone, or (None) from the whole fold, keeping its own."""
    from p2pdp.experiments.network.shards import read_host_shards

    n_peers = config.partition.n_peers
    if data is not None:
        rows = read_host_shards(
            data, config, host=host, hosts=hosts, fold=fold, repetition=repetition
        )
        trained = prepared_own(
            task,
            rows.X,
            rows.y,
            rows.shards,
            data_dependent_bounds=rows.data_dependent_bounds,
            fold=fold,
            repetition=repetition,
        )
        statistics, sizes = task_statistics(task, trained, len(rows.peers))
        return rows.peers, statistics, sizes, rows.data_dependent_bounds
    whole = prepared(task, fold=fold, repetition=repetition)
    statistics, sizes = task_statistics(task, whole, n_peers)
    peers = np.flatnonzero(hosts_of(n_peers, hosts) == host)
    bounds = bool(getattr(getattr(whole, "fold", None), "data_dependent_bounds", False))
    return peers, statistics[peers].copy(), sizes[peers].copy(), bounds


def _host_loop(connection: Any) -> None:
    """A spawned host (:class:`~p2pdp.experiments.network.processes._Spawned`): serve the
    cells whose launch bundles arrive on ``connection``, saying when each is over, until its
    other end closes (the run is over, or the coordinator died)."""
    _serve_cells(_received_bundles(connection), lambda: connection.send(None))


def _received_bundles(connection: Any) -> Iterator[dict[str, Any]]:
    """The bundles on ``connection`` until None or its end."""
    while True:
        try:
            bundle = connection.recv()
        except (EOFError, OSError):
            return
        if bundle is None:
            return
        yield bundle


def _serve_cells(bundles: Iterator[dict[str, Any]], over: Callable[[], object]) -> None:
    """Serve each cell of ``bundles`` (:func:`host_main`), calling ``over()`` after each;
    what a cell prepared is kept for the next cell of the same training key."""
    kept: dict[tuple, Any] = {}
    for bundle in bundles:
        host_main(**bundle, kept=kept)
        over()


def host_from_stdin() -> None:
    """A host started by a hosts file's command: its cells' launch bundles (each pickled by
    the coordinator that started it, the only party that writes to this process's standard
    input) name its run, fold, index, ticket (:class:`~p2pdp.net.host.Ticket`: no private
    key) and addresses. It writes one byte on its standard output when a cell is over (what
    it prints goes to its standard error), and exits at the end of its input."""
    done = os.fdopen(os.dup(sys.stdout.fileno()), "wb", buffering=0)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())

    def bundles() -> Iterator[dict[str, Any]]:
        while True:
            try:
                yield pickle.load(sys.stdin.buffer)
            except EOFError:
                return

    _serve_cells(bundles(), lambda: done.write(b"."))
