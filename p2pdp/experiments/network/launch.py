"""The network runtime's coordinator side of one cell: its checks, its world, its hosts.

``simulate(config, runtime="network")`` builds a :class:`p2pdp.net.coordinator.NetworkWorld`
here (:func:`network_world`), after :func:`check_network_settings` refused what the runtime
does not run. Each host is an OS process that serves its own peers' statistics
(:mod:`p2pdp.experiments.network.host`), started once per run and serving every cell of it,
each cell a session of its own (:func:`network_session`;
:class:`~p2pdp.experiments.network.processes.RunHosts`). Peers are split evenly, in id order,
over the host processes; how many there are and where they run is
:mod:`p2pdp.experiments.network.hosts_file`.
Where a hosts file gives each host its ``data`` (a per-host shard file written by ``p2pdp
split``, :mod:`p2pdp.experiments.network.shards`), the host reads only that file and trains only its
own peers' models: it never derives, opens or receives another peer's rows or model. Without
it (a host count, or a hosts file without ``data``), each host derives the whole fold from the
seed as the simulator does (every peer's data and local model: a simulation shortcut) and
keeps only its own peers' statistics.

By default the process that runs :func:`~p2pdp.experiments.run.simulation.simulate` (the
coordinator) is also the experimenter who scores the run: it derives the fold itself to score
every peer's ensemble on the test rows, the centralised reference and the releases'
``noise_norm`` (analysis columns, never sent to any host). With per-host data, a hosts file's
``score = false`` makes a coordinator that opens no data at all: it learns the statistics'
length from the hosts and leaves those columns empty
(:data:`~p2pdp.experiments.run.oneshot.UNSCORED`). Either way the coordinator's protocol code
(:class:`~p2pdp.net.coordinator.NetworkWorld`) reads no training data.
"""

from __future__ import annotations

import ast
import sys
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from p2pdp.config import ScenarioConfig, refuse_unread, settings_read, unread_settings
from p2pdp.core.errors import ConfigError
from p2pdp.experiments.network.host import _settings
from p2pdp.experiments.network.hosts_file import hosts_plan
from p2pdp.experiments.network.processes import _RUN_HOSTS, RunHosts
from p2pdp.net.coordinator import NetworkWorld, check_supported
from p2pdp.net.hosts import Ticket
from p2pdp.net.iterative_coordinator import check_iterative
from p2pdp.net.tls import Authority
from p2pdp.privacy.accounting import BudgetLedger
from p2pdp.privacy.release import Releaser
from p2pdp.sim.world import budget_ledger
from p2pdp.tasks import (
    make_task,
)

__all__ = ["check_network_settings", "network_session", "network_world"]


def check_network_settings(config: ScenarioConfig) -> None:
    """ConfigError naming a setting of ``config`` the network runtime does not run, or a host
    count it cannot have (:func:`~p2pdp.experiments.network.hosts_file.hosts_plan`), before
    anything starts (the runner checks every grid point first,
    :func:`~p2pdp.experiments.run.simulation.simulate` its config)."""
    from p2pdp.privacy.mechanisms import mechanism_class
    from p2pdp.tasks import check_own_rows

    _, plan = hosts_plan(config.partition.n_peers)
    if plan is not None and not plan.score and config.protocol.iterative:
        raise ConfigError(
            f"protocol.name = {config.protocol.name!r} cannot run with a coordinator that holds "
            "no data (a hosts file's score = false): its rounds table measures every round's "
            "models on the test rows"
        )
    if plan is not None and plan.data:  # each host prepares its peers from its own rows
        task = make_task(config)
        check_own_rows(task)
        if not plan.score and not callable(getattr(task, "score_columns", None)):
            raise ConfigError(
                f"task.name = {task.name!r} cannot run with a coordinator that holds no data "
                "(a hosts file's score = false): the task declares no score_columns(), the "
                "columns to leave empty"
            )
    # the simulated transport model (network.*): the runtime reads none of it (NetworkWorld's
    # reads), refused here too for a config built in Python (no scenario file checked it)
    read = settings_read(config, "network")
    refuse_unread(
        [key for key in unread_settings(config, read) if key.startswith("network.")], config, read
    )
    if config.protocol.iterative:
        check_iterative(config)
        return
    if config.groups.sampler == "gossip":  # the hosts build the overlay: check it here, once
        from p2pdp.sim.overlay import check_overlay

        check_overlay(config.gossip, config.partition.n_peers)
    check_supported(
        config,
        scale_family=bool(
            getattr(mechanism_class(config.privacy.mechanism), "scale_family", False)
        ),
        per_release=config.privacy.needs_records,
    )


def network_world(
    config: ScenarioConfig,
    releaser: Releaser | Callable[[int], Releaser],
    statistics: np.ndarray | None,
    *,
    rngs: dict[str, np.random.Generator],
    fold: int,
    repetition: int,
    observers: Sequence[Any] = (),
) -> NetworkWorld:
    """The coordinator of a network run of ``config``.

    ``statistics`` (P, d): every peer's, only for ``d`` and the releases' ``noise_norm``
    (analysis); None for a coordinator that holds no data (a hosts file's ``score =
    false``): then the hosts say ``d`` and ``releaser(d)`` makes the run's releaser.
    """
    n_peers = config.partition.n_peers

    def ledger(dim: int) -> BudgetLedger:
        made = releaser(dim) if callable(releaser) else releaser
        check_supported(
            config,
            scale_family=bool(getattr(made.mechanism, "scale_family", False)),
            per_release=statistics is not None and statistics.ndim == 3,
        )  # the mechanism as built (a plug-in's from_config may differ from its class)
        return budget_ledger(config, made, n_peers)

    exact = None
    if statistics is not None:  # analysis only: the noise each release carries
        made = releaser(statistics.shape[-1]) if callable(releaser) else releaser

        def exact(members: np.ndarray) -> np.ndarray:
            return made.exact(statistics[members])

    session = network_session(config, fold=fold, repetition=repetition)
    allowed = session.pop("allowed")
    return NetworkWorld(
        config,
        n_peers=n_peers,
        dim=None if statistics is None else statistics.shape[-1],
        ledger=ledger,
        rngs=rngs,
        settings=_settings(config, None, session["hosts"], allowed),
        observers=observers,
        exact=exact,
        **session,
    )


def network_session(config: ScenarioConfig, *, fold: int, repetition: int) -> dict[str, Any]:
    """What a coordinator of one cell needs to start its hosts, whatever the protocol:
    ``launch`` (host, ticket) -> process (the run's hosts,
    :class:`~p2pdp.experiments.network.processes.RunHosts`, or this cell's own), ``hosts``,
    the cell's ``authority``, ``bind`` and the listeners' ``allowed`` addresses."""
    hosts, plan = hosts_plan(config.partition.n_peers)
    if plan is None:  # spawned hosts import the main script again
        _check_main_guard()
    shared = _RUN_HOSTS.get()
    served = shared if shared is not None else RunHosts()  # this run's only cell

    def launch(host: int, ticket: Ticket) -> Any:
        # the launch bundle: no private key (each host makes its own), a one-time token
        bundle = dict(config=config, fold=fold, repetition=repetition, host=host, hosts=hosts,
                      ticket=ticket)  # fmt: skip
        if plan is not None:
            bundle.update(coordinator=plan.coordinator, address=plan.addresses[host],
                          allowed=plan.allowed)  # fmt: skip
            if plan.data:
                bundle.update(data=plan.data[host])
        # without a run's hosts (simulate called alone) the host exits after this cell
        return served.launch(host, (hosts, plan), bundle, last=shared is None)

    return {
        "launch": launch,
        "hosts": hosts,
        "authority": Authority(hosts),  # its keys stay in this process
        "bind": plan.bind if plan else "127.0.0.1",
        "allowed": plan.allowed if plan else (),
    }


def _is_main_test(test: ast.expr) -> bool:
    """``test`` is ``__name__ == "__main__"`` (either way round)."""
    if not isinstance(test, ast.Compare) or len(test.ops) != 1:
        return False
    if not isinstance(test.ops[0], ast.Eq):
        return False
    sides = [test.left, *test.comparators]
    names = [s.id for s in sides if isinstance(s, ast.Name)]
    values = [s.value for s in sides if isinstance(s, ast.Constant)]
    return names == ["__name__"] and values == ["__main__"]


def _check_main_guard() -> None:
    """Exit with one line if this process runs its main script's top level outside
    ``if __name__ == "__main__":``: each spawned host would import that script again and
    start the run again (a traceback per host). Nothing is checked without a script file
    (an interactive session, ``python -c``, a notebook)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    frame: types.FrameType | None = sys._getframe()
    while frame is not None and not (
        frame.f_code.co_name == "<module>" and main is not None and frame.f_globals is vars(main)
    ):
        frame = frame.f_back
    if frame is None or path is None:
        return
    line = frame.f_lineno
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"), path)
    except (OSError, SyntaxError, ValueError):
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_main_test(node.test):
            if node.lineno <= line <= (node.end_lineno or node.lineno):
                return
    raise SystemExit(
        f"p2pdp: error: the network runtime was started at the top level of {path} (line "
        f'{line}): put that under `if __name__ == "__main__":` (each host process imports '
        "the main script again, and would start the run again)"
    )
