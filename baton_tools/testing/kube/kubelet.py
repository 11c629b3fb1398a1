"""The stand-in kubelet (and the agent-sandbox controller's one job): pods become local processes.

A **stand-in**, not a kubelet: it runs each pod's one container command as a local process
group on this machine, so tests get the behaviour the ``kubernetes`` provider relies on without
a cluster. What it does, per pod the stand-in API stores:

- binds it to its node, gives it its own address from the loopback range (``127.64.0.0/10``, drawn at random: a
  daemon listening on ``$(POD_IP):port`` has its own address on one machine) and reports
  ``Pending``;
- looks the image up in :attr:`Kubelet.images`: ``"run"`` runs the pod's command, ``"hang"``
  runs a process that never serves (a daemon that never becomes ready), anything else stays
  ``Pending`` with the container waiting in ``ErrImagePull``;
- resolves the environment (``value``, ``fieldRef`` ``status.podIP`` / ``metadata.*``,
  ``secretKeyRef``), expands ``$(VAR)`` in command and args, gives each ``emptyDir`` volume a
  directory and each ``secret`` volume one holding its items as files (``defaultMode``), and
  maps their mount paths to them in args, env and ``workingDir`` (a process here has no mount
  namespace of its own; ``readOnly`` is not enforced);
- starts the command in a ``pids`` cgroup of its own when the machine allows one (so every
  descendant is found, ``setsid`` or not), else finds the pod's processes by an environment
  marker; reports ``Running`` with ``podIP`` and ``Ready`` (probes are not run);
- when the command ends, reports ``Succeeded``/``Failed`` with its exit code and kills what is
  left (``restartPolicy: Never``);
- on a graceful delete, SIGTERMs the pod's processes, SIGKILLs them after
  ``terminationGracePeriodSeconds``, removes its directories and confirms the deletion.

The controller stand-in creates, for each ``Sandbox`` of agent-sandbox, a pod of the same name
from ``spec.podTemplate`` owned by it (so deleting the Sandbox deletes the pod), as that
project's controller does.
"""
from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import os
import pathlib
import random
import re
import shutil
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from baton_tools.testing.kube.store import ApiStatusError, Obj, Store

NODE = "baton-standin-node"
MARKER = "BATON_STANDIN_POD"
_CGROUP_ROOT = pathlib.Path("/sys/fs/cgroup/pids")
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class PodRuntime:
    """One running pod: its address, directory, cgroup and main process."""

    namespace: str
    name: str
    uid: str
    ip: str
    dir: pathlib.Path
    cgroup: pathlib.Path | None
    proc: asyncio.subprocess.Process | None = None
    waiter: asyncio.Task[None] | None = None
    deleting: bool = False


def _free_loopback_ip(taken: set[str]) -> str:
    """A loopback address of ``127.64.0.0/10``, drawn at random, where the sandbox daemon's
    port is free now. Stand-in clusters of concurrent tests (several pytest workers) share
    this machine's loopback: addresses counted per kubelet gave two pods of two clusters
    the same one, and a host then reached the other cluster's daemon.

    Raises:
        RuntimeError: no free address in 100 draws.
    """
    from sandbox_host.daemon import DEFAULT_PORT

    rnd = random.SystemRandom()
    for _ in range(100):
        n = rnd.randrange(1 << 22)
        ip = f"127.{64 + (n >> 16)}.{(n >> 8) & 255}.{n & 255}"
        if n & 255 in (0, 255) or ip in taken:
            continue
        with socket.socket() as probe:
            try:
                probe.bind((ip, DEFAULT_PORT))
            except OSError:
                continue
        return ip
    raise RuntimeError("no free loopback address for a stand-in pod")


@dataclass
class Kubelet:
    """Runs the pods of ``store`` on this machine (see the module docstring).

    Args:
        store: the stand-in API's store.
        root: where pod directories go.
        images: image name → ``"run"`` or ``"hang"``; other images fail to pull.
    """

    store: Store
    root: pathlib.Path
    images: dict[str, str] = field(default_factory=dict)
    #: False: new pods are left unscheduled (Pending, no node: as when no node fits them).
    schedule: bool = True
    pods: dict[str, PodRuntime] = field(default_factory=dict)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def run(self) -> None:
        """Follow the store's events until cancelled (pods and Sandboxes)."""
        rv = 0
        while True:
            for e in list(self.store.events_after(rv)):
                rv = e.rv
                if e.resource == "pods":
                    self._on_pod(e.type, e.obj)
                elif e.resource == "sandboxes.agents.x-k8s.io" and e.type == "ADDED":
                    self._spawn(self._sandbox_pod(e.namespace, e.obj))
            changed = self.store.changed()
            if self.store.rv == rv:
                await changed.wait()

    def _spawn(self, coro: Any) -> None:
        t = asyncio.ensure_future(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    def _on_pod(self, type_: str, pod: Obj) -> None:
        meta = pod["metadata"]
        if type_ == "ADDED" and not pod.get("spec", {}).get("nodeName") and self.schedule:
            self._spawn(self._start(pod))
        elif meta.get("deletionTimestamp") and meta["uid"] in self.pods and not self.pods[meta["uid"]].deleting:
            self.pods[meta["uid"]].deleting = True
            self._spawn(self._terminate(self.pods[meta["uid"]], pod))

    async def close(self) -> None:
        """Kill every pod's processes and remove their directories (the end of a test)."""
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for rt in list(self.pods.values()):
            self._signal(rt, signal.SIGKILL)
            await self._reap(rt, 5.0)
            self._cleanup(rt)

    # --- the pod's life -------------------------------------------------------------------

    async def _start(self, pod: Obj) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        ns, name, uid = meta["namespace"], meta["name"], meta["uid"]
        ip = _free_loopback_ip({rt.ip for rt in self.pods.values()})
        rt = PodRuntime(ns, name, uid, ip, self.root / uid, self._make_cgroup(uid))
        self.pods[uid] = rt
        container = spec["containers"][0]
        cname, image = container["name"], container.get("image", "")
        try:
            await self.store.update("pods", ns, name, spec={"nodeName": NODE}, status={
                "phase": "Pending", "hostIP": "127.0.0.1", "podIP": ip, "podIPs": [{"ip": ip}],
                "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": _now()}]})
            behaviour = self.images.get(image)
            if behaviour is None:
                await self._waiting(rt, cname, image, "ErrImagePull",
                                    f'failed to pull and unpack image "{image}": not found')
                return
            try:
                argv, env, cwd = self._container(rt, pod, container)
            except LookupError as exc:
                await self._waiting(rt, cname, image, "CreateContainerConfigError", str(exc))
                return
            if behaviour == "hang":
                argv = ["sleep", "infinity"]
            rt.dir.mkdir(parents=True, exist_ok=True)
            log = open(rt.dir / f"{cname}.log", "ab")  # noqa: SIM115, ASYNC230 - the child holds it; a local file
            try:
                if rt.cgroup is not None:
                    argv = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(rt.cgroup), *argv]
                rt.proc = await asyncio.create_subprocess_exec(
                    *argv, env=env, cwd=cwd, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log,
                    start_new_session=True)
            except OSError as exc:
                await self._terminated(rt, cname, image, 128, f"StartError: {exc}")
                return
            finally:
                log.close()
            await self.store.update("pods", ns, name, status={
                "phase": "Running", "startTime": _now(),
                "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": cname, "image": image, "imageID": "", "ready": True, "restartCount": 0,
                                       "state": {"running": {"startedAt": _now()}}}]})
            rt.waiter = asyncio.ensure_future(self._wait_exit(rt, cname, image))
        except ApiStatusError:
            pass  # deleted meanwhile

    async def _waiting(self, rt: PodRuntime, cname: str, image: str, reason: str, message: str) -> None:
        await self.store.update("pods", rt.namespace, rt.name, status={"containerStatuses": [
            {"name": cname, "image": image, "imageID": "", "ready": False, "restartCount": 0,
             "state": {"waiting": {"reason": reason, "message": message}}}]})

    async def _terminated(self, rt: PodRuntime, cname: str, image: str, code: int, reason: str) -> None:
        with contextlib.suppress(ApiStatusError):
            await self.store.update("pods", rt.namespace, rt.name, status={
                "phase": "Succeeded" if code == 0 else "Failed",
                "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False"}],
                "containerStatuses": [{"name": cname, "image": image, "imageID": "", "ready": False, "restartCount": 0,
                                       "state": {"terminated": {"exitCode": code, "reason": reason,
                                                                "finishedAt": _now()}}}]})

    async def _wait_exit(self, rt: PodRuntime, cname: str, image: str) -> None:
        assert rt.proc is not None
        code = await rt.proc.wait()
        code = 128 - code if code < 0 else code  # killed by a signal: 128 + its number
        # The container is gone: so is every process in it.
        self._signal(rt, signal.SIGKILL)
        if not rt.deleting:
            await self._terminated(rt, cname, image, code, "Completed" if code == 0 else "Error")

    async def _terminate(self, rt: PodRuntime, pod: Obj) -> None:
        grace = float(pod["spec"].get("terminationGracePeriodSeconds", 30))
        self._signal(rt, signal.SIGTERM)
        if not await self._reap(rt, grace):
            self._signal(rt, signal.SIGKILL)
            await self._reap(rt, 30.0)
        if rt.waiter is not None:
            await asyncio.gather(rt.waiter, return_exceptions=True)
        self._cleanup(rt)
        with contextlib.suppress(ApiStatusError):
            await self.store.remove("pods", rt.namespace, rt.name)

    def _cleanup(self, rt: PodRuntime) -> None:
        self.pods.pop(rt.uid, None)
        shutil.rmtree(rt.dir, ignore_errors=True)
        if rt.cgroup is not None:
            with contextlib.suppress(OSError):
                rt.cgroup.rmdir()

    # --- the container --------------------------------------------------------------------

    def _container(self, rt: PodRuntime, pod: Obj, c: Obj) -> tuple[list[str], dict[str, str], str]:
        """``(argv, env, cwd)`` of the container, mount paths mapped to the pod's directories.

        Raises:
            LookupError: a ``secretKeyRef`` names a missing Secret or key.
        """
        mounts: list[tuple[str, str]] = []
        volumes = {v["name"]: v for v in pod["spec"].get("volumes") or []}
        for m in c.get("volumeMounts") or []:
            vol = volumes.get(m["name"], {})
            if "emptyDir" in vol or "secret" in vol:
                host = rt.dir / "volumes" / m["name"]
                host.mkdir(parents=True, exist_ok=True)
                if "secret" in vol:
                    self._project_secret(rt.namespace, vol["secret"], host)
                mounts.append((m["mountPath"].rstrip("/"), str(host)))
        mounts.sort(key=lambda m: -len(m[0]))

        def mapped(s: str) -> str:
            for mp, host in mounts:
                if s == mp or s.startswith(mp + "/"):
                    return host + s[len(mp):]
            return s

        env: dict[str, str] = {}
        for e in c.get("env") or []:
            if "value" in e:
                env[e["name"]] = _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), e["value"])
                continue
            src = e.get("valueFrom", {})
            if "fieldRef" in src:
                env[e["name"]] = self._field(rt, pod, src["fieldRef"]["fieldPath"])
            elif "secretKeyRef" in src:
                env[e["name"]] = self._secret(rt.namespace, src["secretKeyRef"])
        env = {k: mapped(v) for k, v in env.items()}

        def expand(s: str) -> str:
            return mapped(_VAR.sub(lambda m: env.get(m.group(1), m.group(0)), s))

        argv = [expand(a) for a in [*(c.get("command") or []), *(c.get("args") or [])]]
        if not argv:
            raise LookupError("the stand-in runs only containers with a command")
        full = {"PATH": f"{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin",
                "HOME": str(rt.dir), "LANG": "C.UTF-8", **env, MARKER: rt.uid}
        rt.dir.mkdir(parents=True, exist_ok=True)
        cwd = mapped(c["workingDir"]) if c.get("workingDir") else str(rt.dir)
        return argv, full, cwd

    @staticmethod
    def _field(rt: PodRuntime, pod: Obj, path: str) -> str:
        return {"status.podIP": rt.ip, "metadata.name": rt.name, "metadata.namespace": rt.namespace,
                "metadata.uid": rt.uid, "spec.nodeName": NODE}.get(path, "")

    def _secret_bytes(self, namespace: str, name: str, key: str) -> bytes:
        try:
            secret = self.store.get("secrets", namespace, name)
        except ApiStatusError:
            raise LookupError(f'secret "{name}" not found') from None
        if key in (secret.get("stringData") or {}):
            return str(secret["stringData"][key]).encode()
        if key in (secret.get("data") or {}):
            return base64.b64decode(secret["data"][key])
        raise LookupError(f"couldn't find key {key} in Secret {namespace}/{name}")

    def _secret(self, namespace: str, ref: Obj) -> str:
        return self._secret_bytes(namespace, ref["name"], ref["key"]).decode()

    def _project_secret(self, namespace: str, src: Obj, into: pathlib.Path) -> None:
        """A ``secret`` volume: each item (or every key) as a file of ``defaultMode``.

        Raises:
            LookupError: the Secret or an item's key is missing.
        """
        name = src["secretName"]
        items = src.get("items")
        if items is None:
            try:
                secret = self.store.get("secrets", namespace, name)
            except ApiStatusError:
                raise LookupError(f'secret "{name}" not found') from None
            items = [{"key": k, "path": k} for k in {**(secret.get("data") or {}), **(secret.get("stringData") or {})}]
        for item in items:
            path = into / item["path"]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(self._secret_bytes(namespace, name, item["key"]))
            path.chmod(int(item.get("mode", src.get("defaultMode", 0o644))) & 0o777 | 0o400)

    # --- processes ------------------------------------------------------------------------

    def _make_cgroup(self, uid: str) -> pathlib.Path | None:
        path = _CGROUP_ROOT / f"baton-standin-{uid}"
        try:
            path.mkdir()
        except OSError:
            return None
        return path

    def processes(self, rt: PodRuntime) -> set[int]:
        """Pids of the pod's live processes (its cgroup and its environment marker)."""
        pids: set[int] = set()
        if rt.cgroup is not None:
            with contextlib.suppress(OSError, ValueError):
                pids |= {int(p) for p in (rt.cgroup / "cgroup.procs").read_text().split()}
        marker = f"{MARKER}={rt.uid}".encode()
        for d in pathlib.Path("/proc").iterdir():
            if d.name.isdigit() and int(d.name) not in pids:
                with contextlib.suppress(OSError):
                    if marker in (d / "environ").read_bytes().split(b"\0"):
                        pids.add(int(d.name))
        return {p for p in pids if _alive(p)}

    def _signal(self, rt: PodRuntime, sig: int, match: str | None = None) -> int:
        n = 0
        for pid in self.processes(rt):
            if match is not None:
                try:
                    cmd = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                except OSError:
                    continue
                if not cmd.startswith(match):
                    continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
                n += 1
        return n

    async def _reap(self, rt: PodRuntime, timeout: float) -> bool:  # noqa: ASYNC109 - a grace period
        deadline = time.monotonic() + timeout
        while self.processes(rt):
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    def pod(self, namespace: str, name: str) -> PodRuntime:
        """The running pod (``KeyError`` when this kubelet runs none of that name)."""
        for rt in self.pods.values():
            if rt.namespace == namespace and rt.name == name:
                return rt
        raise KeyError(f"{namespace}/{name}")

    def kill(self, namespace: str, name: str, match: str | None = None, sig: int = signal.SIGKILL) -> int:
        """Signal the pod's processes (those whose command line starts with ``match``, if given);
        how many were signalled. Killing them all is a pod whose container died."""
        return self._signal(self.pod(namespace, name), sig, match)

    # --- the agent-sandbox controller -----------------------------------------------------

    async def _sandbox_pod(self, namespace: str, sandbox: Obj) -> None:
        meta = sandbox["metadata"]
        tmpl = sandbox.get("spec", {}).get("podTemplate", {})
        labels = dict((tmpl.get("metadata") or {}).get("labels") or {})
        labels["agents.x-k8s.io/sandbox-name-hash"] = hashlib.sha256(meta["name"].encode()).hexdigest()[:8]
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": meta["name"], "labels": labels,
            "annotations": dict((tmpl.get("metadata") or {}).get("annotations") or {}),
            "ownerReferences": [{"apiVersion": sandbox["apiVersion"], "kind": "Sandbox", "name": meta["name"],
                                 "uid": meta["uid"], "controller": True}]},
            "spec": tmpl.get("spec", {})}
        with contextlib.suppress(ApiStatusError):
            await self.store.create("pods", namespace, pod)


def _alive(pid: int) -> bool:
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
