"""The resume arguments of an agent launch, checked before they reach an argv."""
from __future__ import annotations

import re

from baton.errors import InvalidArgument

# Session ids are UUIDs in both CLIs; anything else (a leading "-" above all) must never
# reach the argv, where it would be read as an option.
_SESSION_ID = re.compile(r"[0-9A-Za-z][0-9A-Za-z-]{0,127}")


def check_resume(resume: str | None, fork: bool) -> None:
    """Validate a resume request.

    Raises:
        InvalidArgument: ``resume`` is not a session id (field ``agent.resume``), or
            ``fork`` without ``resume`` (field ``agent.fork``).
    """
    if resume is not None and not _SESSION_ID.fullmatch(resume):
        raise InvalidArgument("agent.resume", "must be an agent session id (letters, digits, '-')")
    if fork and resume is None:
        raise InvalidArgument("agent.fork", "a fork needs the session to fork (resume)")
