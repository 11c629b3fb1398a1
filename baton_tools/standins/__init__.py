"""Stand-in ``claude`` and ``codex`` executables: the agents' CLIs without a model.

No model is reachable from the machines baton's tests and demo run on, so these two
programs (``claude``, ``codex`` in this directory; one stdlib-only Python 3 file each, so
they also run in the sandbox image) behave like the real CLIs as far as baton observes
them: flags, the prompt on stdin, the journal on stdout, sessions kept where the real CLIs
keep them, resume/fork, and the real refusal of an unknown session. Their work is scripted
by the prompt (``write``, ``append``, ``run``, ``recall``, ``say``, ``sleep``, ``fail``).
docs/agents.md describes them and where each behaviour was taken from.

Put :data:`STANDINS_DIR` first on the agent's ``PATH`` to use them.
"""
from __future__ import annotations

import pathlib

#: The directory holding the ``claude`` and ``codex`` stand-ins.
STANDINS_DIR = str(pathlib.Path(__file__).resolve().parent)
#: The stand-in executables by name.
STANDINS = {name: str(pathlib.Path(STANDINS_DIR) / name) for name in ("claude", "codex")}

__all__ = ["STANDINS", "STANDINS_DIR"]
