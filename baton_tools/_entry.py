"""Console-script entry points that name the missing extra instead of a traceback.

``pip install baton-runs`` is the Python client alone (this module ships in its wheel, the
commands' code does not); the services and the ``baton`` command are the distribution
``baton-runs-server`` and its extras (server-dist/pyproject.toml). Each entry point imports its
real ``main`` lazily, so a missing module becomes one line saying what installs it.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import Callable

# Our own top-level packages (the client wheel holds only baton's client modules and this one).
_OWN = {"baton", "baton_tools", "coordinator", "sandbox_host", "gateway"}


def _present(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False


def _load(target: str, extra: str, prog: str) -> Callable[[], object]:
    module, _, func = target.partition(":")
    try:
        loaded: Callable[[], object] = getattr(importlib.import_module(module), func)
    except ModuleNotFoundError as exc:
        if not exc.name or (exc.name.split(".")[0] in _OWN and _present(module)):
            raise  # our own code is there but broken: a real bug, not an install to name
        # Our own module missing: the server distribution is not installed; a third-party one:
        # the extra that declares it is not.
        # The server distribution requires the `server` extra's dependencies itself.
        what = "./server-dist" if extra == "server" else f"'./server-dist[{extra}]'"
        sys.exit(f"{prog}: the {exc.name!r} module is missing; this command needs the server distribution"
                 f" (baton-runs-server, not on PyPI yet): pip install {what} in a checkout of baton")
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
