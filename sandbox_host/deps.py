"""What every run driver of one host shares: settings and clients (docs/design.md §5.5, §9).

:class:`HostSettings` are the driver's ``BATON_*`` settings; :class:`HostDeps` bundles the
host's identity, clients and settings, built once by the composition root
(``sandbox_host.__main__``) and passed to the :class:`~sandbox_host.manager.RunManager`.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping

from baton import config, credentials
from baton.errors import InvalidArgument, ProviderUnreachable
from baton.v1 import coordinator_pb2, runs_pb2
from baton.coordinator_client import CoordinatorClient, Session
from baton.log import DeliveryLog, TranscriptStore
from sandbox_host import run_workspace, tenant_secrets
from sandbox_host.metrics import HostMetrics
from sandbox_host.providers import Provider, Sandbox
from sandbox_host.run_workspace import WorkspaceSettings

if TYPE_CHECKING:
    from baton.workspaces import WorkspaceStore

log = logging.getLogger("baton.sandbox_host")
#: Seconds before a provider that could not be built is tried again.
PROVIDER_RETRY = 10.0

#: Environment variables a host hands to the agents that need them (``required_secrets`` of
#: the agent kinds in :mod:`sandbox_host.agents`).
AGENT_SECRET_NAMES = credentials.AGENT_SECRET_NAMES


@dataclass(frozen=True)
class HostSettings:
    """Driver settings (docs/design.md §9), from ``BATON_*`` variables by :meth:`from_env`.

    Attributes:
        provider: default sandbox provider name.
        attach_wait: seconds an attach waits for the journal / first byte.
        cancel_grace: seconds between SIGTERM and SIGKILL on cancel.
        journal_poll: seconds between liveness checks while a journal is idle.
        snapshot_interval: seconds between periodic transcript snapshots (0 = none).
        final_write_timeout: seconds final writes may take after the driver is cancelled.
        capacity: runs this host drives at most (``BATON_HOST_CAPACITY``; 0 = no limit).
        store_retry: seconds a driver retries a sandbox-registry write while the store is
            unavailable (bounded by the session: a lost session ends the retries).
        finish_budget: seconds a driver retries its final writes (close, status, sandbox
            removal) while the store or the log is unavailable before it lets the run go
            (``BATON_FINISH_BUDGET``; bounded by the session as well).
        quiet_time: seconds an attach waits after its fence before its first append. 0 here;
            only ``bench/takeover.py`` sets it (``BATON_TAKEOVER_QUIET_TIME``) to emulate the
            reference design's 5 s quiet window as a baseline — our fence needs no window.
        replay_yield_lines: journal lines a driver translates and aligns before it lets the
            event loop run other tasks (the host's keep-alive among them). 0 = never: only
            ``bench/takeover.py`` sets it (``BATON_BENCH_COLD_TAKEOVER=1``, together with
            ``warm_up = False``) to measure a host without them.
        approval_timeout: seconds a tool approval waits for its answer before it counts as
            denied (``BATON_APPROVAL_TIMEOUT``; an agent's ``approvalTimeout`` option overrides it).
        warm_up: whether the composition root imports the takeover path's modules before
            the host opens its session (see :func:`warm_up`); off only with
            ``BATON_BENCH_COLD_TAKEOVER=1``.
    """

    provider: str = "local"
    attach_wait: float = 10.0
    cancel_grace: float = 5.0
    journal_poll: float = 0.25
    snapshot_interval: float = 2.0
    final_write_timeout: float = 10.0
    quiet_time: float = 0.0
    replay_yield_lines: int = 32
    warm_up: bool = True
    capacity: int = 64
    store_retry: float = 5.0
    finish_budget: float = 30.0
    approval_timeout: float = 600.0
    #: Agent credentials from the host's own environment (``AGENT_SECRET_NAMES``); passed to
    #: the agent as env only, never logged, journaled or stored.
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)
    #: Per-tenant agent credentials (``BATON_TENANT_SECRETS_DIR``, :mod:`sandbox_host.tenant_secrets`):
    #: tenant → variable → value; a tenant's runs use its own over :attr:`secrets`.
    tenant_secrets: Mapping[str, Mapping[str, str]] = field(default_factory=dict, repr=False)
    #: Workspace allow-list, build limits and git credentials (:mod:`sandbox_host.run_workspace`).
    workspace: WorkspaceSettings = field(default_factory=WorkspaceSettings)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "HostSettings":
        cold = (os.environ if env is None else env).get("BATON_BENCH_COLD_TAKEOVER", "") == "1"
        return cls(
            provider=config.get("BATON_PROVIDER", env),
            attach_wait=config.get_float("BATON_ATTACH_WAIT", env),
            cancel_grace=config.get_float("BATON_CANCEL_GRACE", env),
            journal_poll=config.get_float("BATON_JOURNAL_POLL", env),
            quiet_time=float((os.environ if env is None else env).get("BATON_TAKEOVER_QUIET_TIME", "0") or 0),
            capacity=int(config.get_float("BATON_HOST_CAPACITY", env)),
            replay_yield_lines=0 if cold else 32,
            warm_up=not cold,
            approval_timeout=config.get_float("BATON_APPROVAL_TIMEOUT", env),
            finish_budget=float((os.environ if env is None else env).get("BATON_FINISH_BUDGET", "30") or 30),
            secrets={k: v for k, v in (os.environ if env is None else env).items()
                     if k in AGENT_SECRET_NAMES and v},
            tenant_secrets=tenant_secrets.load(config.get("BATON_TENANT_SECRETS_DIR", env)),
            workspace=WorkspaceSettings.from_env(env),
        )


def warm_up() -> None:
    """Import what a takeover runs, once, before the host holds a session.

    The agents, translators, journal and fingerprint modules are imported where they are
    used, so a process that only starts (or a tool) does not pay for them. A host must
    not pay for them on its first takeover either: importing them (pydantic models,
    dataclasses, regexes) runs on the event loop and took 2-7 s on a loaded 2-core
    machine, long enough for the host's own session to expire while it took over the runs
    of a dead peer. Blocking here, before :meth:`CoordinatorClient.open_session`,
    delays only the host's readiness.
    """
    import concurrent.futures
    import baton.fingerprint  # noqa: F401  (imported for its side effect: loaded once)
    import baton.transcript  # noqa: F401
    import sandbox_host.agent_resume  # noqa: F401
    import sandbox_host.agents  # noqa: F401
    import sandbox_host.align  # noqa: F401
    import sandbox_host.journal  # noqa: F401
    import sandbox_host.translate  # noqa: F401
    from sandbox_host.providers._inotify import libc

    libc()  # finding it runs ``ldconfig -p``: not on the loop at the first follow
    concurrent.futures.ThreadPoolExecutor  # noqa: B018  (a lazy import: the loop's first to_thread ran it)


class HostDeps:
    """The clients, identity and settings every driver of one host shares.

    Args:
        host_id: this host's id.
        cc: a connected ``CoordinatorClient``.
        session: this host's coordinator session (``.id``, ``.lost``).
        log: a ``DeliveryLog``.
        transcripts: a ``TranscriptStore``.
        providers: provider name → provider instance.
        settings: driver settings.
        workspaces: the thread workspace store (``None``: runs keep no workspace or agent
            session across a thread's turns).
        provider_factory: builds a provider this host was not started with, by name, with
            that provider's own settings (default :func:`sandbox_host.providers.provider_for`:
            ``BATON_K8S_*``, ``DOCKER_HOST``…); blocking, called in a thread.
    """

    def __init__(self, *, host_id: str, cc: CoordinatorClient, session: Session, log: DeliveryLog,
                 transcripts: TranscriptStore, providers: Mapping[str, Provider], settings: HostSettings,
                 workspaces: "WorkspaceStore | None" = None, metrics: HostMetrics | None = None,
                 provider_factory: Callable[[str], Provider] | None = None) -> None:
        self.host_id = host_id
        #: The host's Prometheus metrics (sandbox_host/metrics.py).
        self.metrics = metrics if metrics is not None else HostMetrics()
        self.cc = cc
        self.session = session
        self.log = log
        self.transcripts = transcripts
        self.providers = dict(providers)
        self.settings = settings
        self.workspaces = workspaces
        self._provider_factory = provider_factory
        self._building = asyncio.Lock()
        #: Providers that could not be built: name → (monotonic time to try again, why).
        self._unbuildable: dict[str, tuple[float, str]] = {}

    # --- agents and translators ---------------------------------------------------------

    @staticmethod
    def agent_options(record: runs_pb2.RunRecord) -> dict[str, Any]:
        raw = record.agent.options_json or "{}"
        try:
            opts = json.loads(raw)
        except ValueError:
            raise InvalidArgument("agent.options", "must be a JSON object") from None
        if not isinstance(opts, dict):
            raise InvalidArgument("agent.options", "must be a JSON object")
        return opts

    def translator(self, record: runs_pb2.RunRecord, run_id: str) -> Any:
        """A fresh translator for the run's journal format (same bytes → same chunks)."""
        from sandbox_host.agents import journal_format_for
        from sandbox_host.translate import translator_for

        fmt = journal_format_for(record.agent.kind or config.get("BATON_DEFAULT_AGENT"), self.agent_options(record))
        return translator_for(fmt, run_id=run_id, thread_id=record.thread_id)

    async def provider_named(self, name: str, run_id: str = "") -> Provider:
        """This host's provider ``name``: one it was started with, else one built now with
        that provider's own settings and kept (a run whose sandbox another host built on
        another provider is taken over with that provider, not this host's own).

        Raises:
            ProviderUnreachable: it cannot be built here (no kubeconfig, no engine…), or
                could not :data:`PROVIDER_RETRY` seconds ago; the detail is the provider's
                error, cut to 300 characters.
        """
        found = self.providers.get(name)
        if found is not None:
            return found
        async with self._building:
            found = self.providers.get(name)
            if found is None:
                from sandbox_host.providers import provider_for

                # A build that failed is not tried again for a while: one may take the SDK's
                # whole timeout (an engine that does not answer), and every ask would wait.
                again, why = self._unbuildable.get(name, (0.0, ""))
                if time.monotonic() < again:
                    raise ProviderUnreachable(run_id, name, why)
                try:
                    found = await asyncio.to_thread(self._provider_factory or provider_for, name)
                except Exception as exc:  # noqa: BLE001 -- any failure to build it means "cannot reach it"
                    why = f"{type(exc).__name__}: {exc}"[:300]
                    self._unbuildable[name] = (time.monotonic() + PROVIDER_RETRY, why)
                    raise ProviderUnreachable(run_id, name, why) from exc
                log.info("sandbox provider %r built for the runs whose sandbox is on it", name)
                self.providers[name] = found
        return found

    async def provider_for_run(self, record: runs_pb2.RunRecord, name: str | None = None) -> Provider:
        """The provider a run's new sandbox is built with: ``name`` (the provider of the
        run's earlier sandbox, so that a successor that builds anew keeps the run's
        provider), else the one the record names (``RunRecord.sandbox_provider``: the run's
        sandbox may exist unregistered, its host having died between creating and
        registering it), else this host's own (``BATON_PROVIDER``; a record from before
        the field).

        Raises:
            ProviderUnreachable: see :meth:`provider_named`.
        """
        return await self.provider_named(self.run_provider(record, name), record.run_id)

    def run_provider(self, record: runs_pb2.RunRecord, name: str | None = None) -> str:
        """The name of the provider a run's sandbox is on or will be built on: ``name``,
        else ``record.sandbox_provider``, else this host's ``BATON_PROVIDER``."""
        return name or record.sandbox_provider or self.settings.provider

    def sandbox_spec(self, record: runs_pb2.RunRecord, provider: str | None = None) -> Any:
        from sandbox_host.providers import SandboxSpec

        # The run id labels every sandbox of the run (also `<run_id>#<epoch>` ones a successor
        # builds), so leftovers of a host that died mid-build can be found and removed.
        return SandboxSpec(provider=provider or self.settings.provider, env={"BATON_RUN_ID": record.run_id},
                           **run_workspace.spec_fields(record, self.settings.workspace))

    def check_workspace(self, req: Any) -> str:
        """The ``StartRunRequest``'s workspace checked for its tenant, as the record keeps it.

        Raises:
            InvalidArgument: see :func:`sandbox_host.run_workspace.check_start`.
        """
        return run_workspace.check_start(req.workspace_json, req.tenant, self.settings.workspace)

    def agent_secrets(self, launch: Any, tenant: str = "") -> dict[str, str]:
        """The secrets that ``launch`` (an ``AgentLaunch``) asks for, for a run of ``tenant``:
        the tenant's own (``BATON_TENANT_SECRETS_DIR``) where it has them, else the host's
        (:func:`sandbox_host.tenant_secrets.choose`).

        Raises:
            InvalidArgument: (field ``agent.kind``) naming the secret variables neither the
                tenant nor the host has; never their values.
        """
        own = self.settings.tenant_secrets.get(tenant, {}) if tenant else {}
        chosen = tenant_secrets.choose(launch.required_secrets, self.settings.secrets, own)
        missing = launch.missing_secrets(chosen)
        if missing:
            raise InvalidArgument("agent.kind", f"agent {launch.kind!r} needs a credential this host does not have: "
                                  f"set {' and '.join(n.replace('|', ' or ') for n in missing)} in the host's environment"
                                  + (f" or for tenant {tenant!r} in {tenant_secrets.ENV}" if tenant else ""))
        return chosen

    async def launch_spec(self, record: runs_pb2.RunRecord, provider: Any, handle: Any,
                          messages: list[dict[str, Any]]) -> tuple[list[str], bytes | None, dict[str, str], dict[str, str], bool]:
        """Prepare the agent (files copied in) and return ``(argv, stdin, env, secrets,
        interactive)`` (``interactive``: it reads inputs from an inbox while it runs)."""
        from sandbox_host.agents import prepare_agent, prompt_from_messages

        # The record's options were resolved by the first preparation (StartRun): this one
        # reads nothing but the files it copies in, once, in a worker thread.
        from sandbox_host.thread_session import TurnStart

        turn = TurnStart.from_json(record.turn_json)
        launch = prepare_agent(record.agent.kind or config.get("BATON_DEFAULT_AGENT"), self.agent_options(record),
                               prompt=prompt_from_messages(messages),
                               resume=turn.resume if turn is not None else None,
                               fork=turn.fork if turn is not None else False)
        return await self._copy_in(launch, provider, handle, record)

    async def relaunch_spec(self, record: runs_pb2.RunRecord, provider: Any, handle: Any,
                            session_id: str) -> tuple[list[str], bytes | None, dict[str, str], dict[str, str], bool]:
        """Like :meth:`launch_spec`, for the agent process relaunched in the same run: it
        resumes ``session_id`` (the one its journal announced) and is told to go on
        (:data:`sandbox_host.agents.RESUME_PROMPT`); the workspace is left as it is.

        Raises:
            InvalidArgument: a malformed ``session_id``, or a credential the host lacks.
        """
        from sandbox_host.agents import RESUME_PROMPT, prepare_agent

        launch = prepare_agent(record.agent.kind or config.get("BATON_DEFAULT_AGENT"), self.agent_options(record),
                               prompt=RESUME_PROMPT, resume=session_id, fork=False)
        return await self._copy_in(launch, provider, handle, record)

    async def _copy_in(self, launch: Any, provider: Any, handle: Any, record: runs_pb2.RunRecord
                       ) -> tuple[list[str], bytes | None, dict[str, str], dict[str, str], bool]:
        from sandbox_host.agents import load_files
        from sandbox_host.run_trace import agent_env

        secrets = self.agent_secrets(launch, record.tenant)
        for path, (content, mode) in (await load_files(launch)).items():
            await provider.copy_in(handle, path, content, mode)
        # The run's trace context (TRACEPARENT): an agent that traces joins the run's trace.
        return list(launch.argv), launch.stdin, {**launch.env, **agent_env(record)}, secrets, launch.interactive

    # --- sandboxes registry -------------------------------------------------------------

    async def register_sandbox(self, record: runs_pb2.RunRecord, sbx: Sandbox, *, launched: bool, epoch: int) -> None:
        h = sbx.handle
        handle_json = json.dumps({
            "provider": h.provider, "key": h.key, "journal_path": h.journal_path, "stderr_path": h.stderr_path,
            "workdir": h.workdir, "data": dict(h.data), "nonce": sbx.nonce,
        }, sort_keys=True)
        await self.cc.put_sandbox(coordinator_pb2.SandboxInstance(
            sandbox_key=h.key, provider=h.provider, handle_json=handle_json, run_id=record.run_id,
            journal_path=h.journal_path, created_at=time.time()))

    async def find_sandbox(self, key: str) -> Sandbox | None:
        """The registered sandbox ``key`` with its provider (``None``: not registered).

        Raises:
            ProviderUnreachable: its provider cannot be built on this host.
            StoreUnavailable: the registry did not answer.
        """
        return await self.sandbox_from(await self.cc.get_sandbox(key))

    async def sandbox_from(self, inst: coordinator_pb2.SandboxInstance | None) -> Sandbox | None:
        """A registry entry as a driver holds it, with its provider (``None``: not registered).

        Raises:
            ProviderUnreachable: its provider cannot be built on this host.
        """
        from sandbox_host.providers import SandboxHandle

        if inst is None or not inst.handle_json:
            return None
        raw = json.loads(inst.handle_json)
        provider = await self.provider_named(raw.get("provider") or inst.provider, inst.run_id)
        handle = SandboxHandle(provider=raw["provider"], key=raw["key"], journal_path=raw["journal_path"],
                               stderr_path=raw["stderr_path"], workdir=raw["workdir"], data=raw.get("data") or {})
        return Sandbox(provider, handle, raw.get("nonce", ""))

    # --- log bodies -----------------------------------------------------------------------

    async def stored_before_fence(self, run_id: str, fenced_over: int) -> tuple[list[Any], dict[int, bytes]]:
        """What a successor reads right after its fence: the headers of every record before
        it and the bodies of its chunks read directly (the run input among them), see
        :meth:`baton.log.DeliveryLog.stored_before_fence`.

        Raises:
            LogUnavailable: JetStream did not answer.
        """
        return await self.log.stored_before_fence(run_id, fenced_over)

    async def read_chunk(self, run_id: str, offset: int) -> dict[str, Any] | None:
        """The stored chunk at ``offset`` (one record read, no consumer), or ``None``.

        Raises:
            LogUnavailable: JetStream did not answer.
        """
        body = await self.log.chunk_at(run_id, offset)
        return body if isinstance(body, dict) else None
