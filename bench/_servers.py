"""The engines a bench runs against: one etcd and one nats-server in a temporary directory."""
from __future__ import annotations

import contextlib
import os
import pathlib
import sys
import tempfile
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from baton_tools.testing.servers import EtcdServer, NatsServer

REPO = pathlib.Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def etcd_and_nats(prefix: str) -> Iterator[tuple[pathlib.Path, "EtcdServer", "NatsServer"]]:
    """A new temporary directory (named ``prefix…``) with a single-node etcd and a
    nats-server with JetStream under it, both started; both SIGKILLed on exit.

    Yields:
        (the directory, the etcd, the nats-server). The directory is kept (its logs).
    """
    sys.path.insert(0, str(REPO))
    os.environ.pop("http_proxy", None)  # gRPC honours proxy variables even for loopback
    os.environ.pop("https_proxy", None)
    from baton_tools.testing.servers import EtcdServer, NatsServer

    tmp = pathlib.Path(tempfile.mkdtemp(prefix=prefix))
    etcd, nats = EtcdServer(tmp / "etcd"), NatsServer(tmp / "nats")
    try:
        etcd.start()
        nats.start()
        yield tmp, etcd, nats
    finally:
        nats.kill()
        etcd.kill()
