"""``BATON_TAIL_LINGER``: how long a run's shared tail outlives its last reader (gateway/_fanout.py)."""
from __future__ import annotations

import pytest

from gateway._settings import GatewaySettings


def test_the_linger_is_read_in_seconds_and_zero_turns_it_off() -> None:
    assert GatewaySettings.from_env({}).tail_linger == 10.0
    assert GatewaySettings.from_env({"BATON_TAIL_LINGER": "2.5"}).tail_linger == 2.5
    assert GatewaySettings.from_env({"BATON_TAIL_LINGER": "0"}).tail_linger == 0.0


@pytest.mark.parametrize("raw", ["-1", "soon", "inf", "nan"])
def test_a_bad_linger_names_the_variable(raw: str) -> None:
    with pytest.raises(ValueError, match="BATON_TAIL_LINGER"):
        GatewaySettings.from_env({"BATON_TAIL_LINGER": raw})
