"""Redaction of secrets from text that may reach a log line, an error or a record."""
from __future__ import annotations

from typing import Iterable, Mapping

REDACTED = "[REDACTED]"
# Very short values would redact ordinary words ("a", "1"); they are not secrets worth
# the damage. Anything of 4+ characters is replaced.
_MIN_SECRET_LEN = 4


def redact(text: str, secrets: Mapping[str, str] | Iterable[str] | None) -> str:
    """``text`` with every secret value replaced by ``[REDACTED]``.

    Args:
        text: any text (stderr tail, command line, error message).
        secrets: a name → value mapping (values are redacted) or an iterable of values.

    Returns:
        The redacted text. Longer secrets are replaced first, so a secret that contains
        another is not left half-visible.
    """
    if not secrets:
        return text
    values = secrets.values() if isinstance(secrets, Mapping) else secrets
    for value in sorted({v for v in values if v and len(v) >= _MIN_SECRET_LEN}, key=len, reverse=True):
        text = text.replace(value, REDACTED)
    return text
