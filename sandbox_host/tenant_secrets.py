"""Per-tenant agent credentials (``BATON_TENANT_SECRETS_DIR``) and which credential a run gets.

Layout: ``<dir>/<tenant>/<VARIABLE>``, one file per credential, its content the value
(surrounding whitespace stripped), ``VARIABLE`` one of
:data:`baton.credentials.AGENT_SECRET_NAMES`. A directory per tenant, rather than
``BATON_TENANT_<TENANT>_<VAR>`` variables, because tenant names are free-form
(``BATON_API_KEYS``) and no mangling into an environment name is both readable and
collision-free; and because it is what a Kubernetes Secret volume gives (a projected
volume: ``items: [{key: ANTHROPIC_API_KEY, path: acme/ANTHROPIC_API_KEY}]``). Entries
starting with ``.`` are skipped (a Secret volume's ``..data`` links).

Which credential a run gets (:func:`choose`): for each credential the agent needs (a group
of alternatives such as ``ANTHROPIC_API_KEY|CLAUDE_CODE_OAUTH_TOKEN``), the tenant's own
when it has any of the group, else the host's shared one. Per group, not per variable: a
tenant with its own OAuth token must not also be handed the shared API key, which the CLI
would prefer and bill to the shared account.

Values never reach a log, a record or an error: errors name the tenant and the file.
"""
from __future__ import annotations

import pathlib
from typing import Mapping, Sequence

from baton.credentials import AGENT_SECRET_NAMES, is_placeholder

ENV = "BATON_TENANT_SECRETS_DIR"


def load(directory: str) -> dict[str, dict[str, str]]:
    """Read every tenant's credentials under ``directory`` (``""``: none).

    Returns:
        tenant → variable → value (empty files left out).

    Raises:
        ValueError: the directory is unreadable, a file is not an agent credential, or a
            value is a placeholder; naming the tenant and the file, never a value.
    """
    if not directory:
        return {}
    root = pathlib.Path(directory)
    out: dict[str, dict[str, str]] = {}
    try:
        tenants = sorted(p for p in root.iterdir() if not p.name.startswith("."))
    except OSError as exc:
        raise ValueError(f"{ENV}: cannot read {directory}: {exc.strerror}") from None
    for tdir in tenants:
        if not tdir.is_dir():
            raise ValueError(f"{ENV}: {tdir.name} is not a directory (expected <dir>/<tenant>/<VARIABLE>)")
        own: dict[str, str] = {}
        for f in sorted(p for p in tdir.iterdir() if not p.name.startswith(".")):
            if f.name not in AGENT_SECRET_NAMES:
                raise ValueError(f"{ENV}: {tdir.name}/{f.name} is not an agent credential "
                                 f"(one of {', '.join(sorted(AGENT_SECRET_NAMES))})")
            try:
                value = f.read_text(encoding="utf-8").strip()
            except (OSError, UnicodeDecodeError):
                raise ValueError(f"{ENV}: cannot read {tdir.name}/{f.name}") from None
            if is_placeholder(value):
                raise ValueError(f"{ENV}: {tdir.name}/{f.name} holds a placeholder, not a credential")
            if value:
                own[f.name] = value
        if own:
            out[tdir.name] = own
    return out


def choose(required: Sequence[str], shared: Mapping[str, str], own: Mapping[str, str]) -> dict[str, str]:
    """The credentials a run gets: per required group, the tenant's (``own``) if it has any
    of the group, else the host's (``shared``).

    Args:
        required: the agent's ``required_secrets`` (``"A|B"``: either will do).
        shared: the host's credentials (its environment).
        own: the run's tenant's credentials (empty: none).

    Returns:
        variable → value, only variables of ``required``; a group neither has is left out
        (the caller refuses the run naming it).
    """
    chosen: dict[str, str] = {}
    for need in required:
        names = need.split("|")
        source = own if any(own.get(n) for n in names) else shared
        chosen.update((n, source[n]) for n in names if source.get(n))
    return chosen
