"""Tests of p2pdp.privacy.events: every event with a ``relation`` field refuses one outside
:data:`~p2pdp.privacy.events.RELATIONS`."""

from __future__ import annotations

import pytest

from p2pdp.core.errors import ConfigError
from p2pdp.privacy.events import (
    ADD_REMOVE,
    REPLACE_ONE,
    DistributionalEvent,
    EpsilonDeltaEvent,
    GaussianEvent,
    LaplaceEvent,
    NonPrivateEvent,
    SubsampledGaussianEvent,
)

#: One valid construction of each event that states a relation, without the relation.
MAKERS = {
    "EpsilonDeltaEvent": lambda **kw: EpsilonDeltaEvent(1.0, 1e-6, **kw),
    "DistributionalEvent": lambda **kw: DistributionalEvent(1.0, 0.0, threat_model="t", **kw),
    "GaussianEvent": lambda **kw: GaussianEvent(2.0, 1.0, 1e-6, **kw),
    "LaplaceEvent": lambda **kw: LaplaceEvent(1.0, **kw),
    "SubsampledGaussianEvent": lambda **kw: SubsampledGaussianEvent(1.0, 0.01, **kw),
}


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_every_relation_field_is_checked(name: str) -> None:
    make = MAKERS[name]
    for relation in (REPLACE_ONE, ADD_REMOVE):
        assert make(relation=relation).relation == relation
    with pytest.raises(ConfigError, match=rf"{name}\.relation must be one of .*got 'none'"):
        make(relation="none")


def test_non_private_event_states_no_relation() -> None:
    event = NonPrivateEvent("no noise")
    assert event.relation == "none"
    assert not event.private
