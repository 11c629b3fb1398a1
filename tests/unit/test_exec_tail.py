"""The daemon's ``Exec`` output: a bounded tail (:class:`Tail`) redacted so that no secret,
nor the end of one the tail begins inside, shows (:func:`redacted_tail`)."""
from __future__ import annotations

import pytest

from sandbox_host.daemon._exec import Tail, redacted_tail

pytestmark = pytest.mark.unit
SECRET = "tok-0123456789abcdef"


def test_a_tail_keeps_the_last_bytes_and_counts_them_all() -> None:
    t = Tail(5)
    for chunk in (b"abc", b"defgh", b"", b"ijklmnopq"):
        t.add(chunk)
    assert t.value() == b"mnopq" and t.total == 17
    empty = Tail(0)
    empty.add(b"xyz")
    assert empty.value() == b"" and empty.total == 3


@pytest.mark.parametrize("start", range(1, len(SECRET)))
def test_a_tail_that_begins_inside_a_secret_shows_none_of_it(start: int) -> None:
    data = (SECRET[start:] + " and " + SECRET + " end").encode()
    got = redacted_tail(data, {"K": SECRET}, cut=True, limit=1000)
    assert got == b"[REDACTED] and [REDACTED] end"


def test_an_uncut_output_is_redacted_and_trimmed_to_the_limit() -> None:
    got = redacted_tail(f"x {SECRET} y".encode(), {"K": SECRET}, cut=False, limit=12)
    assert got == b"[REDACTED] y"
    assert redacted_tail(b"ret only", {"K": SECRET}, cut=False, limit=100) == b"ret only"  # whole: not a secret's end
