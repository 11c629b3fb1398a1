"""NATS credentials from BATON_NATS_NKEY_SEED and BATON_NATS_CREDS against a real nats-server
that requires them: the delivery log connects with them (and only with them), and no seed
reaches an error."""
from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import os
import pathlib
import time
from dataclasses import dataclass
from typing import Any

import nkeys
from nats.aio.client import Client as NATS
import pytest

from baton.log import DeliveryLog, LogConfig
from baton_tools.testing.servers import NatsServer
from tests.conftest import unique

pytestmark = pytest.mark.servers


def _keypair(prefix: int) -> Any:
    return nkeys.from_seed(nkeys.encode_seed(os.urandom(32), prefix))


@dataclass
class ConfiguredNats(NatsServer):
    """nats-server with JetStream and a configuration file (authorization, operator mode)."""

    conf: str = ""

    def _argv(self) -> list[str]:
        path = self.data_dir / "nats.conf"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(self.conf)
        return [*super()._argv(), "-c", str(path)]


async def refused(url: str, **options: Any) -> Exception:
    """The error of a connect nats-server refuses (the connection closed either way: nats-py
    leaves a refused connection's socket open, for the garbage collector to warn about)."""
    nc = NATS()
    try:
        await nc.connect(url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=3, **options)
    except Exception as exc:  # noqa: BLE001  # each refusal has its own nats-py or ssl error
        return exc
    finally:
        if nc._transport is not None:
            nc._transport.close()
        # A client whose TLS handshake failed never finishes its close: bounded, then left.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(1):
                await nc.close()
    raise AssertionError(f"{url} accepted a connection it should refuse")


async def _log_works(url: str) -> None:
    cfg = LogConfig(stream=unique("NK").upper(), subject_prefix=f"{unique('nk')}.runs", bucket=unique("nk-threads"))
    dlog = await DeliveryLog.connect(url, cfg, allow_reconnect=False)
    try:
        await dlog.provision()
        assert (await dlog.js.stream_info(cfg.stream)).config.name == cfg.stream
    finally:
        await dlog.close()


async def test_an_nkey_seed(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    user = _keypair(nkeys.PREFIX_BYTE_USER)
    server = ConfiguredNats(tmp_path / "nats", conf=f'authorization {{ users = [ {{ nkey: "{user.public_key.decode()}" }} ] }}\n')
    server.start()
    try:
        assert "authorization violation" in str(await refused(server.url)).lower()
        seed = tmp_path / "baton.nk"
        seed.write_bytes(user.seed + b"\n")
        seed.chmod(0o600)
        monkeypatch.setenv("BATON_NATS_NKEY_SEED", str(seed))
        await _log_works(server.url)
    finally:
        server.stop()


def _jwt(claims: dict[str, Any], issuer: Any) -> str:
    """A NATS JWT (v2) signed by ``issuer``'s nkey, as nsc writes them."""
    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).decode().rstrip("=")

    claims = {"iat": int(time.time()), "iss": issuer.public_key.decode(), **claims}
    claims["jti"] = base64.b32encode(hashlib.sha256(json.dumps(claims).encode()).digest()).decode().rstrip("=")
    head = b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode()) + "." + b64(json.dumps(claims).encode())
    return head + "." + b64(issuer.sign(head.encode()))


async def test_a_creds_file(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    operator, account = _keypair(nkeys.PREFIX_BYTE_OPERATOR), _keypair(nkeys.PREFIX_BYTE_ACCOUNT)
    system, user = _keypair(nkeys.PREFIX_BYTE_ACCOUNT), _keypair(nkeys.PREFIX_BYTE_USER)
    acc_pub, sys_pub = account.public_key.decode(), system.public_key.decode()
    op_jwt = _jwt({"name": "op", "sub": operator.public_key.decode(), "nats": {"type": "operator", "version": 2}},
                  operator)
    unlimited = {"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1, "wildcards": True, "conn": -1,
                 "leaf": -1, "mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1}
    acc_jwt = _jwt({"name": "baton", "sub": acc_pub, "nats": {"limits": unlimited, "type": "account", "version": 2}},
                   operator)
    user_jwt = _jwt({"name": "baton-host", "sub": user.public_key.decode(),
                     "nats": {"pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1, "type": "user",
                              "version": 2}}, account)
    sys_jwt = _jwt({"name": "SYS", "sub": sys_pub, "nats": {"type": "account", "version": 2}}, operator)
    conf = (f"operator: {op_jwt}\nsystem_account: {sys_pub}\nresolver: MEMORY\n"
            f"resolver_preload: {{ {acc_pub}: {acc_jwt}, {sys_pub}: {sys_jwt} }}\n")
    server = ConfiguredNats(tmp_path / "nats", conf=conf)
    server.start()
    try:
        assert "authorization violation" in str(await refused(server.url)).lower()
        creds = tmp_path / "baton.creds"
        creds.write_text(f"-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n"
                         f"-----BEGIN USER NKEY SEED-----\n{user.seed.decode()}\n------END USER NKEY SEED------\n")
        creds.chmod(0o600)
        monkeypatch.setenv("BATON_NATS_CREDS", str(creds))
        await _log_works(server.url)
    finally:
        server.stop()
