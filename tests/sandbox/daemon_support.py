"""A sandbox daemon as a child process of a test, and a client to it."""
from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
from typing import Iterator, Sequence

from sandbox_host.providers._daemon_client import DaemonClient
from tests.conftest import eventually


class DaemonProcess:
    """``python -m sandbox_host.daemon`` on a free loopback port, restartable.

    Args:
        roots: the daemon's roots (the first is its working directory).
        state: its state directory (``None``: ``<first root>/.baton``).
        token: its ``BATON_INTERNAL_TOKEN`` (``""``: none).
    """

    def __init__(self, roots: Sequence[pathlib.Path], *, state: pathlib.Path | None = None, token: str = "") -> None:
        self.roots = list(roots)
        self.state = state
        self.token = token
        self.addr_file = self.roots[0].parent / f".{self.roots[0].name}-daemon.addr"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> str:
        """Start it and return ``host:port`` once it serves."""
        self.addr_file.unlink(missing_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("BATON_")}
        if self.token:
            env["BATON_INTERNAL_TOKEN"] = self.token
        argv = [sys.executable, "-m", "sandbox_host.daemon", "--listen", "127.0.0.1:0",
                "--addr-file", str(self.addr_file), "--idle-check", "0.05"]
        for r in self.roots:
            argv += ["--root", str(r)]
        if self.state is not None:
            argv += ["--state", str(self.state)]
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        proc = self.proc

        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"daemon exited {proc.returncode}: {proc.stderr.read().decode() if proc.stderr else ''}")
            return self.addr_file.exists()

        eventually(ready, 30, "the sandbox daemon serving")
        return self.address

    @property
    def address(self) -> str:
        return self.addr_file.read_text().split()[0]

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal it and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(10)
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()

    def client(self, token: str | None = None) -> DaemonClient:
        """A client resolving the current address (so it follows restarts)."""
        async def resolve() -> str:
            return self.address

        return DaemonClient(resolve, token=self.token if token is None else token, patience=30.0)


def running(d: DaemonProcess) -> Iterator[DaemonProcess]:
    d.start()
    try:
        yield d
    finally:
        d.kill()
