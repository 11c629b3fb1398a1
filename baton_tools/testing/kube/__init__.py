"""A stand-in Kubernetes cluster for tests: an API server and a kubelet in one process.

**Stand-ins**: nothing in baton's tests ran against a real cluster. :class:`StandinCluster`
serves the Kubernetes API paths the ``kubernetes`` provider uses (:mod:`.api` over
:mod:`.store`) on a loopback port with a bearer token, writes a kubeconfig for it, and runs
:class:`.kubelet.Kubelet`, which starts each pod's command as local processes with its own
loopback address. deploy/k8s/README.md says how to try the provider on a real cluster (kind).
"""
from __future__ import annotations

import asyncio
import pathlib
import secrets
import signal
from typing import Any

import uvicorn
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from baton_tools.testing.kube.api import SANDBOXES, make_app
from baton_tools.testing.kube.kubelet import Kubelet
from baton_tools.testing.kube.store import Refusal, Store
from baton_tools.testing.servers import free_port

__all__ = ["Refusal", "StandinCluster"]


class StandinCluster:
    """The stand-in API server and kubelet, served from this event loop.

    Args:
        root: a directory for pod directories and the kubeconfig.
        images: image → ``"run"`` / ``"hang"`` (see :class:`.kubelet.Kubelet`).
        agent_sandbox: serve the agent-sandbox ``Sandbox`` kind (the CRD is installed).
    """

    def __init__(self, root: pathlib.Path, images: dict[str, str], *, agent_sandbox: bool = False) -> None:
        self.root = root
        self.store = Store(extra_resources={SANDBOXES} if agent_sandbox else set())
        self.kubelet = Kubelet(self.store, root / "pods", dict(images))
        self.token = secrets.token_hex(16)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.kubeconfig = root / "kubeconfig"
        self._server: uvicorn.Server | None = None
        self._tasks: list[asyncio.Task[Any]] = []

    async def start(self) -> "StandinCluster":
        self.root.mkdir(parents=True, exist_ok=True)
        app = make_app(self.store, self.token, [Route("/_standin/kill/{ns}/{name}", self._kill, methods=["POST"])])
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off",
                                timeout_graceful_shutdown=2)  # open watches must not hold the close
        self._server = uvicorn.Server(config)
        self._tasks = [asyncio.create_task(self._server.serve(), name="standin-kube-api"),
                       asyncio.create_task(self.kubelet.run(), name="standin-kubelet")]
        async with asyncio.timeout(30):  # the API's port bound, or its server's failure
            while not self._server.started:
                if self._tasks[0].done():
                    self._tasks[0].result()
                await asyncio.sleep(0.01)
        self.kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters:\n- name: standin\n  cluster:\n    server: {self.url}\n"
            f"users:\n- name: standin\n  user:\n    token: {self.token}\n"
            "contexts:\n- name: standin\n  context:\n    cluster: standin\n    user: standin\n    namespace: default\n"
            "current-context: standin\n")
        return self

    async def close(self) -> None:
        """Stop the server and the kubelet; every pod's processes are killed."""
        if self._server is not None:
            self._server.should_exit = True
        for t in self._tasks[1:]:
            t.cancel()
        # The kubelet's own cancellation comes back as its outcome (a BaseException); a
        # cancellation of this close propagates.
        outcomes = await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.kubelet.close()
        # A server or kubelet that failed while the test ran is the test's failure too (the
        # pods it should have run would only have looked stuck).
        for t, outcome in zip(self._tasks, outcomes):
            if isinstance(outcome, Exception):
                raise RuntimeError(f"stand-in {t.get_name()} failed") from outcome

    async def __aenter__(self) -> "StandinCluster":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def put_secret(self, namespace: str, name: str, string_data: dict[str, str]) -> None:
        """Create a Secret (``stringData``) as ``kubectl create secret generic`` would."""
        await self.store.create("secrets", namespace, {"apiVersion": "v1", "kind": "Secret",
                                                       "metadata": {"name": name}, "stringData": string_data})

    def refuse(self, verb: str, resource: str, code: int, reason: str, message: str,
               times: int | None = None) -> None:
        """Make the API refuse ``verb`` on ``resource`` (see :class:`Refusal`)."""
        self.store.refusals.append(Refusal(verb, resource, code, reason, message, times))

    def pods(self, namespace: str = "default", labels: str | None = None) -> list[dict[str, Any]]:
        """The stored pods (as the API lists them)."""
        return self.store.list("pods", namespace, labels)

    async def _kill(self, req: Request) -> Response:
        match = req.query_params.get("match")
        sig = int(req.query_params.get("signal", signal.SIGKILL))
        try:
            n = self.kubelet.kill(req.path_params["ns"], req.path_params["name"], match, sig)
        except KeyError:
            return JSONResponse({"killed": 0}, status_code=404)
        return JSONResponse({"killed": n})
