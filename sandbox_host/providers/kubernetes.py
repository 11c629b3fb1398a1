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
(:class:`~sandbox_host.providers._daemon_client.DaemonClient`, with the sandbox's own token).

Creating waits, within ``BATON_K8S_READY_TIMEOUT``, for the pod to run and the daemon to
answer its health check; a refused create (RBAC, quota, admission), an image that cannot be
pulled, a pod that ends, or the deadline all raise :class:`SandboxBuildFailed` and leave
nothing behind (the pod is deleted and its deletion confirmed, its Secret deleted). Destroying
deletes the pod (or its Sandbox) and waits until the API no longer has it.

The daemon's credentials are in a Secret per sandbox (the pod's name), never in the pod's
spec: its token (``secretKeyRef``) and, with a sandbox CA (``BATON_SANDBOX_CA_*``,
:mod:`sandbox_host.providers._sandbox_tls`), the TLS certificate and key minted for it (a
mounted ``secret`` volume). The Secret is created first, then the pod, then the pod (or its
Sandbox) is made its owner, so that it goes with the pod whoever deletes that; a failed
create, :meth:`KubernetesProvider.destroy` and the reaper delete it too.

The client is lightkube (``AsyncClient`` over httpx; docs/deploy.md "Kubernetes" says why).
"""
from __future__ import annotations

import asyncio
import contextlib
import posixpath
import secrets as _secrets
import logging
import time
from typing import Any, AsyncIterator, Mapping, Sequence

import httpx2
from lightkube import AsyncClient, KubeConfig
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.core_v1 import Pod, Secret
from lightkube.types import PatchType

from baton import config, internal_auth
from baton.errors import SandboxBuildFailed, SandboxReclaimFailed
from sandbox_host.daemon import sandbox_token
from sandbox_host.providers import _k8s_pod as kp
from sandbox_host.providers import _sandbox_tls
from sandbox_host.providers._daemon_backed import DaemonBacked
from sandbox_host.providers import _workspace as _ws
from sandbox_host.providers._base import Chunk, Provider, SandboxHandle, SandboxSpec, check_input
from sandbox_host.providers._daemon_client import DaemonClient, DaemonUnreachable, SandboxGone
from sandbox_host.providers._redact import redact

JOURNAL = "baton/journal.ndjson"
STDERR = "baton/journal.err"
WORKDIR = "work"
HOME = "home"

SandboxResource = create_namespaced_resource(*kp.AGENT_SANDBOX[:2], "Sandbox", kp.AGENT_SANDBOX[2])
_TRANSPORT_ERRORS = (httpx2.TransportError, OSError)
log = logging.getLogger("baton.sandbox_host.kubernetes")


class KubernetesProvider(DaemonBacked, Provider):
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
        cluster_token: the cluster's internal token each sandbox's daemon token is derived
            from (:func:`sandbox_host.daemon.sandbox_token`; default ``BATON_INTERNAL_TOKEN``).
        patience: seconds a call waits for an unreachable daemon that may come back (a
            restart inside its pod) before it fails.
        sandbox_ca: the sandbox CA: each daemon serves TLS with a certificate minted here,
            and is checked against it (default: ``BATON_SANDBOX_CA_*``; ``None`` there =
            plaintext, :mod:`sandbox_host.providers._sandbox_tls`).
    """

    name = "kubernetes"
    killable_processes = True
    can_follow = True

    def __init__(self, client: AsyncClient | None = None, *, namespace: str | None = None,
                 settings: kp.PodSettings | None = None, ready_timeout: float | None = None,
                 agent_sandbox: str | None = None, cluster_token: str | None = None,
                 patience: float = 30.0, sandbox_ca: _sandbox_tls.SandboxCa | None | str = "env") -> None:
        self._ca = _sandbox_tls.from_env() if isinstance(sandbox_ca, str) else sandbox_ca
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
        self._cluster_token = internal_auth.token_from_env() if cluster_token is None else cluster_token
        self.patience = patience
        self._daemons: dict[tuple[str, str], DaemonClient] = {}
        self._crd: bool | None = None

    async def close(self) -> None:
        """Close the daemon clients, and the API client when this provider created it
        (idempotent)."""
        daemons, self._daemons = list(self._daemons.values()), {}
        for d in daemons:
            await d.close()
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
        daemon_token = sandbox_token(self._cluster_token, key)
        # The daemon's credentials go in a Secret of the pod's name, never in the pod's spec.
        server = await asyncio.to_thread(self._ca.mint, key) if self._ca is not None else None
        secret = name if daemon_token or server else ""
        pod = kp.pod_manifest(name, key=key, run_id=run_id, token=token, env=spec.env, settings=self.settings,
                              resources=spec.resources, secret=secret, with_token=bool(daemon_token),
                              with_tls=server is not None)
        crd = False
        try:
            crd = await self._uses_crd()
            if secret:
                body = kp.secret_manifest(secret, key=key, run_id=run_id, token=token, settings=self.settings,
                                          daemon_token=daemon_token, cert=server.cert if server else b"",
                                          cert_key=server.key if server else b"")
                body["metadata"]["namespace"] = self.namespace
                await self._client.create(Secret.from_dict(body))  # type: ignore[call-overload]
            created, owner = await self._create(pod, crd)
            if secret:
                await self._own(secret, owner)
            deadline = time.monotonic() + self.ready_timeout
            ip = await self._wait_running(name, created, spec)
            home = HOME if spec.thread_dir is not None else None
            handle = SandboxHandle(
                provider=self.name, key=key, journal_path=JOURNAL, stderr_path=STDERR, workdir=WORKDIR,
                data={"namespace": self.namespace, "pod": name, "sandbox_resource": crd,
                      "daemon": f"{ip}:{self.settings.port}", "pgid": None, **({"home": home} if home else {}),
                      **({"secret": secret} if secret else {}), **({"daemon_tls": True} if server else {})})
            try:
                await self._daemon(handle).wait_serving(max(0.1, deadline - time.monotonic()))
            except (DaemonUnreachable, SandboxGone) as exc:
                raise SandboxBuildFailed("daemon", f"pod {name} runs but its daemon at {handle.data['daemon']} did "
                                                   f"not answer within {self.ready_timeout:g}s: {exc}") from None
            await self._fill(handle, spec)
            return handle
        except BaseException as exc:
            await asyncio.shield(self._delete_quietly(name, crd, secret))
            if isinstance(exc, ApiError):
                raise SandboxBuildFailed("pod", redact(kp.refusal_detail(exc.status.code or 0, exc.status.reason or "",
                                                                          exc.status.message or ""), spec.secrets)) from exc
            if isinstance(exc, _TRANSPORT_ERRORS):
                raise SandboxBuildFailed("pod", redact(f"the Kubernetes API is unreachable: {exc!r}", spec.secrets)) from exc
            raise

    async def _create(self, pod: dict[str, Any], crd: bool) -> tuple[str, dict[str, Any]]:
        """Send the create; returns the resource version to watch the pod from and the
        owner reference of what was created (the pod, or its Sandbox)."""
        pod = {**pod, "metadata": {**pod["metadata"], "namespace": self.namespace}}
        obj: Any = SandboxResource.from_dict(kp.sandbox_manifest(pod)) if crd else Pod.from_dict(pod)
        created = await self._client.create(obj)
        kind, api = ("Sandbox", f"{kp.AGENT_SANDBOX[0]}/{kp.AGENT_SANDBOX[1]}") if crd else ("Pod", "v1")
        owner = kp.owner_reference({"apiVersion": api, "kind": kind, "metadata": {
            "name": pod["metadata"]["name"], "uid": created.metadata.uid}})
        return str(created.metadata.resourceVersion or ""), owner

    async def _own(self, secret: str, owner: dict[str, Any]) -> None:
        """Make the pod (or Sandbox) own its Secret, so that the garbage collector deletes it
        with the pod whoever deletes that. A refusal is logged, not fatal: :meth:`destroy`
        and the reaper delete the Secret themselves."""
        try:
            await self._client.patch(Secret, secret, {"metadata": {"ownerReferences": [owner]}},
                                     namespace=self.namespace, patch_type=PatchType.MERGE)
        except ApiError as exc:
            log.warning("secret %s: its owner reference was refused (%s %s); it is deleted with its sandbox "
                        "by baton only", secret, exc.status.code, exc.status.reason)

    async def _wait_running(self, name: str, rv: str, spec: SandboxSpec) -> str:
        """Watch the pod until it runs; its IP.

        Raises:
            SandboxBuildFailed: see :meth:`create`.
        """
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
        return state.ip

    async def _watch_pod(self, name: str, rv: str) -> kp.PodState:
        """Until the pod runs, fails or goes (the caller bounds the wait). Each watch asks the
        server to end within 5 s (under the client's read timeout), then the pod is read again."""
        while True:
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
                                                    resource_version=rv or None, server_timeout=5):
                state = kp.pod_state(None if op == "DELETED" else obj.to_dict())
                if state.kind != "waiting":
                    return state

    async def _fill(self, handle: SandboxHandle, spec: SandboxSpec) -> None:
        """The working directory (the workspace built on the host, copied in as one tree),
        the agent's home for a thread, then the setup commands (both through the daemon)."""
        steps = _ws.BuildSteps()
        home = str(handle.data.get("home") or "")
        async with _ws.build_budget(spec.build_timeout, steps):
            await _ws.fill(self._daemon(handle), spec, workdir=handle.workdir, home=home)
            await _ws.run_setup(self._daemon(handle), spec, steps, workdir=handle.workdir, home=home)

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
        """Until the API no longer has pod ``name``; ``TimeoutError`` after ``timeout`` s.

        Polled (a few reads a second) rather than watched: a deletion takes the grace period
        at most, and a watch's silence would meet the client's read timeout."""
        async with asyncio.timeout(timeout):
            while True:
                try:
                    await self._client.get(Pod, name, namespace=self.namespace)
                except ApiError as exc:
                    if exc.status.code == 404:
                        return
                    raise
                await asyncio.sleep(0.2)

    def _confirm_budget(self) -> float:
        return self.settings.grace + 30.0

    async def _delete_quietly(self, name: str, crd: bool, secret: str = "") -> None:
        """Undo a create: delete and confirm, within the confirm budget, and delete the
        Secret, errors swallowed (the reaper's :meth:`destroy_leftovers` finds what this
        could not remove)."""
        with contextlib.suppress(ApiError, TimeoutError, *_TRANSPORT_ERRORS):
            await self._delete(name, crd)
            await self._gone(name, self._confirm_budget())
        if secret:
            with contextlib.suppress(ApiError, *_TRANSPORT_ERRORS):
                await self._delete_secret(secret)

    async def _delete_secret(self, name: str) -> None:
        """Delete Secret ``name`` (gone already is fine)."""
        try:
            await self._client.delete(Secret, name, namespace=self.namespace)
        except ApiError as exc:
            if exc.status.code != 404:
                raise

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
            if handle.data.get("secret"):  # its owner took it already, unless the patch was refused
                await self._delete_secret(str(handle.data["secret"]))
            # Closed once the pod is gone: a follow cut off by the deletion ends as "sandbox
            # gone", not as a closed client.
            await self._forget(handle)
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
            selector: dict[str, Any] = {kp.LABEL_RUN: kp.label_hash(run_id)}
            kinds: list[tuple[Any, bool]] = [(Pod, False)]
            if await self._uses_crd():
                kinds.insert(0, (SandboxResource, True))
            for res, crd in kinds:
                async for obj in self._client.list(res, namespace=self.namespace, labels=selector):
                    ann = obj.metadata.annotations or {}
                    if ann.get(kp.ANN_RUN) != run_id or (keep_key is not None and ann.get(kp.ANN_KEY) == keep_key):
                        continue
                    name = str(obj.metadata.name)
                    if (name, True) not in found:
                        found.append((name, crd))
            for name, crd in found:
                await self._delete(name, crd)
            for name, _ in found:
                await self._gone(name, self._confirm_budget())
            # Secrets whose pod is gone or never came (a host that died between the two creates).
            async for sec in self._client.list(Secret, namespace=self.namespace, labels=selector):
                meta = sec.metadata
                ann = (meta.annotations if meta else None) or {}
                if meta and ann.get(kp.ANN_RUN) == run_id and (keep_key is None or ann.get(kp.ANN_KEY) != keep_key):
                    await self._delete_secret(str(meta.name))
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

    def _daemon(self, handle: SandboxHandle) -> DaemonClient:
        """The daemon client of the handle's pod (one per pod, kept until it is destroyed).

        The daemon keeps its pod's address across its own restarts; ``gone`` is the pod not
        running any more (deleted, or its container ended: the agent went with it).
        """
        ident = (self._ns(handle), str(handle.data["pod"]))
        client = self._daemons.get(ident)
        if client is None:
            address = str(handle.data["daemon"])

            async def resolve() -> str:
                return address

            async def gone() -> bool:
                try:
                    return not await self.exists(handle)
                except SandboxReclaimFailed:
                    return False  # the API is unreachable: say nothing about the pod

            client = DaemonClient(resolve, token=sandbox_token(self._cluster_token, handle.key),
                                  tls=_sandbox_tls.tls_for(handle, self._ca), gone=gone, patience=self.patience)
            self._daemons[ident] = client
        return client

    async def _forget(self, handle: SandboxHandle) -> None:
        client = self._daemons.pop((self._ns(handle), str(handle.data["pod"])), None)
        if client is not None:
            await client.close()

    async def copy_in(self, handle: SandboxHandle, path: str, content: bytes, mode: int = 0o644) -> None:
        """Write ``content`` to ``path`` (relative: to the working directory).

        Raises:
            SandboxReclaimFailed: the pod is gone.
        """
        try:
            await self._daemon(handle).copy_in(posixpath.join(handle.workdir, path), content, mode)
        except SandboxGone as exc:
            raise SandboxReclaimFailed(handle.key, str(exc)) from exc

    async def launch(self, handle: SandboxHandle, argv: Sequence[str], *, nonce: str, stdin: bytes | None = None,
                     env: Mapping[str, str] | None = None, secrets: Mapping[str, str] | None = None,
                     interactive: bool = False) -> Mapping[str, Any]:
        """Start ``argv`` under the wrapper through the daemon; ``{"pgid"}`` (and ``"inbox"``).

        Raises:
            SandboxBuildFailed: ``launch`` (the daemon refused, failed or stayed unreachable).
        """
        pgid, inbox = await self._daemon(handle).launch(
            argv, nonce=nonce, journal_path=handle.journal_path, stderr_path=handle.stderr_path, stdin=stdin,
            env=env, secrets=secrets, interactive=interactive, home=str(handle.data.get("home") or ""),
            workdir=handle.workdir)
        return {"pgid": pgid, "inbox": inbox} if inbox else {"pgid": pgid}

    async def send_input(self, handle: SandboxHandle, input_id: str, payload: bytes) -> None:
        """Append the input's line to the inbox (``ValueError``: see ``check_input``;
        ``PermissionError``: the inbox takes no line, a link or not a regular file;
        ``SandboxReclaimFailed``: the pod is gone)."""
        line = check_input(handle, input_id, payload)
        try:
            await self._daemon(handle).send_input(handle.inbox_path, line)
        except SandboxGone as exc:
            raise SandboxReclaimFailed(handle.key, str(exc)) from exc

    def follow(self, handle: SandboxHandle, path: str, offset: int) -> AsyncIterator[Chunk]:
        """The file's bytes from ``offset`` as written, across restarts of the daemon.

        Raises:
            FileNotFoundError: the file was deleted, or the pod is gone (``SandboxGone``).
            DaemonUnreachable: the daemon stayed unreachable for ``patience`` seconds.
        """
        return self._daemon(handle).follow(path, offset)

    async def read_file(self, handle: SandboxHandle, path: str, offset: int = 0, limit: int | None = None) -> bytes:
        """Bytes of a file from ``offset``; ``FileNotFoundError`` when it or the pod is gone."""
        return await self._daemon(handle).read_file(path, offset, limit)

    async def export_tree(self, handle: SandboxHandle) -> bytes:
        """Tar of ``work/`` and ``home/``; ``SandboxReclaimFailed`` when the pod is gone."""
        try:
            return await self._daemon(handle).export_tree(handle.workdir, str(handle.data.get("home") or ""))
        except SandboxGone as exc:
            raise SandboxReclaimFailed(handle.key, str(exc)) from exc

    async def import_tree(self, handle: SandboxHandle, tar: bytes, *, replace: bool = False) -> None:
        """Extract an exported tar (``SandboxBuildFailed("import")`` for a bad member)."""
        try:
            await self._daemon(handle).import_tree(tar, workdir=handle.workdir,
                                                   home=str(handle.data.get("home") or ""), replace=replace)
        except SandboxGone as exc:
            raise SandboxReclaimFailed(handle.key, str(exc)) from exc


def settings_from_env(env: Mapping[str, str] | None = None) -> kp.PodSettings:
    """:class:`~sandbox_host.providers._k8s_pod.PodSettings` from ``BATON_K8S_*``."""
    return kp.PodSettings(
        image=config.get("BATON_K8S_IMAGE", env),
        port=int(config.get_float("BATON_K8S_DAEMON_PORT", env)),
        cpu=config.get("BATON_K8S_CPU", env),
        memory=config.get("BATON_K8S_MEMORY", env),
        disk=config.get("BATON_K8S_DISK", env),
        service_account=config.get("BATON_K8S_SERVICE_ACCOUNT", env),
        grace=int(config.get_float("BATON_K8S_GRACE", env)),
    )


__all__ = ["KubernetesProvider", "settings_from_env"]
