"""etcd's user + password auth (BATON_ETCD_USER/PASSWORD) against a real etcd with auth on:
every kind of call the coordinator makes carries the token, a token etcd stops accepting is
replaced without the caller seeing it, and a wrong password is a clear refusal that names
the user and never the password."""
from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from aetcd import rpc

from baton.errors import StoreRefused
from baton_tools.testing.servers import EtcdServer
from coordinator._etcd import Etcd, put
from coordinator._etcd_auth import EtcdSecurity
from tests.conftest import unique

PASSWORD = "pw-" + unique()


async def _enable_auth(endpoint: str) -> None:
    """root (with the root role) and baton (read-write on everything), then auth on."""
    async with grpc.aio.insecure_channel(endpoint) as ch:
        auth = rpc.AuthStub(ch)
        for name in ("root", "baton"):
            await auth.UserAdd(rpc.AuthUserAddRequest(name=name, password=PASSWORD), timeout=10)
        await auth.RoleAdd(rpc.AuthRoleAddRequest(name="root"), timeout=10)
        await auth.UserGrantRole(rpc.AuthUserGrantRoleRequest(user="root", role="root"), timeout=10)
        await auth.RoleAdd(rpc.AuthRoleAddRequest(name="rw"), timeout=10)
        perm = rpc.Permission(permType=rpc.Permission.READWRITE, key=b"\0", range_end=b"\0")
        await auth.RoleGrantPermission(rpc.AuthRoleGrantPermissionRequest(name="rw", perm=perm), timeout=10)
        await auth.UserGrantRole(rpc.AuthUserGrantRoleRequest(user="baton", role="rw"), timeout=10)
        await auth.AuthEnable(rpc.AuthEnableRequest(), timeout=10)


async def _revoke_tokens(endpoint: str) -> None:
    """Setting baton's password (to the same one) makes etcd forget every token of it."""
    root = Etcd([endpoint], security=EtcdSecurity(user="root", password=PASSWORD))
    try:
        # The adapter's own channel authenticates as root; the Auth service rides on it.
        auth = rpc.AuthStub(root._channel)
        await auth.UserChangePassword(rpc.AuthUserChangePasswordRequest(name="baton", password=PASSWORD), timeout=10)
    finally:
        await root.close()


async def test_user_and_password(own_etcd: EtcdServer) -> None:
    await _enable_auth(own_etcd.endpoint)
    prefix = f"/{unique('auth')}/".encode()

    # No credentials: etcd refuses (the user is unknown), as a refusal, not an outage.
    anonymous = Etcd([own_etcd.endpoint])
    try:
        with pytest.raises(StoreRefused):
            await anonymous.txn([], [put(prefix + b"x", b"1")], timeout=5)
    finally:
        await anonymous.close()

    # A wrong password names the user and the variables, never the password.
    wrong = Etcd([own_etcd.endpoint], security=EtcdSecurity(user="baton", password="not-" + PASSWORD))
    try:
        with pytest.raises(StoreRefused) as err:
            await wrong.range(prefix, timeout=5)
        assert "'baton'" in str(err.value) and "BATON_ETCD_PASSWORD" in str(err.value)
        assert PASSWORD not in str(err.value) and PASSWORD not in repr(err.value)
    finally:
        await wrong.close()

    etcd = Etcd([own_etcd.endpoint], security=EtcdSecurity(user="baton", password=PASSWORD))
    try:
        # Every kind of call: a write, a read, a lease, its keep-alive stream, a watch stream.
        await etcd.txn([], [put(prefix + b"a", b"1")], timeout=5)
        kvs, rev = await etcd.range(prefix + b"a", timeout=5)
        assert [kv.value for kv in kvs] == [b"1"]
        lease, _ = await etcd.grant(5, timeout=5)
        keepalive = etcd.keepalive_stream()
        assert await keepalive.refresh(lease, timeout=5) > 0
        watch = etcd.watch([(prefix, prefix + b"\xff")], start_revision=rev + 1)
        seen = asyncio.ensure_future(anext(watch))
        await etcd.txn([], [put(prefix + b"b", b"2")], timeout=5)
        async with asyncio.timeout(10):
            _, events = await seen
        assert [e.kv.key for e in events] == [prefix + b"b"]
        await watch.aclose()

        # etcd forgets the token: the next calls get a new one, unseen by their callers.
        token: Any = etcd._channel._token
        before = token.metadata()
        await _revoke_tokens(own_etcd.endpoint)
        await etcd.txn([], [put(prefix + b"c", b"3")], timeout=5)
        assert token.metadata() != before
        kvs, _ = await etcd.range(prefix, prefix + b"\xff", timeout=5)
        assert [kv.key for kv in kvs] == [prefix + b"a", prefix + b"b", prefix + b"c"]
        # A stream opened on the old token is refused once, then opened again with the new.
        assert await keepalive.refresh(lease, timeout=5) > 0
        keepalive.close()
        await etcd.revoke(lease, timeout=5)
    finally:
        await etcd.close()
