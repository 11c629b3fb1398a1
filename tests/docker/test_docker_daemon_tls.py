"""A docker sandbox's daemon over TLS with a sandbox CA: the certificate minted at create is
put into the container (never into its config), every host checks the daemon against the CA,
and a host with another CA is refused clearly. Real engine (tests/docker/conftest.py)."""
from __future__ import annotations

import asyncio
import json
import pathlib

import pytest

from sandbox_host.journal import new_nonce
from sandbox_host.providers import SandboxSpec
from sandbox_host.providers import _sandbox_tls
from sandbox_host.providers._daemon_client import DaemonUnreachable
from tests.conftest import assert_eventually
from tests.docker.conftest import DOCKER_MARKS, roundtrip, with_data
from tests.tls.pki import CA

pytestmark = [*DOCKER_MARKS, pytest.mark.timeout(180)]


def sandbox_ca(tmp_path: pathlib.Path, name: str) -> _sandbox_tls.SandboxCa:
    ca = CA(tmp_path / name, name)
    got = _sandbox_tls.from_env({_sandbox_tls.CA_CERT: ca.cert, _sandbox_tls.CA_KEY: ca.key})
    assert got is not None
    return got


async def test_a_docker_sandbox_over_tls(tmp_path: pathlib.Path) -> None:
    from sandbox_host.providers.docker import DockerProvider

    ours, theirs = sandbox_ca(tmp_path, "ours"), sandbox_ca(tmp_path, "theirs")
    first, second = DockerProvider(sandbox_ca=ours), DockerProvider(sandbox_ca=ours)
    other = DockerProvider(sandbox_ca=theirs)
    h = await first.create("docker-tls", SandboxSpec(provider="docker"))
    try:
        assert h.data["daemon_tls"] is True
        info = await asyncio.to_thread(first._api.inspect_container, h.data["container_id"])
        assert "PRIVATE KEY" not in json.dumps(info["Config"])
        launched = await first.launch(h, ["sh", "-c", "echo over-tls"], nonce=new_nonce())
        h = roundtrip(with_data(h, launched))

        async def ended() -> bool:  # another host, from the stored handle
            return b"over-tls" in await second.read_file(h, h.journal_path)
        await assert_eventually(ended, timeout=30)
        with pytest.raises(DaemonUnreachable) as err:
            await other.read_file(h, h.journal_path)
        assert "certificate" in str(err.value) and "PRIVATE KEY" not in str(err.value)
    finally:
        await first.destroy(h)
        for p in (first, second, other):
            await p.aclose()
