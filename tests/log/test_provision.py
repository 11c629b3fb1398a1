"""Provisioning: idempotent, with the configured names, storage and retention."""
from __future__ import annotations

from nats.aio.client import Client as NATS
from nats.js import api

from baton.log import DeliveryLog
from tests.log.conftest import unique_cfg


async def test_provision_is_idempotent_and_follows_the_config(nc: NATS) -> None:
    cfg = unique_cfg(max_age=3600.0)
    log = DeliveryLog(nc, cfg)
    js = nc.jetstream()
    try:
        await log.provision()
        await log.provision()  # again: no error, same stream
        info = await js.stream_info(cfg.stream)
        assert info.config.subjects == [f"{cfg.subject_prefix}.>"]
        assert info.config.storage == api.StorageType.FILE
        assert info.config.allow_direct is True
        assert info.config.max_age == 3600.0
        assert info.config.num_replicas == 1
        # a changed retention is applied on the next provision
        await DeliveryLog(nc, unique_cfg(stream=cfg.stream, subject_prefix=cfg.subject_prefix,
                                         bucket=cfg.bucket, max_age=7200.0)).provision()
        assert (await js.stream_info(cfg.stream)).config.max_age == 7200.0
        kv = await js.key_value(cfg.bucket)
        assert (await kv.status()).bucket == cfg.bucket
    finally:
        await js.delete_stream(cfg.stream)
        await js.delete_key_value(cfg.bucket)


async def test_connect_owns_and_closes_its_connection(nats: object) -> None:
    log = await DeliveryLog.connect(nats.url, unique_cfg())  # type: ignore[attr-defined]
    async with log:
        assert log.nc.is_connected
    assert log.nc.is_closed
