"""Which settings a component reads, declared on the component next to the code that reads them.

A component (task, protocol, sampler, mechanism, ...) lists the settings it reads in a class
attribute ``reads``: dotted keys (``"groups.group_size"``), whole tables (``"gossip.*"``) and
:class:`When` entries for settings it reads only while another setting has a given value. From
these declarations :func:`p2pdp.config.settings_read` computes what one config's selected
components read; a setting that none of them reads must keep its default (else it is refused,
naming who would read it) and is left empty in the results rows, and sweep cells that differ
only in unread settings are one cell. ``p2pdp components --reads`` lists the declarations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class When:
    """Settings ``keys`` read only while setting ``key`` has ``value``.

    Example: the logistic task reads ``privacy.sensitivity`` only under the one-shot protocol,
    ``When("protocol.name", "one-shot", ("privacy.sensitivity",))``.
    """

    key: str
    value: Any
    keys: tuple[str, ...]
    #: Read while ``key`` has any value but ``value`` instead.
    negate: bool = False

    def holds(self, value: Any) -> bool:
        """Whether the condition holds when ``key`` has ``value``."""
        return (value == self.value) != self.negate

    def __str__(self) -> str:
        condition = f"{self.key} {'!=' if self.negate else '='} {self.value!r}"
        return f"{', '.join(self.keys)} (when {condition})"


#: One entry of a component's ``reads``: a dotted key, ``"section.*"``, or a :class:`When`.
Read = str | When


def declared_reads(obj: Any) -> tuple[Read, ...]:
    """The ``reads`` an object declares (``()`` if it declares none)."""
    reads = getattr(obj, "reads", ())
    return tuple(reads) if isinstance(reads, (tuple, list)) else ()


def declares_reads(obj: Any) -> bool:
    """Whether ``obj`` declares what it reads (a plug-in that does not is taken to read every
    setting: nothing it might read is refused, and every value is recorded)."""
    return isinstance(getattr(obj, "reads", None), (tuple, list))


def describe(reads: tuple[Read, ...]) -> str:
    """``reads`` as one line for listings: ``"a.b, c.*, d.e (when f = 'g')"``."""
    return ", ".join(map(str, reads)) if reads else "no setting besides its own"
