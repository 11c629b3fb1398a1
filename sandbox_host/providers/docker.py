"""The ``docker`` provider: one container per run through the Docker SDK (docs/design.md §5.1).

A sandbox is a container of the sandbox image (default ``BATON_DOCKER_IMAGE``) whose PID 1
is ``docker-init`` (so orphaned agents are reaped and a finished agent is really gone)
running the sandbox daemon (:mod:`sandbox_host.daemon`, on port 7300 of the container's
address; started again whenever it ends); it carries the labels ``baton.sandbox_key`` and
``baton.run_id``. Inside it:

- ``/workspace``: the agent's working directory (a local directory, or a git repository
  cloned **on the host** at ``git_ref``, sent in as one tree through the container's daemon,
  so the image needs no git and no credentials of the host reach it);
- ``/baton``: the launch wrapper, the one-shot nonce file and the prompt (mode 0700);
- ``<journal_dir>/<file stem of the key>.ndjson`` and ``.err``: journal and stderr
  (:func:`sandbox_host.journal.journal_path`, default dir ``/tmp/baton-runs``).

The image provides ``/opt/baton-daemon/bin/python`` with the daemon's dependencies
(scripts/docker_setup.sh); the daemon's source is copied in from this host before the
container starts (:mod:`sandbox_host.daemon._bundle`), so it is this host's code. Every read,
follow, copy, launch, input and signal of a run goes through the daemon, over the
container's address (``data["daemon"]``), authenticated with the sandbox's own token
(:func:`sandbox_host.daemon.sandbox_token`), in plaintext, or with a sandbox CA
(``BATON_SANDBOX_CA_*``) over TLS with a certificate minted for the container and checked
against that CA (:mod:`sandbox_host.providers._sandbox_tls`); the cluster's own TLS
certificates are never copied into sandboxes. The setup commands (the daemon's ``Exec``) and
the tree exports and imports go through the daemon too. The engine is used to create and
remove containers (and to make their first directories before the daemon serves). The handle
holds the container id, the daemon's address and the process group, so any host that reaches
the same engine and the containers' network re-opens the sandbox with a fresh
``DockerProvider``.

Secrets go only into the environment of the setup commands and the agent's launch (both
through the daemon), never into the container's config (``docker inspect`` shows that),
and are redacted from every error this module raises.

The SDK is blocking: every call runs in a thread (``asyncio.to_thread``).
"""
from __future__ import annotations

import asyncio
import dataclasses
import os
import posixpath
from typing import Any, AsyncIterator, Mapping, Sequence

import docker
import docker.errors
from docker.utils import kwargs_from_env
import requests.exceptions

from baton import config, internal_auth
from baton.errors import SandboxBuildFailed, SandboxReclaimFailed
from sandbox_host import journal as _journal
from sandbox_host.daemon import DEFAULT_PORT, sandbox_token
from sandbox_host.daemon._bundle import source_tar
from sandbox_host.providers._base import Chunk, Provider, SandboxHandle, SandboxSpec, check_input
from sandbox_host.providers import _workspace as _ws
from sandbox_host.providers import _sandbox_tls
from sandbox_host.providers._daemon_backed import DaemonBacked
from sandbox_host.providers._daemon_client import DaemonClient, DaemonUnreachable, SandboxGone
from sandbox_host.providers._redact import redact

#: Bytes of a failing step's stderr kept in ``SandboxBuildFailed.detail``.
STDERR_TAIL = 2000
WORKDIR = "/workspace"
#: The agent's home in a sandbox of a thread (``SandboxSpec.thread_dir``).
HOME = "/home/agent"
META_DIR = "/baton"
JOURNAL_DIR = "/tmp/baton-runs"
LABEL_KEY = "baton.sandbox_key"
LABEL_RUN = "baton.run_id"
LABEL_TOKEN = "baton.create_token"
#: The image's Python with the daemon's dependencies (scripts/docker_setup.sh), and where
#: the daemon's source is copied in (:mod:`sandbox_host.daemon._bundle`).
DAEMON_PYTHON = "/opt/baton-daemon/bin/python"
DAEMON_SRC = "/opt/baton-daemon/src"
#: Where the daemon's TLS certificate and key are put (root's, 0400) with a sandbox CA.
TLS_DIR = "/etc/baton-sandbox-tls"
#: Seconds a new container's daemon may take to serve.
DAEMON_START_TIMEOUT = 60.0
# The container's main process (under docker-init): the sandbox daemon, started again
# whenever it ends (its agents live on, in sessions of their own). The token comes as an
# argument, not in the container's environment that setup commands and agents inherit; a
# fourth argument (non-empty) makes it serve TLS with the files of TLS_DIR.
_DAEMON_LOOP = (
    'while :; do BATON_INTERNAL_TOKEN="$1" BATON_TLS_CERT="${4:+' + TLS_DIR + '/tls.crt}" '
    'BATON_TLS_KEY="${4:+' + TLS_DIR + '/tls.key}" PYTHONPATH=' + DAEMON_SRC + ' BATON_SANDBOX_DAEMON_OWN_ENV=PYTHONPATH '
    + DAEMON_PYTHON + ' -m sandbox_host.daemon --listen 0.0.0.0:"$2" --workdir ' + WORKDIR + ' --state ' + META_DIR
    + ' --root ' + WORKDIR + ' --root ' + META_DIR + ' --root "$3" --root ' + HOME
    + ' --idle-check 0.05 >>/var/log/baton-daemon.log 2>&1; sleep 0.2; done'
)


class DockerProvider(DaemonBacked, Provider):
    """Sandboxes as Docker containers, one per run.

    Args:
        client: an SDK client to use (the caller keeps ownership); default: a new client
            from the environment (``DOCKER_HOST`` …), closed by :meth:`close`.
        image: default image when the spec names none (default ``BATON_DOCKER_IMAGE``).
        journal_dir: journal directory inside containers.
        network_mode: the containers' network (``None`` = ``BATON_DOCKER_NETWORK``, else the
            engine's default bridge); the host must reach the containers' addresses on it.
        sandbox_ca: the sandbox CA (default ``BATON_SANDBOX_CA_*``): each container's daemon
            serves TLS with a certificate minted at create, checked against it.

    May block briefly while constructing the default client (it asks the engine for its
    API version).
    """

    name = "docker"
    killable_processes = True
    can_follow = True

    def __init__(self, client: docker.DockerClient | None = None, *, image: str | None = None,
                 journal_dir: str = JOURNAL_DIR, network_mode: str | None = None,
                 sandbox_ca: _sandbox_tls.SandboxCa | None | str = "env") -> None:
        self._ca = _sandbox_tls.from_env() if isinstance(sandbox_ca, str) else sandbox_ca
        self._owns_client = client is None
        self._client = client if client is not None else client_from_env()
        self._api = self._client.api
        self.image = image or config.get("BATON_DOCKER_IMAGE")
        self.journal_dir = journal_dir
        self.network_mode = network_mode or config.get("BATON_DOCKER_NETWORK") or None
        self._token = internal_auth.token_from_env()
        self._clients: dict[str, DaemonClient] = {}
        self._bundle: bytes | None = None

    def _daemon(self, handle: SandboxHandle) -> DaemonClient:
        """The container's daemon client (plaintext: the cluster's certificates stay out of
        sandboxes; the sandbox's own token authenticates)."""
        cid = self._cid(handle)
        c = self._clients.get(cid)
        if c is None:
            async def resolve() -> str:
                return await self._address(handle)

            async def gone() -> bool:
                return not await self.exists(handle)

            c = self._clients[cid] = DaemonClient(resolve, token=sandbox_token(self._token, handle.key), gone=gone,
                                                  tls=_sandbox_tls.tls_for(handle, self._ca))
        return c

    async def _address(self, handle: SandboxHandle) -> str:
        """``ip:port`` of the container's daemon (the handle's, else asked of the engine).

        Raises:
            SandboxGone: the container is gone or has no address.
        """
        known = handle.data.get("daemon")
        if known:
            return str(known)
        try:
            info = await asyncio.to_thread(self._api.inspect_container, self._cid(handle))
        except docker.errors.NotFound as exc:
            raise SandboxGone(f"container {self._cid(handle)[:12]} is gone") from exc
        ip = _container_ip(info)
        if not ip:
            raise SandboxGone(f"container {self._cid(handle)[:12]} has no address")
        return f"{ip}:{DEFAULT_PORT}"

    async def aclose(self) -> None:
        """Close the daemons' channels and the SDK client when this provider created it."""
        clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            await c.close()
        self.close()

    def close(self) -> None:
        """Close the SDK client when this provider created it (idempotent)."""
        if self._owns_client:
            self._client.close()
            self._owns_client = False

    async def __aenter__(self) -> "DockerProvider":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # --- exec helpers ---------------------------------------------------------------------

    def _exec_sync(
        self,
        container_id: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        workdir: str | None = None,
    ) -> tuple[int, bytes, bytes]:
        ex = self._api.exec_create(
            container_id, list(argv), stdout=True, stderr=True, environment=dict(env or {}), workdir=workdir
        )
        out, err = self._api.exec_start(ex["Id"], demux=True)
        code = self._api.exec_inspect(ex["Id"])["ExitCode"]
        return int(code if code is not None else -1), out or b"", err or b""

    async def _exec(
        self,
        container_id: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        workdir: str | None = None,
    ) -> tuple[int, bytes, bytes]:
        """Run a command in the container and wait for it: ``(exit code, stdout, stderr)``.

        Raises:
            docker.errors.NotFound: the container is gone.
            docker.errors.APIError: e.g. the container is not running.
        """
        return await asyncio.to_thread(self._exec_sync, container_id, argv, env=env, workdir=workdir)

    @staticmethod
    def _cid(handle: SandboxHandle) -> str:
        return str(handle.data["container_id"])

    async def _with_daemon(self, handle: SandboxHandle) -> SandboxHandle:
        """The handle with its daemon's address, once that daemon serves.

        Raises:
            SandboxBuildFailed: ``daemon``: it did not serve within
                :data:`DAEMON_START_TIMEOUT` (the tail of its log), or the container is gone.
        """
        address = await self._address(handle)
        handle = dataclasses.replace(handle, data={**handle.data, "daemon": address})
        try:
            await self._daemon(handle).wait_serving(DAEMON_START_TIMEOUT)
        except (DaemonUnreachable, SandboxGone) as exc:
            code, out, _ = await self._exec(self._cid(handle), ["sh", "-c", "tail -c 600 /var/log/baton-daemon.log"])
            raise SandboxBuildFailed("daemon", f"{exc}: {_tail(out) or '(no log)'}") from None
        return handle

    async def _forget(self, container_id: str) -> None:
        c = self._clients.pop(container_id, None)
        if c is not None:
            await c.close()

    # --- building -------------------------------------------------------------------------

    async def create(self, key: str, spec: SandboxSpec) -> SandboxHandle:
        """Start the container, fill the workspace, run the setup commands in order.

        The container's labels are ``baton.sandbox_key = key`` and ``baton.run_id`` =
        ``spec.env["BATON_RUN_ID"]`` when given, else the key (the driver uses the run id
        as the sandbox key). On any failure the container is removed again.

        Raises:
            SandboxBuildFailed: ``step`` is ``"container"`` (image missing, engine error),
                ``"workspace"`` (copy or git clone/checkout failed) or ``"setup[i]"`` (the
                i-th setup command exited non-zero); ``detail`` is the redacted stderr tail.
        """
        image = spec.image or self.image
        # The token finds this very container again should the create be cancelled midway
        # (never another sandbox of the same key).
        token = os.urandom(8).hex()
        labels = {LABEL_KEY: key, LABEL_RUN: spec.env.get("BATON_RUN_ID", key), LABEL_TOKEN: token}
        # A cancelled await does not stop the thread: it may still create and start the
        # container after the cancel. So the removal waits for the thread to end first.
        if self._bundle is None:
            self._bundle = await asyncio.to_thread(source_tar, DAEMON_SRC)
        server = await asyncio.to_thread(self._ca.mint, key) if self._ca is not None else None
        starting = asyncio.ensure_future(asyncio.to_thread(self._start_container, image, labels, dict(spec.env),
                                                           sandbox_token(self._token, key), server))
        try:
            container_id = await asyncio.shield(starting)
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise SandboxBuildFailed("container", redact(f"{image}: {_explain(exc)}", spec.secrets)) from exc
        except BaseException:
            await asyncio.shield(self._undo_start(starting, token))
            raise
        home = HOME if spec.thread_dir is not None else None
        handle = SandboxHandle(
            provider=self.name,
            key=key,
            journal_path=_journal.journal_path(self.journal_dir, key),
            stderr_path=_journal.stderr_path(self.journal_dir, key),
            workdir=WORKDIR,
            data={"container_id": container_id, "pgid": None, **({"home": home} if home else {}),
                  **({"daemon_tls": True} if server else {})},
        )
        steps = _ws.BuildSteps()
        try:
            code, _, err = await self._exec(container_id, [
                "sh", "-c", f"mkdir -p {WORKDIR} {self.journal_dir} {home + '/.codex' if home else ''}"
                            f" && mkdir -m 700 -p {META_DIR}"])
            if code != 0:
                raise SandboxBuildFailed("container", redact(f"exit {code}: {_tail(err)}", spec.secrets))
            handle = await self._with_daemon(handle)
            async with _ws.build_budget(spec.build_timeout, steps):
                # Built on the host, then sent and set up through the container's daemon, as
                # for every provider.
                if spec.workspace is not None:
                    await _ws.fill(self._daemon(handle), spec, workdir=WORKDIR, home=home or "")
                await _ws.run_setup(self._daemon(handle), spec, steps, workdir=WORKDIR, home=home or "")
        except BaseException as exc:
            await asyncio.shield(self._forget(container_id))
            await asyncio.shield(self._remove(container_id))
            if isinstance(exc, (docker.errors.DockerException, requests.exceptions.RequestException)):
                raise SandboxBuildFailed("container", redact(_explain(exc), spec.secrets)) from exc
            raise
        return handle

    def _start_container(self, image: str, labels: Mapping[str, str], env: Mapping[str, str], token: str,
                         server: _sandbox_tls.ServerCert | None = None) -> str:
        # The low-level API, not ``containers.run``: that one tries to pull a missing image,
        # and sandbox images are built locally (no registry is assumed reachable).
        host_config = self._api.create_host_config(init=True, network_mode=self.network_mode)
        created = self._api.create_container(
            image,
            ["sh", "-c", _DAEMON_LOOP, "baton-daemon", token, str(DEFAULT_PORT), self.journal_dir,
             "1" if server else ""],
            detach=True,
            labels=dict(labels),
            environment=dict(env),
            working_dir="/",
            host_config=host_config,
        )
        container_id = str(created["Id"])
        try:
            assert self._bundle is not None
            self._api.put_archive(container_id, "/", self._bundle)  # the daemon's source, before it starts
            if server is not None:
                self._api.put_archive(container_id, "/", _sandbox_tls.files_tar(TLS_DIR, server))
            self._api.start(container_id)
        except BaseException:
            self._api.remove_container(container_id, force=True, v=True)
            raise
        return container_id

    async def _remove(self, container_id: str) -> bool:
        """Force-remove a container and its volumes.

        Returns:
            True once removed; False when it is gone already (404) or another removal of it
            is under way (the engine answers 409 "removal ... already in progress": a run's
            final sweep and a failed build may remove the same container at once).

        Raises:
            docker.errors.DockerException, requests.exceptions.RequestException: the engine
                refused otherwise or could not be reached.
        """
        try:
            await asyncio.to_thread(self._api.remove_container, container_id, force=True, v=True)
        except docker.errors.NotFound:
            return False
        except docker.errors.APIError as exc:
            if exc.status_code == 409 and "already in progress" in str(exc.explanation or ""):
                return False
            raise
        return True

    async def _undo_start(self, starting: asyncio.Future[str], token: str) -> None:
        """Once the start's thread has ended (however), remove the container it built."""
        await asyncio.wait([starting])
        if not starting.cancelled():
            starting.exception()  # retrieved: the caller raises its own error
        await self._remove_labelled(LABEL_TOKEN, token)

    async def _remove_labelled(self, label: str, value: str) -> None:
        try:
            found = await asyncio.to_thread(self._api.containers, all=True, filters={"label": f"{label}={value}"})
            for c in found:
                await self._remove(str(c["Id"]))
        except (docker.errors.DockerException, requests.exceptions.RequestException):
            pass  # the engine is unreachable: nothing more can be done from here

    async def copy_in(self, handle: SandboxHandle, path: str, content: bytes, mode: int = 0o644) -> None:
        """Write ``content`` to ``path`` (absolute, or relative to the workspace).

        Raises:
            SandboxReclaimFailed: the container is gone.
        """
        target = posixpath.join(handle.workdir, path)
        try:
            await self._daemon(handle).copy_in(target, content, mode)
        except FileNotFoundError as exc:  # SandboxGone
            raise SandboxReclaimFailed(handle.key, "container not found") from exc

    # --- running --------------------------------------------------------------------------

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
        """Start ``argv`` under the wrapper, detached, in a new session, through the
        container's daemon; returns ``{"pgid", "daemon"}`` (and ``"inbox"``, its path in the
        container, when ``interactive``).

        The journal is created (empty) before the agent starts, so an attach preflight sees
        it at once. ``env`` and ``secrets`` reach the agent's environment only (on top of
        the container's). Returns once the process group exists; does not wait for the agent.

        Raises:
            SandboxBuildFailed: ``step="launch"`` when the container is gone or the daemon
                refuses (detail redacted).
        """
        pgid, inbox = await self._daemon(handle).launch(
            argv, nonce=nonce, stdin=stdin, env=env, secrets=secrets, interactive=interactive,
            journal_path=handle.journal_path, stderr_path=handle.stderr_path,
            home=str(handle.data.get("home") or ""), workdir=handle.workdir)
        out: dict[str, Any] = {"pgid": pgid, "daemon": await self._address(handle)}
        if inbox:
            out["inbox"] = inbox
        return out

    async def send_input(self, handle: SandboxHandle, input_id: str, payload: bytes) -> None:
        """Append the input's line to the inbox (one write, by the daemon). Raises
        ``ValueError`` (``check_input``), ``PermissionError`` (the inbox takes no line: a link
        or not a regular file), ``SandboxReclaimFailed`` (not delivered)."""
        line = check_input(handle, input_id, payload)
        try:
            await self._daemon(handle).send_input(handle.inbox_path, line)
        except PermissionError:
            raise
        except OSError as exc:
            raise SandboxReclaimFailed(handle.key, str(exc)) from exc

    async def follow(self, handle: SandboxHandle, path: str, offset: int) -> AsyncIterator[Chunk]:
        """Yield the file's bytes from ``offset`` as written, from the container's daemon
        (a restarted daemon is followed on from the offset reached).

        Raises:
            FileNotFoundError: the file does not exist, was deleted, or the container is
                gone.
        """
        async for chunk in self._daemon(handle).follow(path, offset):
            yield chunk

    async def read_file(self, handle: SandboxHandle, path: str, offset: int = 0, limit: int | None = None) -> bytes:
        """Bytes of a file from ``offset`` (at most ``limit``), from the container's daemon.

        Raises:
            FileNotFoundError: the file or the container does not exist.
        """
        return await self._daemon(handle).read_file(path, offset, limit)

    async def exists(self, handle: SandboxHandle) -> bool:
        """Whether the container exists and runs (a stopped one can no longer be exec'd)."""
        try:
            info = await asyncio.to_thread(self._api.inspect_container, self._cid(handle))
        except docker.errors.NotFound:
            return False
        return bool(info["State"].get("Running"))

    async def destroy(self, handle: SandboxHandle) -> bool:
        """Remove the container by force (its processes, journal and workspace with it).

        Returns:
            ``True`` when a container was removed, ``False`` when it was already gone or
            another removal of it is under way (the caller checks :meth:`exists`).

        Raises:
            SandboxReclaimFailed: the engine refused or could not be reached.
        """
        try:
            return await self._remove(self._cid(handle))
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise SandboxReclaimFailed(handle.key, _explain(exc)) from exc
        finally:
            # After the removal: a follow cut off by the closed channel then finds the sandbox gone.
            await self._forget(self._cid(handle))

    async def destroy_leftovers(self, run_id: str, keep_key: str | None) -> int:
        """Remove the containers labelled ``baton.run_id = run_id`` except sandbox ``keep_key``.

        Raises:
            SandboxReclaimFailed: the engine refused or could not be reached.
        """
        try:
            found = await asyncio.to_thread(
                self._api.containers, all=True, filters={"label": f"{LABEL_RUN}={run_id}"}
            )
            removed = 0
            for c in found:
                if keep_key is not None and (c.get("Labels") or {}).get(LABEL_KEY) == keep_key:
                    continue
                removed += await self._remove(str(c["Id"]))
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise SandboxReclaimFailed(run_id, _explain(exc)) from exc
        return removed

    async def export_tree(self, handle: SandboxHandle) -> bytes:
        """Tar of ``work/`` and ``home/`` (see :mod:`._tree`), made by the container's daemon;
        ``SandboxReclaimFailed`` when the container is gone."""
        try:
            return await self._daemon(handle).export_tree(handle.workdir, str(handle.data.get("home") or ""))
        except SandboxGone as exc:
            raise SandboxReclaimFailed(handle.key, "container not found") from exc

    async def import_tree(self, handle: SandboxHandle, tar: bytes, *, replace: bool = False) -> None:
        """Extract an exported tar through the container's daemon (see :mod:`._tree`);
        ``SandboxBuildFailed("import")`` for a bad member (nothing written),
        ``SandboxReclaimFailed`` when the container is gone."""
        try:
            await self._daemon(handle).import_tree(tar, workdir=handle.workdir,
                                                   home=str(handle.data.get("home") or ""), replace=replace)
        except SandboxGone as exc:
            raise SandboxReclaimFailed(handle.key, "container not found") from exc

    # --- discovery ------------------------------------------------------------------------

    async def find(self, key: str) -> list[str]:
        """Ids of the containers labelled with sandbox ``key`` (running or not)."""
        found = await asyncio.to_thread(self._api.containers, all=True, filters={"label": f"{LABEL_KEY}={key}"})
        return [str(c["Id"]) for c in found]


#: The API version a client starts with, before it asks the engine for its own (what the
#: provider needs: ``init`` in a host config came with 1.25).
_MIN_API = "1.25"


def client_from_env() -> docker.DockerClient:
    """``docker.from_env()`` (``DOCKER_HOST``, ``DOCKER_TLS_VERIFY``, ``DOCKER_CERT_PATH``), made
    so that a TLS engine's ``DOCKER_CERT_PATH/ca.pem`` is the CA it is checked against.

    requests lets ``REQUESTS_CA_BUNDLE`` / ``CURL_CA_BUNDLE`` override a session's CA (the
    environment wins over ``session.verify``): set on a host, they would make the engine's
    certificate fail to verify, already at the SDK's first call (asking the engine for its
    API version). So the session ignores the environment (no HTTP proxy to the engine
    either), and the version is asked for after that.

    Raises:
        docker.errors.DockerException: the engine cannot be reached or refuses.
    """
    client = docker.DockerClient(**kwargs_from_env(), version=_MIN_API)
    client.api.trust_env = False
    try:
        # What version="auto" does, once the session no longer reads the environment.
        client.api._version = str(client.api.version(api_version=False)["ApiVersion"])  # type: ignore[attr-defined]
    except BaseException:
        client.close()
        raise
    return client


def _container_ip(info: Mapping[str, Any]) -> str:
    """The container's address on its (first) network, ``""`` when it has none."""
    settings = info.get("NetworkSettings") or {}
    for net in (settings.get("Networks") or {}).values():
        if net and net.get("IPAddress"):
            return str(net["IPAddress"])
    return str(settings.get("IPAddress") or "")


def _explain(exc: BaseException) -> str:
    """A one-line reason from an SDK error (the engine's message, not a traceback)."""
    if isinstance(exc, docker.errors.APIError) and exc.explanation:
        return str(exc.explanation)
    return f"{type(exc).__name__}: {exc}"


def _tail(err: bytes) -> str:
    return err[-STDERR_TAIL:].decode("utf-8", "replace").strip()


__all__ = ["DockerProvider", "JOURNAL_DIR", "LABEL_KEY", "LABEL_RUN", "META_DIR", "WORKDIR"]
