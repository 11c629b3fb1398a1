"""BATON_GC_THRESHOLD: the collector every service tunes at start and freezes once ready
(baton/gc_tuning.py, docs/operating.md "The garbage collector")."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from baton import config, gc_tuning
from baton.errors import drop_frames

_PROBE = """
import gc, json, sys
from baton import gc_tuning
try:
    set_to = gc_tuning.tune_collector()
except ValueError as exc:
    print(json.dumps({"error": str(exc), "threshold": gc.get_threshold()}))
    sys.exit(0)
import asyncio, gateway.app  # a service's start-up: its modules
frozen = gc_tuning.freeze_startup()
print(json.dumps({"set": set_to, "threshold": gc.get_threshold(), "frozen": frozen,
                  "freeze_count": gc.get_freeze_count()}))
"""


def probe(value: str | None) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != "BATON_GC_THRESHOLD"}
    if value is not None:
        env["BATON_GC_THRESHOLD"] = value
    p = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=60, check=True)
    out: dict[str, object] = json.loads(p.stdout)
    return out


def test_the_setting_takes_three_positive_integers_or_default_and_names_itself_otherwise() -> None:
    assert gc_tuning.threshold_from("10000,10,10") == (10_000, 10, 10)
    assert gc_tuning.threshold_from(" 700,10,10 ") == (700, 10, 10)
    assert gc_tuning.threshold_from("default") is None
    assert gc_tuning.threshold_from(f"{2**31 - 1},1,1") == (2**31 - 1, 1, 1)
    assert gc_tuning.threshold_from("700, 10 ,10") == (700, 10, 10)
    for bad in ("", "50000", "50000,10", "1,2,3,4", "a,b,c", "0,10,10", "-1,10,10", "1.5,10,10", f"{2**31},10,10",
                "1_000,10,10", "+5,10,10", "\u0661\u0660\u0660\u0660,10,10", "10000,,10"):
        with pytest.raises(ValueError, match=f"BATON_GC_THRESHOLD must be three positive integers .* got {re.escape(repr(bad))}"):
            gc_tuning.threshold_from(bad)
    # A value of any length is named by its start only.
    with pytest.raises(ValueError) as err:
        gc_tuning.threshold_from("9" * 5000 + ",10,10")
    assert len(str(err.value)) < 200 and str(err.value).endswith("...'")
    # The documented default is the module's.
    assert gc_tuning.threshold_from(config.get("BATON_GC_THRESHOLD", {})) == gc_tuning.THRESHOLD


@pytest.mark.servers
def test_a_process_runs_with_the_default_thresholds_and_freezes_what_start_up_built() -> None:
    out = probe(None)
    assert out["set"] == out["threshold"] == [10_000, 10, 10]
    assert out["frozen"] == out["freeze_count"]
    assert isinstance(out["frozen"], int) and out["frozen"] > 10_000  # gateway.app's modules alone are more


@pytest.mark.servers
def test_an_operators_thresholds_are_taken_and_default_keeps_pythons_collector_whole() -> None:
    out = probe("20000,5,20")
    assert out["threshold"] == [20_000, 5, 20]
    assert isinstance(out["frozen"], int) and out["frozen"] > 10_000
    out = probe("default")
    assert out["set"] is None
    assert out["threshold"] == [700, 10, 10]
    assert out["frozen"] == out["freeze_count"] == 0


@pytest.mark.servers
def test_a_malformed_value_changes_nothing() -> None:
    out = probe("lots")
    assert out["error"] == ("BATON_GC_THRESHOLD must be three positive integers (gen0,gen1,gen2) up to 2147483647, "
                            "or 'default', got 'lots'")
    assert out["threshold"] == [700, 10, 10]


@pytest.mark.servers
@pytest.mark.parametrize("service, listen", [("coordinator", "BATON_COORDINATOR_LISTEN"),
                                             ("gateway", "BATON_GATEWAY_LISTEN"),
                                             ("sandbox_host", "BATON_HOST_LISTEN")])
def test_a_service_refuses_a_malformed_threshold_by_name(service: str, listen: str) -> None:
    env = {**os.environ, "BATON_GC_THRESHOLD": "700,10", listen: "127.0.0.1:0"}
    p = subprocess.run([sys.executable, "-m", service], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert ("BATON_GC_THRESHOLD must be three positive integers (gen0,gen1,gen2) up to 2147483647, "
            "or 'default', got '700,10'") in p.stderr


class _Body:
    """A request's body (weakly referenced: the test sees when it is freed)."""


def test_drop_frames_frees_what_a_failed_calls_frames_held_without_a_collection() -> None:
    import gc
    import weakref

    def handler(body: _Body) -> None:
        try:
            raise KeyError("the store said no")
        except KeyError as exc:
            raise ValueError("mapped") from exc

    def cycle() -> tuple[BaseException, weakref.ref[_Body]]:
        body = _Body()
        ref = weakref.ref(body)
        try:
            handler(body)
        except ValueError as exc:
            error = exc
        # What asyncio and grpcio do: something the error's frames reach holds the error.
        holder = [error]
        holder.append(holder)
        return error, ref

    gc.disable()
    try:
        error, ref = cycle()
        assert ref() is not None  # the traceback's finished frames hold the body
        drop_frames(error)
        assert ref() is None  # freed at once, no collection needed
        # The traceback still says where it came from.
        import traceback

        text = "".join(traceback.format_exception(error))
        assert "handler" in text and "KeyError: 'the store said no'" in text and "ValueError: mapped" in text
    finally:
        gc.enable()
