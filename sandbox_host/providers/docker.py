"""The ``docker`` provider: one container per run through the Docker SDK (docs/design.md §5.1).

A sandbox is a container of the sandbox image (default ``BATON_DOCKER_IMAGE``) whose PID 1
is ``docker-init`` (so orphaned agents are reaped and a finished agent is really gone)
running ``sleep infinity``; it carries the labels ``baton.sandbox_key`` and
``baton.run_id``. Inside it:

- ``/workspace``: the agent's working directory (a local directory copied in with
  ``put_archive``, or a git repository cloned **on the host** at ``git_ref`` and copied in,
  so the image needs no git and no credentials of the host reach it);
- ``/baton``: the launch wrapper, the one-shot nonce file and the prompt (mode 0700);
- ``<journal_dir>/<file stem of the key>.ndjson`` and ``.err``: journal and stderr
  (:func:`sandbox_host.journal.journal_path`, default dir ``/tmp/baton-runs``).

Everything else happens through ``exec``: setup commands, the detached launch of the
shared wrapper (:mod:`sandbox_host._wrapper`) under ``setsid``, following a file with
``tail -c +N -f``, reading with ``tail -c +N``, signalling the agent's process group with
``kill -SIG -PGID``. The handle holds the container id and the process group, so any host
that reaches the same engine re-opens the sandbox with a fresh ``DockerProvider``.

Secrets go only into the environment of the execs that need them (setup commands and the
agent), never into the container's config (``docker inspect`` shows that), and are
redacted from every error this module raises.

The SDK is blocking: every call runs in a thread (``asyncio.to_thread``); each follow
stream has its own reader thread so long-lived streams never starve the default executor.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import os
import posixpath
import shutil
import tempfile
import time
from typing import Any, AsyncIterator, Mapping, Sequence

import docker
import docker.errors
import requests.exceptions

from baton import config
from baton.errors import SandboxBuildFailed, SandboxReclaimFailed
from sandbox_host import journal as _journal
from sandbox_host._wrapper import wrapper_argv, wrapper_script
from sandbox_host.providers._base import Provider, SandboxHandle, SandboxSpec, check_input
from sandbox_host.providers import _tree
from sandbox_host.providers import _workspace as _ws
from sandbox_host.providers._docker_stream import ExecStream, open_exec_stream
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
#: Exit code our helper scripts use for "the file does not exist".
_ENOENT = 3
# Launch: `setsid` (not forking, as a background job of a non-interactive sh is no group
# leader) makes the wrapper a session and group leader with pid == pgid; sh prints it and
# exits, and the wrapper lives on in the container (reparented to docker-init).
_LAUNCHER = 'setsid "$@" </dev/null >/dev/null 2>&1 & echo $!'
# Follow: print our pid first (so the stream can be stopped from another exec), then tail
# the file; a watcher loop ends the exec with _ENOENT when the file is deleted, which
# `tail -f` (following the open inode) would never notice. GNU tail does not trust inotify
# on overlayfs and polls instead, once a second by default: `-s 0.05` keeps latency low.
_FOLLOWER = (
    'echo $$; [ -e "$2" ] || exit 3; '
    'tail -s 0.05 -c +"$1" -f -- "$2" & t=$!; '
    "trap 'kill $t 2>/dev/null; exit 0' TERM; "
    'while [ -e "$2" ] && kill -0 $t 2>/dev/null; do sleep 0.2; done; '
    'kill $t 2>/dev/null; [ -e "$2" ] || exit 3'
)
_READER = '[ -e "$1" ] || exit 3; if [ -n "$3" ]; then tail -c +"$2" -- "$1" | head -c "$3"; else tail -c +"$2" -- "$1"; fi'
_SIZE = '[ -e "$1" ] || exit 3; stat -c %s -- "$1"'
# Pause before restarting a follow exec that ended at once without output (no busy loop).
_FOLLOW_RESTART_BACKOFF = 0.1


class DockerProvider(Provider):
    """Sandboxes as Docker containers, one per run.

    Args:
        client: an SDK client to use (the caller keeps ownership); default: a new client
            from the environment (``DOCKER_HOST`` …), closed by :meth:`close`.
        image: default image when the spec names none (default ``BATON_DOCKER_IMAGE``).
        journal_dir: journal directory inside containers.
        network_mode: the containers' network (``None`` = the engine's default bridge).

    May block briefly while constructing the default client (it asks the engine for its
    API version).
    """

    name = "docker"
    killable_processes = True
    can_follow = True

    def __init__(self, client: docker.DockerClient | None = None, *, image: str | None = None,
                 journal_dir: str = JOURNAL_DIR, network_mode: str | None = None) -> None:
        self._owns_client = client is None
        self._client = client if client is not None else docker.from_env()
        self._api = self._client.api
        self.image = image or config.get("BATON_DOCKER_IMAGE")
        self.journal_dir = journal_dir
        self.network_mode = network_mode

    def close(self) -> None:
        """Close the SDK client when this provider created it (idempotent)."""
        if self._owns_client:
            self._client.close()
            self._owns_client = False

    async def __aenter__(self) -> "DockerProvider":
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

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

    def _put_file_sync(self, container_id: str, path: str, content: bytes, mode: int) -> None:
        _tree.put_file(self._api, container_id, path, content, mode)

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
        starting = asyncio.ensure_future(asyncio.to_thread(self._start_container, image, labels, dict(spec.env)))
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
            data={"container_id": container_id, "pgid": None, **({"home": home} if home else {})},
        )
        env = _ws.setup_env({**_home_env(home), **spec.env, **spec.secrets})
        steps = _ws.BuildSteps()
        try:
            code, _, err = await self._exec(container_id, [
                "sh", "-c", f"mkdir -p {WORKDIR} {self.journal_dir} {home + '/.codex' if home else ''}"
                            f" && mkdir -m 700 -p {META_DIR}"])
            if code != 0:
                raise SandboxBuildFailed("container", redact(f"exit {code}: {_tail(err)}", spec.secrets))
            async with _ws.build_budget(spec.build_timeout, steps):
                await self._workspace(container_id, spec)
                for i, cmd in enumerate(spec.setup):
                    steps.current = f"setup[{i}]"
                    code, _, err = await self._exec(container_id, ["sh", "-c", cmd], env=env, workdir=WORKDIR)
                    if code != 0:
                        raise SandboxBuildFailed(f"setup[{i}]",
                                                 redact(f"exit {code}: {_tail(err)}", _ws.redactions(spec.secrets)))
        except BaseException as exc:
            await asyncio.shield(self._remove_quietly(container_id))
            if isinstance(exc, (docker.errors.DockerException, requests.exceptions.RequestException)):
                raise SandboxBuildFailed("container", redact(_explain(exc), spec.secrets)) from exc
            raise
        return handle

    def _start_container(self, image: str, labels: Mapping[str, str], env: Mapping[str, str]) -> str:
        # The low-level API, not ``containers.run``: that one tries to pull a missing image,
        # and sandbox images are built locally (no registry is assumed reachable).
        host_config = self._api.create_host_config(init=True, network_mode=self.network_mode)
        created = self._api.create_container(
            image,
            ["sleep", "infinity"],
            detach=True,
            labels=dict(labels),
            environment=dict(env),
            working_dir="/",
            host_config=host_config,
        )
        container_id = str(created["Id"])
        try:
            self._api.start(container_id)
        except BaseException:
            self._api.remove_container(container_id, force=True, v=True)
            raise
        return container_id

    async def _remove_quietly(self, container_id: str) -> None:
        try:
            await asyncio.to_thread(self._api.remove_container, container_id, force=True, v=True)
        except docker.errors.NotFound:
            pass

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
                await self._remove_quietly(str(c["Id"]))
        except (docker.errors.DockerException, requests.exceptions.RequestException):
            pass  # the engine is unreachable: nothing more can be done from here

    async def _workspace(self, container_id: str, spec: SandboxSpec) -> None:
        src = spec.workspace
        if src is None:
            return
        tmp = await asyncio.to_thread(tempfile.mkdtemp, prefix="baton-clone-")
        try:
            if _ws.is_git_workspace(spec):
                src = os.path.join(tmp, "repo")
                await _ws.build_tree(spec, src)  # cloned on the host: no git, no credential in the image
            elif not os.path.isdir(src):  # noqa: ASYNC240 -- one stat; the copy itself runs in a thread
                raise SandboxBuildFailed("workspace", redact(f"not a directory: {src}", spec.secrets))
            else:
                await _ws.check_size(src, spec)
            try:
                await asyncio.to_thread(self._put_dir_sync, container_id, src)
            except (OSError, docker.errors.APIError) as exc:
                raise SandboxBuildFailed("workspace", redact(f"copy failed: {exc}", spec.secrets)) from exc
        finally:
            await asyncio.shield(asyncio.to_thread(shutil.rmtree, tmp, True))

    def _put_dir_sync(self, container_id: str, src: str) -> None:
        _tree.put_dir(self._api, container_id, src, WORKDIR)

    async def copy_in(self, handle: SandboxHandle, path: str, content: bytes, mode: int = 0o644) -> None:
        """Write ``content`` to ``path`` (absolute, or relative to the workspace).

        Raises:
            SandboxReclaimFailed: the container is gone.
        """
        target = posixpath.join(handle.workdir, path)
        try:
            await asyncio.to_thread(self._put_file_sync, self._cid(handle), target, content, mode)
        except docker.errors.NotFound as exc:
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
        """Start ``argv`` under the wrapper, detached, in a new session; returns ``{"pgid"}``
        (and ``"inbox"``, its path in the container, when ``interactive``).

        The journal is created (empty) before the agent starts, so an attach preflight sees
        it at once. ``env`` and ``secrets`` become the environment of this exec only.
        Returns once the process group exists; does not wait for the agent.

        Raises:
            SandboxBuildFailed: ``step="launch"`` when the container is gone or the launcher
                misbehaves (detail redacted).
        """
        cid = self._cid(handle)
        tag = os.urandom(8).hex()
        wrapper = f"{META_DIR}/wrapper.sh"
        nonce_file = f"{META_DIR}/nonce-{tag}"
        stdin_file = f"{META_DIR}/stdin-{tag}" if stdin is not None else None
        inbox = f"{META_DIR}/inbox-{tag}" if interactive else ""
        cmd = wrapper_argv(wrapper, handle.journal_path, handle.stderr_path, nonce_file, stdin_file, argv, inbox)
        try:
            await asyncio.to_thread(self._put_file_sync, cid, wrapper, wrapper_script().encode(), 0o755)
            await asyncio.to_thread(self._put_file_sync, cid, nonce_file, nonce.encode(), 0o600)
            if stdin_file is not None:
                await asyncio.to_thread(self._put_file_sync, cid, stdin_file, stdin or b"", 0o600)
            if inbox:
                await asyncio.to_thread(self._put_file_sync, cid, inbox, b"", 0o600)
            code, _, err = await self._exec(
                cid, ["sh", "-c", ': >>"$1"; : >>"$2"', "sh", handle.journal_path, handle.stderr_path]
            )
            if code != 0:
                raise SandboxBuildFailed("launch", redact(f"journal not writable: {_tail(err)}", secrets))
            code, out, err = await self._exec(
                cid,
                ["sh", "-c", _LAUNCHER, "baton-launch", *cmd],
                env={"LANG": "C.UTF-8", **_home_env(handle.data.get("home")), **(env or {}), **(secrets or {})},
                workdir=handle.workdir,
            )
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise SandboxBuildFailed("launch", redact(_explain(exc), secrets)) from exc
        try:
            pgid = int(out.strip())
        except ValueError:
            raise SandboxBuildFailed(
                "launch", redact(f"launcher exit {code} printed {out[-200:]!r}: {_tail(err)}", secrets)
            ) from None
        return {"pgid": pgid, "inbox": inbox} if inbox else {"pgid": pgid}

    async def send_input(self, handle: SandboxHandle, input_id: str, payload: bytes) -> None:
        """Append the input's line to the inbox: an exec whose argv carries the line (never a
        shell string with it inside). Raises ``ValueError`` (``check_input``), ``SandboxReclaimFailed``."""
        line = check_input(handle, input_id, payload).decode("utf-8", "surrogateescape")
        try:
            code, _, err = await self._exec(self._cid(handle), ["sh", "-c", '[ -e "$2" ] || exit 3; printf "%s" "$1" >>"$2"', "sh", line,
                                                                handle.inbox_path])
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise SandboxReclaimFailed(handle.key, _explain(exc)) from exc
        if code != 0:
            raise SandboxReclaimFailed(handle.key, f"inbox append failed: {_tail(err)}")

    async def follow(self, handle: SandboxHandle, path: str, offset: int) -> AsyncIterator[bytes]:
        """Yield the file's bytes from ``offset`` as written, via an exec'd ``tail -c +N -f``.

        The SDK reads exec streams without a timeout, so silence costs nothing; should the
        stream end anyway while the file still exists (engine connection dropped), the exec
        is restarted from the current position. Closing this generator stops the exec
        inside the container too.

        Raises:
            FileNotFoundError: the file does not exist, was deleted, or the container is
                gone.
        """
        cid = self._cid(handle)
        pos = offset
        # One thread per follow: a blocking read may wait for hours, and must not hold a
        # worker of the shared default executor.
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="baton-docker-follow")
        loop = asyncio.get_running_loop()
        try:
            while True:
                started = time.monotonic()
                got = 0
                try:
                    ex = await asyncio.to_thread(
                        self._api.exec_create, cid, ["sh", "-c", _FOLLOWER, "sh", str(pos + 1), path],
                        stdout=True, stderr=False,
                    )
                except docker.errors.NotFound as exc:
                    raise FileNotFoundError(f"{path}: container {cid[:12]} is gone") from exc
                except docker.errors.APIError as exc:  # e.g. container not running
                    raise FileNotFoundError(f"{path}: {_explain(exc)}") from exc
                try:
                    stream = await asyncio.to_thread(open_exec_stream, self._api, ex["Id"])
                except docker.errors.APIError as exc:  # removed between create and start
                    raise FileNotFoundError(f"{path}: {_explain(exc)}") from exc
                tail_pid: int | None = None
                head = b""
                failure: bytes | None = None
                try:
                    while True:
                        data: bytes | None = await loop.run_in_executor(pool, stream.read)
                        if data is None:
                            break
                        if tail_pid is None:
                            head += data
                            nl = head.find(b"\n")
                            if nl < 0:
                                continue
                            try:
                                tail_pid = int(head[:nl])
                            except ValueError:
                                # The engine reports an exec that could not start (e.g. the
                                # container stopped meanwhile) inside the stream itself.
                                failure = head[:200]
                                break
                            data, head = head[nl + 1 :], b""
                            if not data:
                                continue
                        got += len(data)
                        pos += len(data)
                        yield data
                finally:
                    await asyncio.shield(self._stop_follow(cid, stream, tail_pid, pool))
                if failure is not None:
                    if await self.exists(handle):
                        raise OSError(f"following {path} failed: {failure.decode('utf-8', 'replace').strip()}")
                    raise FileNotFoundError(f"{path}: container {cid[:12]} is gone")
                try:
                    info = await asyncio.to_thread(self._api.exec_inspect, ex["Id"])
                except docker.errors.NotFound as exc:
                    raise FileNotFoundError(f"{path}: container {cid[:12]} is gone") from exc
                if info.get("ExitCode") == _ENOENT:
                    raise FileNotFoundError(path)
                if got == 0 and time.monotonic() - started < 1.0:
                    await asyncio.sleep(_FOLLOW_RESTART_BACKOFF)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    async def _stop_follow(
        self, cid: str, stream: ExecStream, pid: int | None, pool: concurrent.futures.ThreadPoolExecutor
    ) -> None:
        """Stop a follow exec: inside the container, then the stream, then the response."""
        if pid is not None:
            # The tail would otherwise live until the container is destroyed.
            try:
                await self._exec(cid, ["sh", "-c", 'kill -TERM "$1"', "sh", str(pid)])  # no /bin/kill in minbase
            except (docker.errors.DockerException, requests.exceptions.RequestException):
                pass  # the container is gone, and the tail with it
        # Shutting the connection down unblocks the reader thread if it still waits.
        await asyncio.to_thread(stream.shutdown)
        # Queued behind the pending read on the follow's one thread, so the response is
        # closed only after the reader has let go of it.
        await asyncio.get_running_loop().run_in_executor(pool, stream.close)

    async def read_file(self, handle: SandboxHandle, path: str, offset: int = 0, limit: int | None = None) -> bytes:
        """Bytes of a file from ``offset`` (at most ``limit``), via an exec'd ``tail -c +N``.

        Raises:
            FileNotFoundError: the file or the container does not exist.
        """
        argv = ["sh", "-c", _READER, "sh", path, str(offset + 1), "" if limit is None else str(limit)]
        try:
            code, out, err = await self._exec(self._cid(handle), argv)
        except docker.errors.NotFound as exc:
            raise FileNotFoundError(f"{path}: container is gone") from exc
        except docker.errors.APIError as exc:
            raise FileNotFoundError(f"{path}: {_explain(exc)}") from exc
        if code == _ENOENT:
            raise FileNotFoundError(path)
        if code != 0:
            raise OSError(f"reading {path} failed with exit {code}: {_tail(err)}")
        return out

    async def file_size(self, handle: SandboxHandle, path: str) -> int | None:
        """Size in bytes; ``None`` when the file (or the container) does not exist."""
        try:
            code, out, _ = await self._exec(self._cid(handle), ["sh", "-c", _SIZE, "sh", path])
        except docker.errors.APIError:
            return None
        return int(out) if code == 0 else None

    async def kill(self, handle: SandboxHandle, signal: int) -> bool:
        """``kill -SIG -PGID`` inside the container; ``False`` when nothing was signalled."""
        pgid = handle.data.get("pgid")
        if not pgid:
            return False
        try:
            code, _, _ = await self._exec(self._cid(handle), ["sh", "-c", f"kill -{int(signal)} -{int(pgid)}"])
        except docker.errors.APIError:
            return False
        return code == 0

    async def processes_alive(self, handle: SandboxHandle) -> bool:
        """Whether the agent's process group has a member (docker-init reaps zombies)."""
        return await self.kill(handle, 0)

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
            ``True`` when a container was removed, ``False`` when it was already gone.

        Raises:
            SandboxReclaimFailed: the engine refused or could not be reached.
        """
        try:
            await asyncio.to_thread(self._api.remove_container, self._cid(handle), force=True, v=True)
        except docker.errors.NotFound:
            return False
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise SandboxReclaimFailed(handle.key, _explain(exc)) from exc
        return True

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
                try:
                    await asyncio.to_thread(self._api.remove_container, c["Id"], force=True, v=True)
                    removed += 1
                except docker.errors.NotFound:
                    pass
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise SandboxReclaimFailed(run_id, _explain(exc)) from exc
        return removed

    async def export_tree(self, handle: SandboxHandle) -> bytes:
        """Tar of ``work/`` and ``home/`` (see :mod:`._tree`); ``SandboxReclaimFailed`` when gone."""
        try:
            return await asyncio.to_thread(_tree.export_docker, self._api, self._cid(handle), handle.workdir,
                                           handle.data.get("home"))
        except docker.errors.NotFound as exc:
            raise SandboxReclaimFailed(handle.key, "container not found") from exc

    async def import_tree(self, handle: SandboxHandle, tar: bytes, *, replace: bool = False) -> None:
        """Extract an exported tar (see :mod:`._tree`); ``SandboxReclaimFailed`` when gone.
        A container starts with an empty working directory: ``replace`` has nothing to empty."""
        try:
            await asyncio.to_thread(_tree.import_docker, self._api, self._cid(handle), tar, handle.workdir,
                                    handle.data.get("home"))
        except docker.errors.NotFound as exc:
            raise SandboxReclaimFailed(handle.key, "container not found") from exc

    # --- discovery ------------------------------------------------------------------------

    async def find(self, key: str) -> list[str]:
        """Ids of the containers labelled with sandbox ``key`` (running or not)."""
        found = await asyncio.to_thread(self._api.containers, all=True, filters={"label": f"{LABEL_KEY}={key}"})
        return [str(c["Id"]) for c in found]


def _home_env(home: str | None) -> dict[str, str]:
    return {"HOME": home, "CODEX_HOME": f"{home}/.codex"} if home else {}


def _explain(exc: BaseException) -> str:
    """A one-line reason from an SDK error (the engine's message, not a traceback)."""
    if isinstance(exc, docker.errors.APIError) and exc.explanation:
        return str(exc.explanation)
    return f"{type(exc).__name__}: {exc}"


def _tail(err: bytes) -> str:
    return err[-STDERR_TAIL:].decode("utf-8", "replace").strip()


__all__ = ["DockerProvider", "JOURNAL_DIR", "LABEL_KEY", "LABEL_RUN", "META_DIR", "WORKDIR"]
