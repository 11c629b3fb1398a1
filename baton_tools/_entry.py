"""Console-script entry points that name the missing extra instead of a traceback.

``pip install baton`` is the Python client alone; the services and the ``baton`` command need
extras (pyproject.toml). Each entry point imports its real ``main`` lazily, so a missing
third-party module becomes one line saying which extra installs it.
"""
from __future__ import annotations

import importlib
import sys
from typing import Callable

# Our own top-level packages: a ModuleNotFoundError naming one of these is a real bug.
_OWN = {"baton", "baton_tools", "coordinator", "sandbox_host", "gateway"}


def _load(target: str, extra: str, prog: str) -> Callable[[], object]:
    module, _, func = target.partition(":")
    try:
        loaded: Callable[[], object] = getattr(importlib.import_module(module), func)
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").split(".")[0]
        if not missing or missing in _OWN:
            raise
        sys.exit(
            f"{prog}: the {missing!r} module is missing; this command needs the {extra!r} extra:"
            f" pip install 'baton[{extra}]'"
        )
    return loaded


def baton() -> None:
    """``baton``: the operator CLI (extra ``cli``; ``baton up``/``demo`` also need ``tools``)."""
    _load("baton_tools.cli:main", "cli", "baton")()


def coordinator() -> None:
    """``baton-coordinator`` (extra ``server``)."""
    _load("coordinator.__main__:main", "server", "baton-coordinator")()


def sandbox_host() -> None:
    """``baton-sandbox-host`` (extra ``server``; ``docker`` for the docker provider)."""
    _load("sandbox_host.__main__:main", "server", "baton-sandbox-host")()


def gateway() -> None:
    """``baton-gateway`` (extra ``server``)."""
    _load("gateway.__main__:main", "server", "baton-gateway")()
