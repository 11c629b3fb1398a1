"""Which modules go into which of the two distributions built from this repository (setuptools hook).

One source tree, two wheels:

* ``baton-runs`` (``pyproject.toml`` at the root): the Python client alone, the modules of
  ``CLIENT_MODULES`` (the HTTP and gRPC clients, the protobuf stubs, errors and what they import)
  plus the console-script shims of ``baton_tools._entry``.
* ``baton-runs-server`` (``server-dist/pyproject.toml``): every other module (the three services,
  ``baton.log``, ``baton_tools``), depending on ``baton-runs[server]`` at the same version.

A module path is in exactly one wheel, so both install side by side into the same ``baton``
package. An editable install (``make venv``: ``pip install -e '.[dev]'``) maps the whole tree and is
not filtered: everything stays importable there. ``tests/deploy/test_packaging.py`` builds both wheels
and checks the split.
"""
from __future__ import annotations

import shutil

from setuptools.command.build_py import build_py

# Dotted module names of the client wheel (``baton.v1`` whole). Keep it closed under imports:
# tests/deploy/test_packaging.py imports them from a venv holding the client wheel alone.
CLIENT_MODULES = frozenset({
    "baton", "baton.client", "baton.grpc_client", "baton.coordinator_client", "baton.errors",
    "baton.grpc_errors", "baton.ids", "baton.internal_auth", "baton.retry", "baton.runs", "baton.sse", "baton.tls",
    "baton.trace_context",
    # The console scripts live in the client (one distribution owns bin/baton*); without the
    # server distribution they say what to install.
    "baton_tools", "baton_tools._entry",
})
CLIENT_PACKAGES = frozenset({"baton.v1"})


def is_client(module: str) -> bool:
    """True when the dotted ``module`` (``pkg.__init__`` counts as ``pkg``) ships in the client wheel."""
    module = module.removesuffix(".__init__")
    return module in CLIENT_MODULES or any(module == p or module.startswith(p + ".") for p in CLIENT_PACKAGES)


class _SplitBuildPy(build_py):
    """``build_py`` keeping only the modules (and package data) of one side of the split."""

    client_side = True

    def _keep(self, module: str) -> bool:
        return bool(getattr(self, "editable_mode", False)) or is_client(module) == self.client_side

    def run(self) -> None:
        # A build/lib left by the other distribution's build would be packed into this wheel.
        if not getattr(self, "editable_mode", False):
            shutil.rmtree(self.build_lib, ignore_errors=True)
        super().run()

    def find_package_modules(self, package: str, package_dir: str) -> list[tuple[str, str, str]]:
        found: list[tuple[str, str, str]] = super().find_package_modules(package, package_dir)
        return [(pkg, mod, path) for pkg, mod, path in found if self._keep(f"{pkg}.{mod}")]

    def find_data_files(self, package: str, src_dir: str) -> list[str]:
        # Package data follows its package: baton/v1/*.pyi with the stubs, gateway/static with
        # the gateway.
        files: list[str] = super().find_data_files(package, src_dir)
        return files if self._keep(package) else []


class ClientBuildPy(_SplitBuildPy):
    client_side = True


class ServerBuildPy(_SplitBuildPy):
    client_side = False
