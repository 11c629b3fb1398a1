"""baton.log swaps nats-py's private header parser for a faster one (``DeliveryLog``):
these tests fail loudly when nats-py changes what the swap relies on. Pure, no server."""
from __future__ import annotations

import inspect

import nats.aio.client
import pytest
from nats.aio.client import Client

from baton.log import _headers as H
from baton.log._log import DeliveryLog

pytestmark = pytest.mark.unit

SAMPLES = [
    b"Baton-Epoch: 3\r\nBaton-Kind: chunk\r\n\r\n",
    b"Nats-Msg-Id: run-\xc3\xa9t\xc3\xa9:7\r\nBaton-Origin: journal\r\n\r\n",  # UTF-8 value
    b"Baton-Error: a: b: c\r\nBaton-Fp:abc\r\nBaton-Status:\tcompleted \r\n\r\n",  # ':' in value; no OWS
    b"Nats-Sequence: 1\r\nNats-Sequence: 2\r\n\r\n",  # the last one wins
    b"Baton-Kind: close\r\n",  # no blank line
    b"",
]


def test_nats_py_still_has_the_parser_the_swap_replaces() -> None:
    attr = inspect.getattr_static(Client, "_parse_header_lines")
    assert isinstance(attr, staticmethod), "nats-py's _parse_header_lines is no longer a staticmethod"
    params = list(inspect.signature(Client._parse_header_lines).parameters)
    assert params == ["raw"], f"nats-py's _parse_header_lines takes {params} now"
    # And nats-py still calls it through the instance, where the swap puts the replacement.
    assert "self._parse_header_lines(" in inspect.getsource(Client._process_headers)


def test_nats_py_parses_headers_with_it() -> None:
    """With the optional e-mail parser installed nats-py would not use the swapped method."""
    assert getattr(nats.aio.client, "parse_email", None) is None


@pytest.mark.parametrize("raw", SAMPLES)
def test_the_swapped_parser_gives_what_nats_py_gives(raw: bytes) -> None:
    assert H.fast_parse_header_lines(raw) == Client._parse_header_lines(raw)


def test_a_delivery_log_swaps_the_parser_of_its_connection_only() -> None:
    nc, other = Client(), Client()
    DeliveryLog(nc)
    assert nc._parse_header_lines is H.fast_parse_header_lines
    assert other._parse_header_lines is not H.fast_parse_header_lines
