"""The ``kubernetes`` provider: one pod per sandbox, reached through its sandbox daemon
(docs/design.md §5.1).

A sandbox is a pod (:func:`sandbox_host.providers._k8s_pod.pod_manifest`) whose one container
runs the sandbox daemon on the pod's IP; where the agent-sandbox CRD
(``sandboxes.agents.x-k8s.io``, kubernetes-sigs/agent-sandbox) is installed, a ``Sandbox`` of
the same name is created instead and its controller makes the pod. Labels (hashes) and
annotations (the values) name the run and the sandbox key, so any host finds a run's pods
(:meth:`KubernetesProvider.destroy_leftovers`). The handle keeps the pod's name and the
daemon's address: any host that reaches the pod network re-opens the sandbox, and everything
inside it (journal, launch, kill, files, trees) goes through the daemon
(:class:`~sandbox_host.providers.daemon_client.DaemonIO`).

Creating waits, within ``BATON_K8S_READY_TIMEOUT``, for the pod to run and the daemon to
answer its health check; a refused create (RBAC, quota, admission), an image that cannot be
pulled, a pod that ends, or the deadline all raise :class:`SandboxBuildFailed` and leave
nothing behind (the pod is deleted and its deletion confirmed). Destroying deletes the pod
(or its Sandbox) and waits until the API no longer has it.

The client is lightkube (``AsyncClient`` over httpx; docs/deploy.md "Kubernetes" says why).
"""
from __future__ import annotations

import asyncio
import contextlib
import io
import os
import secrets as _secrets
import shutil
import tarfile
import tempfile
import time
from typing import Any, AsyncIterator, Mapping, Sequence

import httpx2
from lightkube import AsyncClient, KubeConfig
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.core_v1 import Pod

from baton import config
from baton.errors import SandboxBuildFailed, SandboxReclaimFailed
from sandbox_host.providers import _k8s_pod as kp
from sandbox_host.providers import _workspace as _ws
from sandbox_host.providers._base import Provider, SandboxHandle, SandboxSpec
from sandbox_host.providers._redact import redact

JOURNAL = "baton/journal.ndjson"
STDERR = "baton/journal.err"
WORKDIR = "work"
HOME = "home"

SandboxResource = create_namespaced_resource(*kp.AGENT_SANDBOX[:2], "Sandbox", kp.AGENT_SANDBOX[2])
_TRANSPORT_ERRORS = (httpx2.TransportError, OSError)


class KubernetesProvider(Provider):
    """Sandboxes as pods (see the module docstring).

    Args:
        client: a lightkube ``AsyncClient`` to use (the caller keeps it); default: one from
            ``BATON_K8S_KUBECONFIG`` (or in-cluster / ``~/.kube/config``), closed by :meth:`close`.
        namespace: where sandbox pods go (default ``BATON_K8S_NAMESPACE``, else the client's).
        settings: what every pod gets (default: from ``BATON_K8S_*``).
        ready_timeout: seconds a create waits for the pod and its daemon (default
            ``BATON_K8S_READY_TIMEOUT``).
        agent_sandbox: ``"auto"`` (a Sandbox where the CRD is served, else a bare pod),
            ``"off"``, ``"on"`` (default ``BATON_K8S_AGENT_SANDBOX``).
        io: the daemon client for the sandbox's insides (default: a new one).
    """

    name = "kubernetes"
    killable_processes = True
    can_follow = True

    def __init__(self, client: AsyncClient | None = None, *, namespace: str | None = None,
                 settings: kp.PodSettings | None = None, ready_timeout: float | None = None,
                 agent_sandbox: str | None = None, io: Provider | None = None) -> None:
        self._owns_client = client is None
        if client is None:
            path = config.get("BATON_K8S_KUBECONFIG")
            client = AsyncClient(KubeConfig.from_file(path) if path else KubeConfig.from_env(), trust_env=False,
                                 timeout=httpx2.Timeout(10.0))
        self._client = client
        self.namespace = namespace or config.get("BATON_K8S_NAMESPACE") or client.namespace
        self.settings = settings or settings_from_env()
        self.ready_timeout = ready_timeout if ready_timeout is not None else config.get_float("BATON_K8S_READY_TIMEOUT")
        self.agent_sandbox = agent_sandbox or config.get("BATON_K8S_AGENT_SANDBOX")
        self._io_given = io
        self._crd: bool | None = None

    @property
    def _io(self) -> Provider:
        if self._io_given is None:
            from sandbox_host.providers.daemon_client import DaemonIO

            self._io_given = DaemonIO()
        return self._io_given

    async def close(self) -> None:
        """Close the API client when this provider created it (idempotent)."""
        if self._owns_client:
            self._owns_client = False
            await self._client.close()

    async def __aenter__(self) -> "KubernetesProvider":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- building -------------------------------------------------------------------------

    async def _uses_crd(self) -> bool:
        """Whether sandboxes are agent-sandbox ``Sandbox`` resources (asked once)."""
        if self._crd is None:
            if self.agent_sandbox == "off":
                self._crd = False
            elif self.agent_sandbox == "on":
                self._crd = True
            else:
                try:
                    async for _ in self._client.list(SandboxResource, namespace=self.namespace, chunk_size=1):
                        break
                    self._crd = True
                except ApiError as exc:
                    if exc.status.code not in (403, 404):
                        raise
                    self._crd = False  # not served, or not ours to use: bare pods
        return self._crd

    async def create(self, key: str, spec: SandboxSpec) -> SandboxHandle:
        """Create the pod (or Sandbox), wait until its daemon serves, fill the workspace.

        Raises:
            SandboxBuildFailed: ``step`` is ``"pod"`` (the API refused the create: RBAC,
                quota, admission; the pod ended or was deleted while starting; the API is
                unreachable), ``"image"`` (the image cannot be pulled, or the container not
                created), ``"daemon"`` (the pod runs but its daemon did not answer within
                the ready timeout), ``"workspace"`` or ``"setup[i]"``. Nothing is left
                behind: whatever was created is deleted first.
        """
        run_id = spec.env.get("BATON_RUN_ID", key)
        name = kp.pod_name(key, _secrets.token_hex(3))
        token = _secrets.token_hex(8)
        pod = kp.pod_manifest(name, key=key, run_id=run_id, token=token, env=spec.env, settings=self.settings,
                              resources=spec.resources)
        crd = False
        try:
            crd = await self._uses_crd()
            created = await self._create(pod, crd)
            ip = await self._wait_running(name, created, spec)
            home = HOME if spec.thread_dir is not None else None
            handle = SandboxHandle(
                provider=self.name, key=key, journal_path=JOURNAL, stderr_path=STDERR, workdir=WORKDIR,
                data={"namespace": self.namespace, "pod": name, "sandbox_resource": crd,
                      "daemon": f"{ip}:{self.settings.port}", "pgid": None, **({"home": home} if home else {})})
            await self._fill(handle, spec)
            return handle
        except BaseException as exc:
            await asyncio.shield(self._delete_quietly(name, crd))
            if isinstance(exc, ApiError):
                raise SandboxBuildFailed("pod", redact(kp.refusal_detail(exc.status.code or 0, exc.status.reason or "",
                                                                          exc.status.message or ""), spec.secrets)) from exc
            if isinstance(exc, _TRANSPORT_ERRORS):
                raise SandboxBuildFailed("pod", redact(f"the Kubernetes API is unreachable: {exc!r}", spec.secrets)) from exc
            raise

    async def _create(self, pod: dict[str, Any], crd: bool) -> str:
        """Send the create; returns the resource version to watch the pod from."""
        if crd:
            created = await self._client.create(SandboxResource.from_dict(kp.sandbox_manifest(pod)),  # type: ignore[attr-defined]
                                                namespace=self.namespace)
        else:
            created = await self._client.create(Pod.from_dict(pod), namespace=self.namespace)
        return str(created.metadata.resourceVersion or "")  # type: ignore[union-attr]

    async def _wait_running(self, name: str, rv: str, spec: SandboxSpec) -> str:
        """Watch the pod until it runs and its daemon serves; its IP.

        Raises:
            SandboxBuildFailed: see :meth:`create`.
        """
        deadline = time.monotonic() + self.ready_timeout
        state = kp.PodState("waiting", reason="not created yet")
        try:
            async with asyncio.timeout(self.ready_timeout):
                state = await self._watch_pod(name, rv)
        except TimeoutError:
            raise SandboxBuildFailed("pod", f"pod {name} did not run within {self.ready_timeout:g}s: "
                                            f"{state.reason or 'no status yet'}") from None
        if state.kind == "failed":
            step = "image" if state.reason.split(":")[0] in kp.FATAL_WAITING - {"RunContainerError"} else "pod"
            raise SandboxBuildFailed(step, redact(f"pod {name}: {state.reason}", spec.secrets))
        if state.kind == "gone":
            raise SandboxBuildFailed("pod", f"pod {name} was deleted while it started")
        address = f"{state.ip}:{self.settings.port}"
        last = ""
        while True:
            last = await _health(address)
            if not last:
                return state.ip
            if time.monotonic() > deadline:
                raise SandboxBuildFailed("daemon", f"pod {name} runs but its daemon at {address} did not answer "
                                                   f"within {self.ready_timeout:g}s: {last}")
            await asyncio.sleep(0.2)

    async def _watch_pod(self, name: str, rv: str) -> kp.PodState:
        """Until the pod runs, fails or goes (the caller bounds the wait)."""
        try:
            current = await self._client.get(Pod, name, namespace=self.namespace)
            state = kp.pod_state(current.to_dict())
            rv = str(current.metadata.resourceVersion or rv)  # type: ignore[union-attr]
        except ApiError as exc:
            if exc.status.code != 404:
                raise
            state = kp.PodState("waiting", reason="the controller has not made the pod yet")
        if state.kind != "waiting":
            return state
        async for op, obj in self._client.watch(Pod, namespace=self.namespace, fields={"metadata.name": name},
                                                resource_version=rv or None):
            state = kp.pod_state(None if op == "DELETED" else obj.to_dict())
            if state.kind != "waiting":
                return state
        return kp.PodState("gone", reason="the watch ended")

    async def _fill(self, handle: SandboxHandle, spec: SandboxSpec) -> None:
        """The workspace (built on the host, copied in as a tree) and the setup commands."""
        steps = _ws.BuildSteps()
        async with _ws.build_budget(spec.build_timeout, steps):
            if spec.workspace is not None:
                tmp = await asyncio.to_thread(tempfile.mkdtemp, prefix="baton-clone-")
                try:
                    src = spec.workspace
                    if _ws.is_git_workspace(spec):
                        src = os.path.join(tmp, "repo")
                        await _ws.build_tree(spec, src)
                    elif not os.path.isdir(src):  # noqa: ASYNC240 -- one stat
                        raise SandboxBuildFailed("workspace", redact(f"not a directory: {src}", spec.secrets))
                    else:
                        await _ws.check_size(src, spec)
                    tar = await asyncio.to_thread(_tar_of, src)
                    await self._io.import_tree(handle, tar)
                finally:
                    await asyncio.shield(asyncio.to_thread(shutil.rmtree, tmp, True))
            if spec.setup:
                raise SandboxBuildFailed("setup[0]", "the kubernetes provider runs no setup commands: "
                                                     "bake them into the sandbox image")

    # --- the pod's life -------------------------------------------------------------------

    async def _delete(self, name: str, crd: bool) -> bool:
        """Delete the pod (its Sandbox first where there is one); ``True`` when one existed."""
        existed = False
        if crd:
            with contextlib.suppress(ApiError):
                await self._client.delete(SandboxResource, name, namespace=self.namespace)
                existed = True
        try:
            await self._client.delete(Pod, name, namespace=self.namespace)
            existed = True
        except ApiError as exc:
            if exc.status.code != 404:
                raise
        return existed

    async def _gone(self, name: str, timeout: float) -> None:  # noqa: ASYNC109 - a deadline for the confirmation
        """Until the API no longer has pod ``name``; ``TimeoutError`` after ``timeout`` s."""
        async with asyncio.timeout(timeout):
            while True:
                try:
                    pod = await self._client.get(Pod, name, namespace=self.namespace)
                except ApiError as exc:
                    if exc.status.code == 404:
                        return
                    raise
                rv = str(pod.metadata.resourceVersion or "")  # type: ignore[union-attr]
                async for op, _ in self._client.watch(Pod, namespace=self.namespace, fields={"metadata.name": name},
                                                      resource_version=rv, server_timeout=10):
                    if op == "DELETED":
                        return

    def _confirm_budget(self) -> float:
        return self.settings.grace + 30.0

    async def _delete_quietly(self, name: str, crd: bool) -> None:
        """Undo a create: delete and confirm, within the confirm budget, errors swallowed
        (the reaper's :meth:`destroy_leftovers` finds what this could not remove)."""
        with contextlib.suppress(ApiError, TimeoutError, *_TRANSPORT_ERRORS):
            await self._delete(name, crd)
            await self._gone(name, self._confirm_budget())

    async def exists(self, handle: SandboxHandle) -> bool:
        """Whether the pod exists, runs and is not being deleted."""
        try:
            pod = await self._client.get(Pod, str(handle.data["pod"]), namespace=self._ns(handle))
        except ApiError as exc:
            if exc.status.code == 404:
                return False
            raise SandboxReclaimFailed(handle.key, kp.refusal_detail(exc.status.code or 0, exc.status.reason or "",
                                                                     exc.status.message or "")) from exc
        return kp.pod_state(pod.to_dict()).kind == "running"

    async def destroy(self, handle: SandboxHandle) -> bool:
        """Delete the pod (or its Sandbox) and wait until the API no longer has it.

        Returns:
            ``True`` when something was deleted, ``False`` when it was already gone.

        Raises:
            SandboxReclaimFailed: the API refused or could not be reached, or the pod was
                still there after the grace period and a margin.
        """
        name, crd = str(handle.data["pod"]), bool(handle.data.get("sandbox_resource"))
        try:
            existed = await self._delete(name, crd)
            await self._gone(name, self._confirm_budget())
        except ApiError as exc:
            raise SandboxReclaimFailed(handle.key, kp.refusal_detail(exc.status.code or 0, exc.status.reason or "",
                                                                     exc.status.message or "")) from exc
        except TimeoutError:
            raise SandboxReclaimFailed(handle.key, f"pod {name} still exists {self._confirm_budget():g}s "
                                                   "after its deletion") from None
        except _TRANSPORT_ERRORS as exc:
            raise SandboxReclaimFailed(handle.key, f"the Kubernetes API is unreachable: {exc!r}") from exc
        return existed

    async def destroy_leftovers(self, run_id: str, keep_key: str | None) -> int:
        """Delete every pod (and Sandbox) of ``run_id`` but sandbox ``keep_key``'s; how many.

        Raises:
            SandboxReclaimFailed: the API refused or could not be reached.
        """
        found: list[tuple[str, bool]] = []
        try:
            selector = {kp.LABEL_RUN: kp.label_hash(run_id)}
            kinds: list[tuple[Any, bool]] = [(Pod, False)]
            if await self._uses_crd():
                kinds.insert(0, (SandboxResource, True))
            for res, crd in kinds:
                async for obj in self._client.list(res, namespace=self.namespace, labels=selector):
                    ann = obj.metadata.annotations or {}  # type: ignore[union-attr]
                    if ann.get(kp.ANN_RUN) != run_id or (keep_key is not None and ann.get(kp.ANN_KEY) == keep_key):
                        continue
                    name = str(obj.metadata.name)  # type: ignore[union-attr]
                    if (name, True) not in found:
                        found.append((name, crd))
            for name, crd in found:
                await self._delete(name, crd)
            for name, _ in found:
                await self._gone(name, self._confirm_budget())
        except ApiError as exc:
            raise SandboxReclaimFailed(run_id, kp.refusal_detail(exc.status.code or 0, exc.status.reason or "",
                                                                 exc.status.message or "")) from exc
        except TimeoutError:
            raise SandboxReclaimFailed(run_id, "a leftover pod still exists after its deletion") from None
        except _TRANSPORT_ERRORS as exc:
            raise SandboxReclaimFailed(run_id, f"the Kubernetes API is unreachable: {exc!r}") from exc
        return len(found)

    def _ns(self, handle: SandboxHandle) -> str:
        return str(handle.data.get("namespace") or self.namespace)

    # --- inside the sandbox: the daemon ---------------------------------------------------

    async def copy_in(self, handle: SandboxHandle, path: str, content: bytes, mode: int = 0o644) -> None:
        await self._io.copy_in(handle, path, content, mode)

    async def launch(self, handle: SandboxHandle, argv: Sequence[str], *, nonce: str, stdin: bytes | None = None,
                     env: Mapping[str, str] | None = None, secrets: Mapping[str, str] | None = None,
                     interactive: bool = False) -> Mapping[str, Any]:
        return await self._io.launch(handle, argv, nonce=nonce, stdin=stdin, env=env, secrets=secrets,
                                     interactive=interactive)

    async def send_input(self, handle: SandboxHandle, input_id: str, payload: bytes) -> None:
        await self._io.send_input(handle, input_id, payload)

    def follow(self, handle: SandboxHandle, path: str, offset: int) -> AsyncIterator[bytes]:
        return self._io.follow(handle, path, offset)

    async def read_file(self, handle: SandboxHandle, path: str, offset: int = 0, limit: int | None = None) -> bytes:
        return await self._io.read_file(handle, path, offset, limit)

    async def file_size(self, handle: SandboxHandle, path: str) -> int | None:
        return await self._io.file_size(handle, path)

    async def kill(self, handle: SandboxHandle, signal: int) -> bool:
        return await self._io.kill(handle, signal)

    async def processes_alive(self, handle: SandboxHandle) -> bool:
        return await self._io.processes_alive(handle)

    async def export_tree(self, handle: SandboxHandle) -> bytes:
        return await self._io.export_tree(handle)

    async def import_tree(self, handle: SandboxHandle, tar: bytes, *, replace: bool = False) -> None:
        await self._io.import_tree(handle, tar, replace=replace)


def settings_from_env(env: Mapping[str, str] | None = None) -> kp.PodSettings:
    """:class:`~sandbox_host.providers._k8s_pod.PodSettings` from ``BATON_K8S_*``."""
    return kp.PodSettings(
        image=config.get("BATON_K8S_IMAGE", env),
        port=int(config.get_float("BATON_K8S_DAEMON_PORT", env)),
        cpu=config.get("BATON_K8S_CPU", env),
        memory=config.get("BATON_K8S_MEMORY", env),
        disk=config.get("BATON_K8S_DISK", env),
        token_secret=config.get("BATON_K8S_TOKEN_SECRET", env),
        service_account=config.get("BATON_K8S_SERVICE_ACCOUNT", env),
        grace=int(config.get_float("BATON_K8S_GRACE", env)),
    )


async def _health(address: str) -> str:
    """``""`` when the daemon at ``address`` reports SERVING, else why not."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    import grpc
    from baton import internal_auth

    ch = internal_auth.channel(address)
    try:
        resp = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=2.0)
    except grpc.aio.AioRpcError as exc:
        return f"{exc.code().name}: {exc.details()}"
    finally:
        await ch.close()
    return "" if resp.status == health_pb2.HealthCheckResponse.SERVING else health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)


def _tar_of(src: str) -> bytes:
    """An uncompressed tar of directory ``src`` as members ``work/…`` (:meth:`Provider.import_tree`)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(src, arcname="work", recursive=True)
    return buf.getvalue()


__all__ = ["KubernetesProvider", "settings_from_env"]
