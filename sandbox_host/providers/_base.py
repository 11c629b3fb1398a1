"""The sandbox provider interface (docs/design.md §5.1).

A provider creates isolated places where an agent runs and writes its journal, launches
processes there detached (so they outlive the host), reads and follows files in them, kills
process groups and destroys them. Any host that reaches the same machine (local) or engine
(docker) can re-open a sandbox from its :class:`SandboxHandle`.
"""
from __future__ import annotations

import abc
import asyncio
import os
import signal
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Mapping, Sequence

from sandbox_host.daemon._wire import Chunk as Chunk  # what a follow yields


@dataclass(frozen=True)
class SandboxSpec:
    """What to build.

    Attributes:
        provider: ``"local"``, ``"docker"`` or ``"kubernetes"``.
        image: container image (docker only).
        base_dir: directory under which local sandboxes are created (local only).
        workspace: a local path copied in, or a git URL cloned at ``git_ref``; ``None`` = empty.
        git_ref: branch, tag or commit for a git workspace.
        workspace_is_git: whether ``workspace`` is cloned (``True``) or copied (``False``);
            ``None`` = guessed from its form (a URL, ``git@…``, ``….git``, or a ``git_ref``).
        setup: shell commands run in order in the workspace; a failing one fails the build.
        thread_dir: the thread whose fixed working directory and agent home the sandbox
            uses (``None`` = a fresh working directory per sandbox, no home of its own).
            local: ``<base_dir>/threads/<file stem>/work`` and ``…/home`` (``HOME``,
            ``CODEX_HOME=<home>/.codex``), kept by ``destroy`` (``remove_thread_dir``
            removes them); the workspace is built only when ``work`` does not exist yet.
            docker: ``/workspace`` and ``HOME=/home/agent``.
        build_timeout: seconds the workspace build (clone, checkout, setup) may take.
        max_workspace_bytes: largest workspace after its clone or copy (``None`` = any).
        env: plain environment for the agent.
        secrets: environment for the agent that must never appear in logs, journals,
            records or errors (redacted everywhere; excluded from ``repr``).
        resources: the sandbox's size, ``cpu``, ``memory``, ``disk`` as Kubernetes
            quantities (kubernetes: its pod's requests and limits and its emptyDir's size
            limit, over ``BATON_K8S_CPU``/``MEMORY``/``DISK``; other providers ignore them).
    """

    provider: str = "local"
    image: str | None = None
    base_dir: str | None = None
    workspace: str | None = None
    git_ref: str | None = None
    setup: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    workspace_is_git: bool | None = None
    thread_dir: str | None = None
    #: With ``thread_dir``: the run builds the thread's workspace anew (the thread's first
    #: run, or its first after its head was deleted or expired), so a thread directory an
    #: earlier incarnation left on this machine is stale and removed first.
    rebuild_thread_dir: bool = False
    build_timeout: float | None = None
    max_workspace_bytes: int | None = None
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)
    resources: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SandboxHandle:
    """Enough to find a sandbox again from any host (stored in etcd as JSON, no secrets).

    Attributes:
        provider: provider name.
        key: the sandbox key (unique per run).
        journal_path: the agent's journal inside the sandbox (provider's view of the path).
        stderr_path: the agent's stderr file.
        workdir: the agent's working directory.
        data: provider specifics (container id; or process group id + directory).
    """

    provider: str
    key: str
    journal_path: str
    stderr_path: str
    workdir: str
    data: Mapping[str, Any] = field(default_factory=dict)

    @property
    def inbox_path(self) -> str:
        """The agent's inbox in the sandbox (docs/hitl.md), ``""`` when launched without one
        (the launch's ``data["inbox"]``, so handles stored before inboxes still load)."""
        return str(self.data.get("inbox") or "")


from baton.runs import MAX_INPUT_PAYLOAD  # noqa: E402 - the limit the gateway checks up front too


def check_input(handle: SandboxHandle, input_id: str, payload: bytes) -> bytes:
    """The inbox line for an input, checked: ``<input_id> <payload>\\n``.

    Raises:
        ValueError: no inbox; ``input_id`` not an input id (``baton.ids.INPUT_ID``, or the
            reserved ``eof``); ``payload`` empty, holding a newline or NUL, or too long.
    """
    from baton.ids import EOF_INPUT_ID, INPUT_ID

    if not handle.inbox_path:
        raise ValueError(f"sandbox {handle.key} was launched without an inbox")
    if not INPUT_ID.fullmatch(input_id) and input_id != EOF_INPUT_ID:
        raise ValueError(f"bad input id {input_id!r}")
    if not payload or b"\n" in payload or b"\r" in payload or b"\0" in payload or len(payload) > MAX_INPUT_PAYLOAD:
        raise ValueError(f"input {input_id}: the payload must be one line of at most {MAX_INPUT_PAYLOAD} bytes")
    return input_id.encode() + b" " + payload + b"\n"


class Provider(abc.ABC):
    """One kind of sandbox. Implementations are adapters: all their I/O lives here."""

    name: str
    #: Can the provider signal the agent's processes (else destroying the sandbox is the cancel)?
    killable_processes: bool
    #: Can the provider follow a growing file (else callers poll with ``read_file``)?
    can_follow: bool

    @abc.abstractmethod
    async def create(self, key: str, spec: SandboxSpec) -> SandboxHandle:
        """Build the sandbox (workspace, setup commands). Raises ``SandboxBuildFailed``."""

    @abc.abstractmethod
    async def copy_in(self, handle: SandboxHandle, path: str, content: bytes, mode: int = 0o644) -> None:
        """Write ``content`` to ``path`` inside the sandbox."""

    @abc.abstractmethod
    async def launch(
        self,
        handle: SandboxHandle,
        argv: Sequence[str],
        *,
        nonce: str,
        stdin: bytes | None = None,
        env: Mapping[str, str] | None = None,
        secrets: Mapping[str, str] | None = None,
        interactive: bool = False,
    ) -> Mapping[str, Any]:
        """Start ``argv`` detached, stdout redirected to the journal, stderr to its file.

        A wrapper appends ``{"__exit": <code>, "__nonce": <nonce>}`` to the journal when the
        agent ends. ``nonce`` is written to the wrapper's nonce file as given (a relaunched
        agent process adds its attempt: :func:`sandbox_host.journal.nonce_file_text`).
        ``interactive``: the agent reads further input after ``stdin``, from an
        inbox the provider creates empty before the wrapper starts (``data["inbox"]``; see
        :meth:`send_input`). Returns provider data to merge into the handle (e.g. the
        process group, the inbox).
        """

    @abc.abstractmethod
    async def send_input(self, handle: SandboxHandle, input_id: str, payload: bytes) -> None:
        """Append the line ``<input_id> <payload>`` to the sandbox's inbox in one write; the
        wrapper's relay passes ``payload`` to the agent once per id (docs/hitl.md).

        Raises:
            ValueError: the handle has no inbox; a bad id (see :func:`check_input`); a payload
                with a newline or over :data:`MAX_INPUT_PAYLOAD` bytes.
            PermissionError: the inbox takes no line, for good: the agent made it a link, a
                FIFO or anything but a regular file.
            OSError: not delivered now (the sandbox unreachable, say); worth another try.
        """

    @abc.abstractmethod
    def follow(self, handle: SandboxHandle, path: str, offset: int) -> AsyncIterator[Chunk]:
        """Yield the file's bytes from ``offset`` as they are written (never ends by itself):
        each a :class:`Chunk` (``data``, its ``offset``, and the file's ``size`` when it was
        read, 0 when not told)."""

    @abc.abstractmethod
    async def read_file(self, handle: SandboxHandle, path: str, offset: int = 0, limit: int | None = None) -> bytes:
        """Bytes of a file from ``offset``; raises ``FileNotFoundError`` when absent."""

    @abc.abstractmethod
    async def file_size(self, handle: SandboxHandle, path: str) -> int | None:
        """Size in bytes, or ``None`` when the file does not exist."""

    @abc.abstractmethod
    async def kill(self, handle: SandboxHandle, signal: int) -> bool:
        """Signal the agent's process group; ``True`` when a process was signalled."""

    @abc.abstractmethod
    async def processes_alive(self, handle: SandboxHandle) -> bool:
        """Whether any of the agent's processes is still running."""

    @abc.abstractmethod
    async def exists(self, handle: SandboxHandle) -> bool:
        """Whether the sandbox still exists."""

    def cert_check_every(self) -> float | None:
        """Seconds between looks at whether a sandbox daemon's TLS certificate is due for
        renewal (:meth:`renew_tls`); ``None``: this provider's daemons serve no certificate
        minted for them (no sandbox CA), nothing to renew."""
        return None

    async def renew_tls(self, handle: SandboxHandle) -> float | None:
        """Renew the sandbox daemon's TLS certificate when less than a third of its TTL is
        left (:func:`sandbox_host.providers._sandbox_tls.renew_if_due`), in place: no restart,
        open follows go on. The new expiry (Unix seconds), ``None`` when none was due.

        Raises:
            OSError: the daemon could not be reached.
            ValueError: the daemon refused the certificate.
        """
        return None

    @abc.abstractmethod
    async def destroy(self, handle: SandboxHandle) -> bool:
        """Kill everything and remove the sandbox; ``True`` when something was destroyed."""

    async def destroy_leftovers(self, run_id: str, keep_key: str | None) -> int:
        """Remove every sandbox of ``run_id`` except ``keep_key``; returns how many.

        Catches sandboxes no registry knows: a host that died between creating a sandbox
        and registering it leaves one behind, and its successor builds its own. Called once
        a run is final. The default finds nothing (providers that cannot list by run).
        """
        return 0

    async def remove_thread_dir(self, thread_dir: str) -> bool:
        """Remove a thread's working directory and agent home (see ``SandboxSpec.thread_dir``);
        ``True`` when something was removed. The default keeps nothing per thread."""
        return False

    async def export_tree(self, handle: SandboxHandle) -> bytes:
        """An uncompressed tar of the sandbox's working directory (members ``work/…``) and
        agent home (``home/…``, when it has one), with relative member names.

        Raises:
            NotImplementedError: the provider cannot export.
        """
        raise NotImplementedError(f"{self.name} sandboxes cannot be exported")

    async def import_tree(self, handle: SandboxHandle, tar: bytes, *, replace: bool = False) -> None:
        """Extract a tar as :meth:`export_tree` makes it into the working directory and home.

        Args:
            handle: the sandbox.
            tar: the tree.
            replace: empty the working directory and home first (a restore over a thread
                directory an earlier turn left).

        Raises:
            SandboxBuildFailed: ``step="import"`` for a member that is absolute, climbs out
                (``..``), or lies outside ``work/`` and ``home/``; nothing is extracted then.
        """
        raise NotImplementedError(f"{self.name} sandboxes cannot be imported")

    async def remove_idle_thread_dirs(self, marked_before: float) -> int:
        """Remove this machine's thread directories that hold a snapshot exactly (marked by
        :meth:`mark_tree`) and were marked before ``marked_before`` (seconds since the
        epoch); the number removed. The default keeps nothing per thread."""
        return 0

    async def tree_marker(self, handle: SandboxHandle) -> str | None:
        """The snapshot digest :meth:`mark_tree` last left on the sandbox's thread directory,
        ``None`` when unknown (the default: a provider whose sandboxes start empty)."""
        return None

    async def mark_tree(self, handle: SandboxHandle, digest: str) -> None:
        """Note that the sandbox's thread directory holds snapshot ``digest`` exactly, so the
        thread's next run on this machine may use it as it is (the default keeps nothing)."""


async def run_host_command(argv: Sequence[str], cwd: str | None, env: Mapping[str, str]) -> tuple[int, bytes]:
    """Run a command on the host (sandbox set-up: git, a setup script) → ``(exit code, stderr)``.

    stdout is discarded; a cancelled caller kills the command (its whole process group: a
    setup script's children too) before the cancel goes on.
    """
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=dict(env),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    try:
        _, err = await proc.communicate()
    except BaseException:
        if proc.returncode is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                proc.kill()
            await asyncio.shield(proc.wait())
        raise
    assert proc.returncode is not None
    return proc.returncode, err


@dataclass
class Sandbox:
    """One sandbox of a run (built by this host or re-opened from the registry).

    Attributes:
        provider: the provider that built it.
        handle: the provider's handle (paths, container id, ...).
        nonce: the journal sentinel's nonce (``""`` when the registry had none).
        destroyed: set once the sandbox is confirmed gone.
    """

    provider: Provider
    handle: SandboxHandle
    nonce: str
    destroyed: bool = False
