"""The daemon's own source as a tar, for a sandbox whose image holds only its dependencies.

The docker provider copies this into each container before it starts the daemon, so the
daemon inside runs the very code of the host that built the sandbox (no version skew between
host and image); the image provides a Python with the daemon's third-party packages
(``/opt/baton-daemon``, scripts/docker_setup.sh). Blocking (reads files): call it once, in a
thread.
"""
from __future__ import annotations

import io
import os
import tarfile

import baton
import sandbox_host

#: The modules ``python -m sandbox_host.daemon`` imports from this repository (package,
#: relative path); tests/sandbox/test_daemon_bundle.py checks the list is closed under imports.
MODULES: tuple[tuple[str, str], ...] = (
    ("baton", "__init__.py"), ("baton", "errors.py"), ("baton", "internal_auth.py"), ("baton", "malloc_tuning.py"),
    ("baton", "runs.py"),
    ("baton", "tls.py"), ("baton", "trace_context.py"),
    ("baton", "v1/__init__.py"), ("baton", "v1/runs_pb2.py"), ("baton", "v1/sandbox_daemon_pb2.py"),
    ("baton", "v1/sandbox_daemon_pb2_grpc.py"),
    ("sandbox_host", "__init__.py"), ("sandbox_host", "_wrapper.py"),
    ("sandbox_host", "daemon/__init__.py"), ("sandbox_host", "daemon/__main__.py"), ("sandbox_host", "daemon/_certs.py"),
    ("sandbox_host", "daemon/_exec.py"), ("sandbox_host", "daemon/_files.py"), ("sandbox_host", "daemon/_ops.py"),
    ("sandbox_host", "daemon/_wire.py"),
    ("sandbox_host", "daemon/_procs.py"), ("sandbox_host", "daemon/_service.py"), ("sandbox_host", "daemon/paths.py"),
    ("sandbox_host", "providers/__init__.py"), ("sandbox_host", "providers/_base.py"),
    ("sandbox_host", "providers/_inotify.py"), ("sandbox_host", "providers/_redact.py"),
    ("sandbox_host", "providers/_tree.py"),
)
_ROOTS = {"baton": os.path.dirname(baton.__file__), "sandbox_host": os.path.dirname(sandbox_host.__file__)}


def source_tar(prefix: str) -> bytes:
    """An uncompressed tar of :data:`MODULES` under ``prefix`` (``opt/baton-daemon/src``:
    members ``opt/baton-daemon/src/baton/…``), files mode 0644, for ``put_archive`` at ``/``.

    Raises:
        OSError: a module's file is missing (an installation without the daemon).
    """
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for package, rel in MODULES:
            with open(os.path.join(_ROOTS[package], rel), "rb") as f:
                data = f.read()
            info = tarfile.TarInfo(f"{prefix.strip('/')}/{package}/{rel}")
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


__all__ = ["MODULES", "source_tar"]
