"""A sandbox daemon's TLS certificate (minted by the host with a short
``BATON_SANDBOX_CERT_TTL``) is renewed in place before it expires: the sandbox is not
restarted, a journal follow opened before the renewal goes on past the old certificate's
expiry on the same connection, and new connections (another host) verify the new one."""
from __future__ import annotations

import asyncio
import os
import pathlib
import time

import pytest

from sandbox_host.journal import new_nonce
from sandbox_host.providers import SandboxSpec
from sandbox_host.providers import _sandbox_tls
from sandbox_host.providers._local_daemon import meta_dir
from sandbox_host.providers.local import LocalProvider
from tests.conftest import assert_eventually
from tests.sandbox.conftest import with_data
from tests.tls.pki import CA

pytestmark = [pytest.mark.servers, pytest.mark.timeout(120)]
TTL = 20.0  # seconds: renewal falls due once less than a third is left


async def test_a_follow_outlives_the_certificate_it_was_opened_with(tmp_path: pathlib.Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    ca = CA(tmp_path / "ca", "sandboxes")
    monkeypatch.setenv(_sandbox_tls.CA_CERT, ca.cert)
    monkeypatch.setenv(_sandbox_tls.CA_KEY, ca.key)
    monkeypatch.setenv(_sandbox_tls.CERT_TTL, str(TTL))
    host = LocalProvider(str(tmp_path / "sandboxes"), str(tmp_path / "journals"), idle_check=0.05, sandbox_io="daemon")
    h = await host.create("renew-run", SandboxSpec())
    got = bytearray()
    follow_task: asyncio.Task[None] | None = None
    try:
        assert host.cert_check_every() == max(0.5, TTL / 6)
        # An agent that writes a line every 20 ms until told to stop.
        launched = await host.launch(h, ["sh", "-c", "i=0; while [ ! -e stop ]; do echo line$i; i=$((i+1)); "
                                                     "sleep 0.02; done"], nonce=new_nonce())
        h = with_data(h, dict(launched))
        client = host._client(h)
        first = await client.status()
        daemon_pid, old_expiry = first.daemon_pid, first.cert_not_after
        assert old_expiry > time.time()

        async def follow() -> None:
            async for chunk in host.follow(h, h.journal_path, 0):
                got.extend(chunk.data)
        follow_task = asyncio.create_task(follow())
        await assert_eventually(lambda: got.count(b"\n") > 5, timeout=30)
        channel = client._channel

        async def renewed() -> float:
            new = await host.renew_tls(h)
            assert new is not None, "not due yet"
            return new
        new_expiry = await assert_eventually(renewed, timeout=30, interval=0.2)
        assert new_expiry > old_expiry

        def old_one_expired() -> bool:
            return time.time() > old_expiry + 0.5
        await assert_eventually(old_one_expired, timeout=30)
        seen = len(got)
        await assert_eventually(lambda: len(got) > seen + 100, timeout=30)  # still following
        assert not follow_task.done()
        assert client._channel is channel and not client._old, "the follow reconnected"

        # Another host dials anew: the handshake verifies the renewed certificate.
        other = LocalProvider(str(tmp_path / "sandboxes"), str(tmp_path / "journals"), idle_check=0.05, sandbox_io="daemon")
        try:
            status = await other._client(h).status()
            assert (status.daemon_pid, status.cert_not_after) == (daemon_pid, new_expiry)  # no restart
            journal = await other.read_file(h, h.journal_path)
            assert journal.startswith(b"line0\nline1\n")
        finally:
            await other.close()
        (pathlib.Path(h.workdir) / "stop").write_bytes(b"")

        def ended() -> bool:
            return b'"__exit"' in got
        await assert_eventually(ended, timeout=30)
        assert bytes(got) == pathlib.Path(h.journal_path).read_bytes()  # nothing lost or read twice
        kept = pathlib.Path(meta_dir(h)) / "tls-renewed.key"  # for a restarted daemon
        assert oct(os.stat(kept).st_mode & 0o777) == "0o600"
    finally:
        if follow_task is not None:
            follow_task.cancel()
            await asyncio.gather(follow_task, return_exceptions=True)
        await host.destroy(h)
        await host.close()
