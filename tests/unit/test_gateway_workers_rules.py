"""The rules of a gateway of N workers (gateway/_workers.py): each worker's share of the
per-process limits, its addresses, and when a dead worker starts again."""
from __future__ import annotations

import pytest

from gateway._settings import GatewaySettings
from gateway._workers import RestartPolicy, metrics_listen, share, split_listen, worker_settings

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("limit, workers, part", [(0, 4, 0), (64, 1, 64), (64, 2, 32), (5, 2, 3), (1, 8, 1),
                                                  (256, 3, 86)])
def test_a_limit_is_divided_rounded_up_and_no_limit_stays_none(limit: int, workers: int, part: int) -> None:
    assert share(limit, workers) == part


def test_worker_settings_divide_admission_and_the_per_client_cap_only() -> None:
    base = GatewaySettings.from_env({"BATON_START_PER_TENANT": "64", "BATON_START_PER_HOST": "0",
                                     "BATON_START_QUEUE": "511", "BATON_START_WAIT": "30",
                                     "BATON_HTTP_CONNECTIONS_PER_CLIENT": "256", "BATON_GATEWAY_WORKERS": "2"})
    assert base.workers == 2
    w = worker_settings(base, 2)
    assert (w.admission.per_tenant, w.admission.per_host, w.admission.queue) == (32, 0, 256)
    assert w.admission.wait == 30  # a time, not a count: not divided
    assert w.connections.per_client == 128
    assert w.connections.header_timeout == base.connections.header_timeout
    assert (w.workers, w.grpc_listen, w.coordinator) == (2, base.grpc_listen, base.coordinator)


@pytest.mark.parametrize("raw", ["0", "-1", "two", "1.5"])
def test_a_bad_worker_count_names_the_variable(raw: str) -> None:
    with pytest.raises(ValueError, match="BATON_GATEWAY_WORKERS"):
        GatewaySettings.from_env({"BATON_GATEWAY_WORKERS": raw})


def test_addresses() -> None:
    assert split_listen("0.0.0.0:8080") == ("0.0.0.0", 8080)
    assert split_listen(":8080") == ("0.0.0.0", 8080)
    assert split_listen("[::1]:81") == ("::1", 81)
    with pytest.raises(ValueError):
        split_listen("localhost")
    # One metrics port per worker: base + index, or any free one (0), or none.
    assert [metrics_listen("0.0.0.0:9103", i) for i in range(3)] == ["0.0.0.0:9103", "0.0.0.0:9104", "0.0.0.0:9105"]
    assert metrics_listen("127.0.0.1:0", 1) == "127.0.0.1:0"
    assert metrics_listen("[::]:9103", 1) == "[::]:9104"
    assert metrics_listen("", 1) == ""


def test_a_worker_that_served_restarts_at_once_and_one_that_cannot_start_backs_off_then_gives_up() -> None:
    p = RestartPolicy(healthy_after=10, first_delay=0.1, max_delay=0.3, give_up_after=4)
    assert p.died(0, lived=120.0) == 0.0
    assert [p.died(1, lived=0.5) for _ in range(3)] == [0.1, 0.2, 0.3]
    assert p.died(0, lived=1.0) == 0.1  # worker 0's count is its own
    assert p.died(1, lived=0.5) is None
    # A worker that lived long enough starts its count again.
    q = RestartPolicy(give_up_after=2)
    assert q.died(0, lived=1.0) is not None
    assert q.died(0, lived=60.0) == 0.0
    assert q.died(0, lived=1.0) is not None
