"""The daemon's source bundle (what the docker provider copies into a container) is closed
under imports: the daemon starts from it alone, beside the third-party packages."""
from __future__ import annotations

import io
import pathlib
import subprocess
import sys
import tarfile

import pytest

from sandbox_host.daemon._bundle import source_tar

pytestmark = [pytest.mark.servers, pytest.mark.timeout(60)]

_CHECK = """
import sys
sys.path.insert(0, sys.argv[1])
import sandbox_host.daemon.__main__
mine = [m for m in sys.modules if m.split(".")[0] in ("baton", "sandbox_host", "coordinator", "gateway")]
outside = [m for m in mine if not (getattr(sys.modules[m], "__file__", "") or "").startswith(sys.argv[1])]
assert not outside, outside
"""


def test_bundle_imports_alone(tmp_path: pathlib.Path) -> None:
    with tarfile.open(fileobj=io.BytesIO(source_tar("src")), mode="r:") as t:
        t.extractall(tmp_path, filter="data")
    done = subprocess.run([sys.executable, "-c", _CHECK, str(tmp_path / "src")], capture_output=True, timeout=50)
    assert done.returncode == 0, done.stderr.decode()
