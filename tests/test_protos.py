"""The generated stubs are exactly what `make protos` produces from protos/."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO

# Runs protoc in a subprocess: not a `unit` test.
pytestmark = pytest.mark.servers


def test_generated_stubs_are_fresh() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gen_protos.py"), "--check"],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
