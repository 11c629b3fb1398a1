"""What the fork server of local sandbox daemons takes as a request, and what it refuses."""
from __future__ import annotations

import pytest

from sandbox_host.daemon.forkserver import address, check_request

GOOD = {"argv": ["--listen", "127.0.0.1:0"], "env": {"PATH": "/bin"}, "cwd": "/s/.baton", "log": "/s/.baton/daemon.log",
        "until": 1000.0}


def test_a_request_gives_argv_env_cwd_and_log() -> None:
    assert check_request(GOOD, now=999.0) == (["--listen", "127.0.0.1:0"], {"PATH": "/bin"}, "/s/.baton",
                                              "/s/.baton/daemon.log")


def test_a_request_its_host_no_longer_waits_for_is_refused() -> None:
    with pytest.raises(ValueError, match="expired"):
        check_request(GOOD, now=1000.5)


@pytest.mark.parametrize("bad, why", [
    ([], "not a JSON object"),
    ({**GOOD, "argv": "--listen"}, "argv must be a list of strings"),
    ({**GOOD, "argv": [1]}, "argv must be a list of strings"),
    ({k: v for k, v in GOOD.items() if k != "env"}, "env must be an object of strings"),
    ({**GOOD, "env": {"A": 1}}, "env must be an object of strings"),
    ({**GOOD, "cwd": "relative"}, "cwd must be an absolute path"),
    ({**GOOD, "log": None}, "log must be an absolute path"),
    ({**GOOD, "log": "/a\0b"}, "log must be an absolute path"),
    ({**GOOD, "argv": ["a\0b"]}, "NUL"),
    ({**GOOD, "env": {"A": "b\0c"}}, "NUL"),
    ({k: v for k, v in GOOD.items() if k != "until"}, "until must be a number"),
    ({**GOOD, "until": True}, "until must be a number"),
])
def test_a_request_of_another_shape_is_refused_with_the_reason(bad: object, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        check_request(bad, now=999.0)


def test_the_socket_path_is_short_and_keyed_by_the_stamp() -> None:
    top, sock = address("0123456789abcdef")
    assert sock.startswith(top) and "0123456789abcdef" in top and len(sock.encode()) < 108
    assert address("fedcba9876543210")[1] != sock
