"""What several test files of tests/net/ share: the tiny scenario the network runs use, the
seeded parity check against the simulator, hosts driven in this process, credentials.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from p2pdp.config import (
    ScenarioConfig,
)
from p2pdp.net.coordinator import NetworkWorld
from p2pdp.net.host import PeerHost
from p2pdp.net.hosts import HostSettings
from p2pdp.net.tls import (
    Authority,
    Credential,
    host_name,
    new_key,
    signing_request,
)
from p2pdp.net.wire import (
    pack_vector,
)
from p2pdp.privacy.accounting import BudgetLedger
from p2pdp.privacy.mechanisms import make_mechanism
from p2pdp.privacy.release import Releaser
from tests.conftest import tiny_config

TIMING = {"sim_time", "wall_training_s", "wall_simulation_s", "wall_evaluation_s"}


#: Secure aggregation: splittable noise, and the public shard-size bound the network needs.
SECURE = {"mechanism": "coordinate-laplace", "secure_aggregation": True, "min_shard_size": 20}


def _seeded(config: ScenarioConfig) -> ScenarioConfig:
    """``config`` with ``network.seeded_noise``: the simulator's releases, NOT private."""
    return dataclasses.replace(
        config, network=dataclasses.replace(config.network, seeded_noise=True)
    )


def _config(mode: str, *, secure: bool = False, **groups) -> ScenarioConfig:
    return tiny_config(
        seed=11,
        data={"synthetic_rows": 360, "synthetic_test_rows": 120},
        partition={"n_peers": 12},
        groups={"group_size": 3, **groups},
        privacy={"epsilon": 1.0, "epsilon_per_aggregation": 0.25, **(SECURE if secure else {})},
        publication={"mode": mode},
        evaluation={"split": "fixed"},
    )


def _same_rows(simulated, network, *, refused=0, lost=0):
    """The simulator's row and the network's are the same, but for the messages the network
    refused (``refused``) and, of those, the honest ones not delivered (``lost``)."""
    a, b = simulated.row(), network.row()
    # the only mode with the simulator's rows; the simulator does not read the setting
    assert b["network.seeded_noise"] is True and a["network.seeded_noise"] is None
    assert a["messages_refused"] == 0 and b["messages_refused"] == refused
    assert a["messages_lost"] == 0 and b["messages_lost"] == lost
    # floats with a tolerance: two processes, two code paths
    for key in a.keys() - TIMING - {"network.seeded_noise", "messages_refused", "messages_lost"}:
        if key.startswith("network."):  # the simulated network's: a real one reads none
            assert b[key] is None, key
            continue
        if isinstance(a[key], float):
            assert b[key] == pytest.approx(a[key], rel=1e-9, nan_ok=True), key
        else:
            assert a[key] == b[key], (key, a[key], b[key])


def _tiny_scenario(tmp_path, publication="group"):
    """A scenario file of ``_config``'s settings (12 peers, g = 3, 4 aggregations each)."""
    scenario = tmp_path / "tiny.toml"
    scenario.write_text(
        'name = "tiny"\nseed = 11\n[data]\ndataset = "synthetic"\nsynthetic_rows = 360\n'
        "synthetic_test_rows = 120\n[partition]\nn_peers = 12\n[groups]\ngroup_size = 3\n"
        "[privacy]\nepsilon = 1.0\nepsilon_per_aggregation = 0.25\n[publication]\n"
        f'mode = "{publication}"\n[evaluation]\nsplit = "fixed"\n'
    )
    return scenario


def _credentials(hosts):
    """A run's authority and, keyed by name, the coordinator's credential and one per host,
    each host's made as a host makes it (its own key, a signing request, its token)."""
    authority = Authority(hosts)
    parties = {"coordinator": authority.credential}
    for host in range(hosts):
        key = new_key()
        certificate = authority.enroll(
            host, authority.token(host), signing_request(host_name(host), key)
        )
        parties[host_name(host)] = Credential(
            name=host_name(host), certificate=certificate, key=key, authority=authority.certificate
        )
    return authority, parties


def _coordinator(*, launch, dim=2):
    """A coordinator of 12 peers on 2 hosts started by ``launch``, outside any run."""
    return NetworkWorld(
        _config("group"),
        n_peers=12,
        dim=dim,
        ledger=BudgetLedger(12, epsilon_total=1.0, epsilon_per_aggregation=0.25),
        rngs={"protocol": np.random.default_rng(0)},
        launch=launch,
        hosts=2,
        settings=HostSettings(n_peers=12, hosts=2, full_publication=False),
        authority=Authority(2),
    )


def _host(reports, *, mechanism="vector-laplace", seeded_noise=False, **settings):
    mechanism = make_mechanism(mechanism, epsilon=1.0)
    releaser = Releaser(
        mechanism,
        2,
        aggregate="mean",
        secure=False,
        noise_rng=np.random.default_rng(0),
        share_rng=np.random.default_rng(1),
    )
    host = PeerHost(
        np.array([0, 1]),
        np.array([[0.1, 0.2], [0.3, 0.4]]),
        np.array([5, 7]),
        releaser=releaser,
        sensitivity=lambda sizes: 2.0 / min(sizes),
        settings=HostSettings(
            **{"n_peers": 3, "hosts": 1, "full_publication": False, **settings},
            seeded_noise=seeded_noise,
        ),
        report=reports.append,
    )
    host.send = lambda send, group, **fields: reports.append(("sent", send))  # no sockets
    return host


def _tls_host(credential, settings):
    """A host of peers 0 and 1 with ``credential`` (mutual TLS) and ``settings``."""
    return PeerHost(
        np.array([0, 1]),
        np.array([[0.1, 0.2], [0.3, 0.4]]),
        np.array([5, 7]),
        releaser=_host([]).releaser,
        sensitivity=lambda sizes: 2.0 / min(sizes),
        settings=settings,
        report=lambda message: None,
        credential=credential,
    )


def _submit(sender=2, size=6, **changes):
    message = {
        "kind": "submit",
        "sender": sender,
        "group": 0,
        "members": [0, 1, 2],
        "curator": 0,
        "size": size,
        "statistic": pack_vector(np.array([1.0, 2.0])),
    }
    return {**message, **changes}


ASSIGN_0 = {"kind": "assign", "sender": -1, "group": 0, "members": [0, 1, 2], "curator": 0,
            "release": 0, "timeout": 60.0}  # fmt: skip


def _full_publication(sender, group):
    return {"kind": "publish", "sender": sender, "group": group, "index": group,
            "model": pack_vector(np.zeros(2))}  # fmt: skip
