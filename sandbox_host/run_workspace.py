"""A run's workspace on the host: checked at ``StartRun``, turned into a ``SandboxSpec``.

The host is where a run's record is created (``RunManager.start_run`` →
``create_or_resume_run``), so it is the host that refuses a bad workspace, and a credential
name its tenant does not have, before the record exists (``InvalidArgument`` → 400 /
``INVALID_ARGUMENT`` at the gateway, nothing created). The gateway checks the request's
shape and allow-list too, but never sees a credential.

Credentials are the operator's: ``BATON_GIT_CREDENTIALS_FILE`` is a JSON file
``{tenant: {name: {"username": …, "token": …}}}`` (tenant ``""`` when the gateway runs
without API keys), read once when the host starts. A request names one; the token travels
to the provider as a secret of the spec (:data:`~sandbox_host.providers._workspace.GIT_TOKEN_ENV`)
and from there to git through its environment only.
"""
from __future__ import annotations

import json
from urllib.parse import urlsplit
from dataclasses import dataclass, field
from typing import Any, Mapping

from baton import config
from baton.errors import InvalidArgument
from baton.v1 import runs_pb2
from baton.workspace_spec import WorkspaceSpec, parse_workspace, workspace_dirs
from sandbox_host.providers._workspace import GIT_TOKEN_ENV, GIT_USERNAME_ENV

#: Agent kinds that run in a thread's fixed working directory and home (``thread_dir``)
#: when the run has a workspace: the ones with a session store to keep across turns.
THREAD_DIR_AGENTS = frozenset({"claude-code", "codex"})


@dataclass(frozen=True)
class GitCredential:
    """One operator-configured git credential (the token never in ``repr``)."""

    username: str
    token: str = field(repr=False)
    #: The URL prefix it is for (``https://git.example.com/acme/``): a request's repository
    #: must start with it, so a request can never send the token to an origin it chooses.
    url: str = ""

    def serves(self, repository: str) -> bool:
        """Whether this credential may be sent for ``repository`` (a git URL)."""
        return bool(self.url) and repository.startswith(self.url)


@dataclass(frozen=True)
class WorkspaceSettings:
    """The host's workspace settings.

    Attributes:
        dirs: ``BATON_WORKSPACE_DIRS``, resolved.
        build_timeout: ``BATON_WORKSPACE_BUILD_TIMEOUT`` seconds (0 = no bound).
        max_bytes: ``BATON_WORKSPACE_MAX_BYTES`` (0 = no limit).
        credentials: tenant → name → credential (``BATON_GIT_CREDENTIALS_FILE``).
    """

    dirs: tuple[str, ...] = ()
    build_timeout: float = 600.0
    max_bytes: int = 0
    credentials: Mapping[str, Mapping[str, GitCredential]] = field(default_factory=dict, repr=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "WorkspaceSettings":
        """Read the settings (and the credentials file, once).

        Raises:
            ValueError: naming the variable when a value or the file is malformed (never
                quoting a credential).
        """
        path = config.get("BATON_GIT_CREDENTIALS_FILE", env)
        return cls(dirs=workspace_dirs(config.get("BATON_WORKSPACE_DIRS", env)),
                   build_timeout=config.get_float("BATON_WORKSPACE_BUILD_TIMEOUT", env),
                   max_bytes=int(config.get_float("BATON_WORKSPACE_MAX_BYTES", env)),
                   credentials=load_git_credentials(path) if path else {})


def load_git_credentials(path: str) -> dict[str, dict[str, GitCredential]]:
    """Parse a credentials file: ``{tenant: {name: {"username": str?, "token": str, "url": str}}}``
    (``url``: the prefix of the repository URLs the credential is for, e.g.
    ``https://git.example.com/acme/``).

    Raises:
        ValueError: naming ``BATON_GIT_CREDENTIALS_FILE`` and the tenant/name at fault;
            never a value.
    """
    where = "BATON_GIT_CREDENTIALS_FILE"
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{where}: cannot read {path!r} as JSON ({type(exc).__name__})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: must hold a JSON object {{tenant: {{name: {{username, token}}}}}}")
    out: dict[str, dict[str, GitCredential]] = {}
    for tenant, names in raw.items():
        if not isinstance(names, dict):
            raise ValueError(f"{where}: tenant {tenant!r} must map names to credentials")
        for name, cred in names.items():
            if not isinstance(cred, dict) or not isinstance(cred.get("token"), str) or not cred["token"] \
                    or not isinstance(cred.get("username", ""), str) or set(cred) - {"username", "token", "url"} \
                    or not _credential_url(cred.get("url")):
                raise ValueError(f"{where}: {tenant!r}/{name!r} must be {{\"username\"?: str, \"token\": str, "
                                 f"\"url\": the http(s) URL prefix of the repositories it is for}}")
            out.setdefault(tenant, {})[name] = GitCredential(cred.get("username") or "", cred["token"], cred["url"])
    return out


def _credential_url(url: Any) -> bool:
    if not isinstance(url, str):
        return False
    parts = urlsplit(url)
    return parts.scheme in ("https", "http") and bool(parts.hostname) and parts.password is None


def check_start(raw: str, tenant: str, settings: WorkspaceSettings) -> str:
    """The workspace a ``StartRun`` asks for, checked here, as ``RunRecord.workspace_json``.

    Args:
        raw: ``StartRunRequest.workspace_json`` (``""`` = none).
        tenant: the run's tenant.
        settings: this host's settings.

    Returns:
        The JSON to record (``""`` for none).

    Raises:
        InvalidArgument: a bad workspace (field ``workspace…``), a path outside this host's
            allow-list, or a credential name the tenant does not have
            (``workspace.credential``).
    """
    if not raw:
        return ""
    try:
        value = json.loads(raw)
    except ValueError:
        raise InvalidArgument("workspace", "must be a JSON object") from None
    spec = parse_workspace(value, dirs=settings.dirs)
    if spec is None:
        return ""
    if spec.credential is not None:
        cred = settings.credentials.get(tenant, {}).get(spec.credential)
        if cred is None:
            raise InvalidArgument("workspace.credential",
                                  f"no git credential {spec.credential!r} is configured for this tenant")
        if spec.git is None or not cred.serves(spec.git):
            raise InvalidArgument("workspace.credential",
                                  f"git credential {spec.credential!r} is not for this repository's URL")
    return spec.to_record()


def spec_fields(record: runs_pb2.RunRecord, settings: WorkspaceSettings) -> dict[str, Any]:
    """Keyword arguments of ``SandboxSpec`` for the run's workspace (``{}`` for none).

    Raises:
        InvalidArgument: the record's workspace is not valid JSON of a workspace, or names
            a credential this host does not have (the operator removed it since).
    """
    from sandbox_host.thread_session import TurnStart

    kind = record.agent.kind or config.get("BATON_DEFAULT_AGENT")
    turn = TurnStart.from_json(record.turn_json)
    thread_dir = record.thread_id if kind in THREAD_DIR_AGENTS and (turn is not None or record.workspace_json) else None
    if turn is not None and turn.snapshot is not None:
        # A later turn: its workspace is the snapshot its predecessor left (restored before
        # the launch, sandbox_host/turns.py), never built again.
        return {"thread_dir": thread_dir}
    # The thread's workspace is built anew by this run (a head to restore would have a snapshot).
    rebuild = turn is not None and thread_dir is not None
    spec = WorkspaceSpec.from_record(record.workspace_json)
    if spec is None:
        return {"thread_dir": thread_dir, "rebuild_thread_dir": rebuild} if thread_dir is not None else {}
    secrets: dict[str, str] = {}
    if spec.credential is not None:
        cred = settings.credentials.get(record.tenant, {}).get(spec.credential)
        if cred is None or spec.git is None or not cred.serves(spec.git):
            raise InvalidArgument("workspace.credential",
                                  f"no git credential {spec.credential!r} for this repository is configured "
                                  "for this tenant on this host")
        secrets = {GIT_TOKEN_ENV: cred.token, **({GIT_USERNAME_ENV: cred.username} if cred.username else {})}
    return {
        "workspace": spec.git if spec.git is not None else spec.dir,
        "workspace_is_git": spec.is_git,
        "git_ref": spec.ref,
        "setup": tuple(spec.setup),
        "secrets": secrets,
        "thread_dir": thread_dir,
        "rebuild_thread_dir": rebuild,
        "build_timeout": settings.build_timeout or None,
        "max_workspace_bytes": settings.max_bytes or None,
    }
