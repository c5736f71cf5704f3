"""The network runtime's processes: what each host process computes, and how they start.

``simulate(config, runtime="network")`` builds a :class:`p2pdp.net.coordinator.NetworkWorld`
here. Each host is a fresh OS process (``spawn``) that derives the fold from the seed as the
simulator does, trains its own peers' models, keeps only their statistics, and serves them
(:func:`p2pdp.net.host.serve`). Peers are split evenly, in id order, over
:func:`network_hosts` processes.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from p2pdp.config import ScenarioConfig
from p2pdp.net.coordinator import NetworkWorld, check_supported
from p2pdp.net.host import HostSettings, hosts_of, serve
from p2pdp.net.tls import Credential, RunCredentials, host_name
from p2pdp.privacy.release import Releaser
from p2pdp.sim.world import budget_ledger
from p2pdp.tasks import make_task, prepared, release_path, sensitivity_of, task_statistics

__all__ = ["check_network_settings", "host_main", "network_hosts", "network_world"]


def network_hosts(n_peers: int) -> int:
    """Host processes for a run of ``n_peers`` peers: one per CPU core, at most one per peer
    (``P2PDP_NETWORK_HOSTS`` overrides)."""
    wanted = int(os.environ.get("P2PDP_NETWORK_HOSTS", os.cpu_count() or 1))
    return max(1, min(wanted, n_peers))


def _settings(config: ScenarioConfig, hosts: int) -> HostSettings:
    return HostSettings(
        n_peers=config.partition.n_peers,
        hosts=hosts,
        full_publication=config.publication.mode == "full",
        min_shard_size=config.privacy.min_shard_size or 1,
        collect_timeout=config.groups.collect_timeout,
        # waits for a frame, a connection or a report: as long as a group, within [1, 10] s
        timeout=min(10.0, max(1.0, config.groups.collect_timeout)),
    )


def check_network_settings(config: ScenarioConfig) -> None:
    """ConfigError naming a setting of ``config`` the network runtime does not run (before
    anything starts: the runner checks every grid point first)."""
    from p2pdp.privacy.mechanisms import mechanism_class

    check_supported(
        config,
        scale_family=bool(
            getattr(mechanism_class(config.privacy.mechanism), "scale_family", False)
        ),
        per_release=config.privacy.needs_records,
    )


def network_world(
    config: ScenarioConfig,
    releaser: Releaser,
    statistics: np.ndarray,
    *,
    rngs: dict[str, np.random.Generator],
    fold: int,
    repetition: int,
    observers: Sequence[Any] = (),
) -> NetworkWorld:
    """The coordinator of a network run of ``config`` (``statistics``: only for its shape)."""
    check_supported(
        config,
        scale_family=bool(getattr(releaser.mechanism, "scale_family", False)),
        per_release=statistics.ndim == 3,
    )  # the mechanism as built (a plug-in's from_config may differ from its class)
    n_peers = config.partition.n_peers
    hosts = network_hosts(n_peers)
    context = multiprocessing.get_context("spawn")
    credentials = RunCredentials.generate(hosts)

    def launch(host: int, port: int) -> Any:
        credential = credentials.parties[host_name(host)]
        process = context.Process(
            target=host_main,
            args=(config, fold, repetition, host, hosts, port, credential),
            name=f"p2pdp-host-{host}",
            daemon=True,
        )
        process.start()
        return process

    return NetworkWorld(
        config,
        n_peers=n_peers,
        dim=statistics.shape[-1],
        ledger=budget_ledger(config, releaser, n_peers),
        rngs=rngs,
        launch=launch,
        hosts=hosts,
        settings=_settings(config, hosts),
        credentials=credentials,
        observers=observers,
        exact=lambda members: releaser.exact(statistics[members]),
    )


def host_main(
    config: ScenarioConfig,
    fold: int,
    repetition: int,
    host: int,
    hosts: int,
    port: int,
    credential: Credential,
) -> None:
    """Host process ``host`` of ``hosts``: prepare the fold, keep this host's peers'
    statistics, serve them until the coordinator at ``127.0.0.1:port`` ends the run, as
    ``credential`` (mutual TLS)."""
    logging.basicConfig(level=logging.WARNING, format=f"host {host}: %(message)s")
    task = make_task(config)
    statistics, sizes = task_statistics(
        task, prepared(task, fold=fold, repetition=repetition), config.partition.n_peers
    )
    peers = np.flatnonzero(hosts_of(config.partition.n_peers, hosts) == host)
    own, own_sizes = statistics[peers].copy(), sizes[peers].copy()
    del statistics
    _, releaser, _ = release_path(config, task, own.shape[-1], fold=fold, repetition=repetition)
    asyncio.run(
        serve(
            peers,
            own,
            own_sizes,
            releaser=releaser,
            sensitivity=sensitivity_of(task, config.privacy.min_shard_size),
            settings=_settings(config, hosts),
            host_index=host,
            coordinator_port=port,
            credential=credential,
        )
    )
