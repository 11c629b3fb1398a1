"""BATON_EVENT_LOOP: one rule (baton.config.event_loop) for the coordinator and the gateway."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from baton import config


def test_the_event_loop_setting_takes_the_two_loops_and_names_itself_otherwise() -> None:
    assert config.event_loop({}) == "uvloop"
    assert config.event_loop({"BATON_EVENT_LOOP": "asyncio"}) == "asyncio"
    with pytest.raises(ValueError, match="BATON_EVENT_LOOP must be uvloop or asyncio, got 'tokio'"):
        config.event_loop({"BATON_EVENT_LOOP": "tokio"})


@pytest.mark.servers
@pytest.mark.parametrize("service, listen", [("coordinator", "BATON_COORDINATOR_LISTEN"),
                                             ("gateway", "BATON_GATEWAY_LISTEN")])
def test_a_service_refuses_an_unknown_event_loop_by_name(service: str, listen: str) -> None:
    env = {**os.environ, "BATON_EVENT_LOOP": "tokio", listen: "127.0.0.1:0"}
    p = subprocess.run([sys.executable, "-m", service], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert "BATON_EVENT_LOOP must be uvloop or asyncio, got 'tokio'" in p.stderr
