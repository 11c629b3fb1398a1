"""The run's workspace as a request names it: one schema for the gateway and the host.

A request (``POST /api/chat`` field ``workspace``, gRPC ``RunStartRequest.workspace``) names
where the agent works::

    {"git": URL, "ref": REF?, "credential": NAME?, "setup": [CMD, ...]?}
    {"dir": PATH, "setup": [CMD, ...]?}

The gateway refuses bad input here, before anything is created; the host checks the same
model again in its ``StartRun`` (with its own allow-list and its tenant's credential names)
and records :meth:`WorkspaceSpec.to_record` in ``RunRecord.workspace_json``.

Rules: exactly one of ``git`` and ``dir``; a git URL's scheme is ``https``, ``http``,
``ssh`` or ``git`` (or scp-like ``user@host:path``), and a local repository (a path or
``file://``) only inside the operator's allow-list ``BATON_WORKSPACE_DIRS``, like ``dir``;
no credentials inside a URL (``credential`` names one the operator configured); ``ref`` a
git ref name; ``credential`` a name. Paths are resolved (``realpath``) and checked from the
path alone: nothing here reads a directory, so a request can never make a service list or
read one.

Pure apart from ``realpath`` (no file content, no server).
"""
from __future__ import annotations

import json
import os
import re
from typing import Annotated, Any, Mapping, Sequence
from urllib.parse import quote, unquote, urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from baton.agents import MAX_PATH_CHARS, invalid_argument, is_inside
from baton.errors import InvalidArgument

#: Setup commands a workspace may run at most.
MAX_SETUP_COMMANDS = 32
#: Longest setup command, in characters.
MAX_SETUP_CHARS = 4096
MAX_URL_CHARS = 2048
MAX_REF_CHARS = 256
MAX_CREDENTIAL_CHARS = 128
#: URL schemes a remote git workspace may use (``file`` is local: allow-list only).
GIT_SCHEMES = ("https", "http", "ssh", "git")

_CONTROL = re.compile(r"[\x00-\x20\x7f]")
_CREDENTIAL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_SCP_LIKE = re.compile(r"^[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:")
# git check-ref-format's refusals that matter on a command line and in a checkout.
_BAD_REF = re.compile(r"(\.\.|@\{|[~^:?*\[\\]|//|/\.|\.lock(/|$))")


def _ref(value: str) -> str:
    if not value or value.startswith(("-", "/", ".")) or value.endswith(("/", ".")) or _CONTROL.search(value) \
            or _BAD_REF.search(value) or value == "@":
        raise ValueError("must be a git ref name (a branch, tag or commit; no leading '-', no whitespace)")
    return value


def _credential(value: str) -> str:
    if not _CREDENTIAL.match(value):
        raise ValueError("must be a credential name (letters, digits, '-', '_', '.')")
    return value


def _text(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    return value


def _nonblank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    return _text(value)


Ref = Annotated[str, Field(max_length=MAX_REF_CHARS), AfterValidator(_ref)]
CredentialName = Annotated[str, Field(max_length=MAX_CREDENTIAL_CHARS), AfterValidator(_credential)]
Url = Annotated[str, Field(min_length=1, max_length=MAX_URL_CHARS), AfterValidator(_nonblank)]
Path = Annotated[str, Field(min_length=1, max_length=MAX_PATH_CHARS), AfterValidator(_nonblank)]
Command = Annotated[str, Field(max_length=MAX_SETUP_CHARS), AfterValidator(_nonblank)]


class WorkspaceSpec(BaseModel):
    """A validated workspace (strict types; unknown fields refused, naming the field).

    Attributes:
        git: the repository URL (or, resolved, a local repository path).
        ref: branch, tag or commit to check out; ``None`` = the default branch.
        credential: name of an operator-configured git credential of the run's tenant.
        dir: a resolved directory inside ``BATON_WORKSPACE_DIRS``, copied in.
        setup: shell commands run in order in the workspace before the agent.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    git: Url | None = None
    ref: Ref | None = None
    credential: CredentialName | None = None
    dir: Path | None = None
    setup: Annotated[tuple[Command, ...], Field(max_length=MAX_SETUP_COMMANDS)] = ()

    def to_record(self) -> str:
        """The JSON recorded in ``RunRecord.workspace_json`` (compact, sorted, no nulls)."""
        return json.dumps(self.model_dump(exclude_none=True, exclude_defaults=True, mode="json"),
                          sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_record(cls, raw: str) -> "WorkspaceSpec | None":
        """The spec of a record's ``workspace_json``; ``None`` when empty.

        The allow-list is not checked again here: it was when the run was created.

        Raises:
            InvalidArgument: (field ``workspace``) the JSON is not a workspace.
        """
        if not raw:
            return None
        try:
            value = json.loads(raw)
        except ValueError:
            raise InvalidArgument("workspace", "must be a JSON object") from None
        return _validate(value, "workspace", None)

    @property
    def is_git(self) -> bool:
        return self.git is not None


def workspace_dirs(raw: str) -> tuple[str, ...]:
    """Parse ``BATON_WORKSPACE_DIRS`` (colon- or comma-separated) into resolved paths."""
    return tuple(os.path.realpath(d) for d in re.split(r"[:,]", raw) if d.strip())


def parse_workspace(obj: Any, *, dirs: Sequence[str], field: str = "workspace") -> WorkspaceSpec | None:
    """Validate a request's workspace object.

    Args:
        obj: the decoded JSON value (``None`` = no workspace).
        dirs: the allow-list (resolved paths, :func:`workspace_dirs`); empty = no ``dir``
            and no local git repository is allowed.
        field: where the object sits in the request, for errors (``workspace.ref``).

    Returns:
        The spec, ``dir`` (and a local ``git`` path) resolved; ``None`` for ``None``.

    Raises:
        InvalidArgument: not an object, an unknown field, neither or both of ``git`` and
            ``dir``, a bad URL, ref or credential name, too many setup commands, or a path
            outside the allow-list. The field is named; a URL's value is never quoted.
    """
    if obj is None:
        return None
    return _validate(obj, field, dirs)


def _validate(obj: Any, field: str, dirs: Sequence[str] | None) -> WorkspaceSpec:
    if not isinstance(obj, Mapping):
        raise InvalidArgument(field, "must be an object: {\"git\": URL, \"ref\"?, \"credential\"?, \"setup\"?} "
                                     "or {\"dir\": PATH, \"setup\"?}")
    value = dict(obj)
    if isinstance(value.get("setup"), list):
        value["setup"] = tuple(value["setup"])  # strict mode takes a JSON array only as a tuple here
    try:
        spec = WorkspaceSpec.model_validate(value)
    except ValidationError as exc:
        err = invalid_argument(exc, field)
        if exc.errors()[0]["type"] == "extra_forbidden":
            err = InvalidArgument(err.field, "is not a workspace field (git, ref, credential, dir, setup)")
        raise err from None
    if (spec.git is None) == (spec.dir is None):
        raise InvalidArgument(field, "needs exactly one of git and dir")
    if spec.dir is not None:
        if spec.ref is not None or spec.credential is not None:
            raise InvalidArgument(f"{field}.{'ref' if spec.ref is not None else 'credential'}",
                                  "applies to a git workspace only")
        if dirs is not None:
            spec = spec.model_copy(update={"dir": _allowed_path(spec.dir, dirs, f"{field}.dir")})
        return spec
    assert spec.git is not None
    git = _check_git_url(spec.git, f"{field}.git", dirs)
    if spec.credential is not None and urlsplit(git).scheme.lower() not in ("https", "http"):
        raise InvalidArgument(f"{field}.credential", "applies to https and http URLs only")
    return spec.model_copy(update={"git": git}) if git != spec.git else spec


def _allowed_path(path: str, dirs: Sequence[str], field: str) -> str:
    """``path`` resolved, if it lies inside one of ``dirs``; never looks into it."""
    if not os.path.isabs(path):
        raise InvalidArgument(field, "must be an absolute path")
    real = os.path.realpath(path)
    if not dirs or not is_inside(real, dirs):
        raise InvalidArgument(field, "is not inside the allowed workspace directories (BATON_WORKSPACE_DIRS)")
    return real


def _check_git_url(url: str, field: str, dirs: Sequence[str] | None) -> str:
    """The URL to clone: a remote URL as given, a local repository resolved.

    Raises:
        InvalidArgument: a scheme not allowed, credentials in the URL, an option-like
            value, or a local repository outside the allow-list.
    """
    if url.startswith("-") or _CONTROL.search(url):
        raise InvalidArgument(field, "must be a git URL (no leading '-', no whitespace)")
    if _SCP_LIKE.match(url) and "://" not in url:
        return url  # user@host:path, ssh's short form (the user is a login, not a secret)
    if "://" not in url:
        if dirs is None:
            return url
        return _allowed_path(url, dirs, field)
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "file":
        if dirs is None:
            return url
        if parts.netloc not in ("", "localhost"):
            raise InvalidArgument(field, "a file:// URL must name a local path")
        # git decodes a file URL's percent-escapes (%2e%2e is ".."): the path is checked as
        # git will read it, and handed to git escaped again.
        return "file://" + quote(_allowed_path(unquote(parts.path or "/"), dirs, field), safe="/")
    if scheme not in GIT_SCHEMES:
        raise InvalidArgument(field, f"must use one of the schemes {', '.join(GIT_SCHEMES)} (or a local path)")
    if not parts.hostname:
        raise InvalidArgument(field, "must name a host")
    if parts.password is not None or (parts.username is not None and scheme in ("https", "http")):
        raise InvalidArgument(field, "must not carry credentials: name a configured one in workspace.credential")
    return url


__all__ = ["GIT_SCHEMES", "MAX_SETUP_COMMANDS", "WorkspaceSpec", "parse_workspace", "workspace_dirs"]
