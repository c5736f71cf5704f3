"""A context variable set for a block: restored on leaving it, nested or by an exception."""

from __future__ import annotations

import contextvars

import pytest

from p2pdp.core.scoped import scoped

_SETTING: contextvars.ContextVar[int] = contextvars.ContextVar("setting", default=0)


def test_a_scoped_value_holds_inside_the_block_and_is_undone_after_it():
    with scoped(_SETTING, 1):
        assert _SETTING.get() == 1
        with scoped(_SETTING, 2):
            assert _SETTING.get() == 2
        assert _SETTING.get() == 1
        with pytest.raises(KeyError), scoped(_SETTING, 3):
            raise KeyError("inside")
        assert _SETTING.get() == 1
    assert _SETTING.get() == 0
