"""Settings tables live beside their readers and declare what their options read (issue 41).

:mod:`p2pdp.config` composes the tables; what an option reads for some of its values is declared
on its table (``option_reads``) and what a runtime reads is data (``RUNTIME_READS``), so that
checking a config loads no runtime.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from p2pdp.config import RUNTIME_READS, SECTIONS
from p2pdp.core.reads import When

_OPTIONS = [
    (section, entry)
    for section, table in SECTIONS.items()
    for entry in getattr(table, "option_reads", ())
]


@pytest.mark.parametrize(("section", "entry"), _OPTIONS, ids=lambda x: str(x))
def test_an_option_read_names_a_value_its_option_accepts(section, entry):
    """A misspelt value (``"label-skew"``) would never hold, and its settings would be refused."""
    assert isinstance(entry, When) and not entry.negate
    table_key, _, name = entry.key.partition(".")
    assert table_key == section, f"{entry} is declared on [{section}], not on its option's table"
    (field,) = [f for f in dataclasses.fields(SECTIONS[section]) if f.name == name]
    field.metadata["constraint"].check(entry.key, entry.value)  # raises for a value it refuses


def test_every_table_with_an_option_that_selects_settings_declares_it():
    declared = {entry.key for _, entry in _OPTIONS}
    assert declared == {
        "partition.scheme",
        "protocol.sampling",
        "gossip.overlay",
        "gossip.churn",
        "network.latency",
        "prevalence.source",
        "prevalence.response",
        "evaluation.split",
    }


def test_the_runtimes_read_what_the_config_check_says_they_read():
    from p2pdp.net.coordinator import NetworkWorld
    from p2pdp.sim.transport import Transport

    assert Transport.reads == RUNTIME_READS["simulation"]
    assert NetworkWorld.reads == RUNTIME_READS["network"]


def test_checking_a_config_loads_no_runtime():
    """No registry loop: config validation does not import the runtimes that import config."""
    script = """
import json, sys
from p2pdp.config import ScenarioConfig, check_reads, readers_of, settings_read, with_value
config = with_value(ScenarioConfig(), "network.seeded_noise", True)
settings_read(config, None)
check_reads(config, "network")
readers_of("network.latency_sigma")
print(json.dumps(sorted(m for m in sys.modules if m.startswith(("p2pdp.net", "p2pdp.sim.t")))))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert json.loads(done.stdout) == []
