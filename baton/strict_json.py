"""JSON as RFC 8259 defines it, for what clients send: no ``NaN``, ``Infinity`` or
``-Infinity`` (Python's ``json`` accepts them), and no number too large for a float.

Such a value parses in Python but is no JSON: encoding it again fails
(``ValueError: Out of range float values are not JSON compliant`` under
``allow_nan=False``) or yields text other parsers refuse (``NaN`` reaching an agent's stdin).
So the edges (HTTP bodies, gRPC JSON fields) parse with :func:`loads` and refuse it at once.
"""
from __future__ import annotations

import json
import math
from typing import Any


class NonFiniteNumber(ValueError):
    """The text holds ``NaN``, ``Infinity``, ``-Infinity`` or a number beyond a float's range."""


def _constant(name: str) -> Any:
    raise NonFiniteNumber(f"{name} is not a JSON number")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise NonFiniteNumber(f"{text[:40]} is beyond a float's range")
    return value


def loads(text: str | bytes | bytearray) -> Any:
    """``json.loads`` that refuses non-finite numbers.

    Raises:
        NonFiniteNumber: (a ``ValueError``) see the module docstring.
        ValueError: not JSON (``json.JSONDecodeError``, ``UnicodeDecodeError``).
        RecursionError: nested past the parser's stack.
    """
    return json.loads(text, parse_constant=_constant, parse_float=_float)
