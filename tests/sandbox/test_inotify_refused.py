"""A follow whose inotify instance the kernel refuses still reads every byte (it polls) and
says why once, naming the limit to raise (``sandbox_host/providers/_inotify.py``).

The refusal is the kernel's own: a process whose open-file limit leaves no descriptor for the
instance gets ``EMFILE`` from ``inotify_init1``, as the 129th process of a user gets it
from ``fs.inotify.max_user_instances``.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.sandbox.conftest import REPO

pytestmark = pytest.mark.servers  # a subprocess of its own, with a lowered open-file limit

_SCRIPT = textwrap.dedent('''
    import asyncio, logging, os, resource, sys, tempfile
    logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(levelname)s %(message)s")
    from sandbox_host.daemon._files import follow_file
    from sandbox_host.providers import _inotify

    async def main():
        path = os.path.join(tempfile.mkdtemp(), "journal")
        with open(path, "wb") as f:
            f.write(b"one\\n")
        writer = os.open(path, os.O_WRONLY | os.O_APPEND)
        _inotify.libc()  # found before the limit (ldconfig runs in a subprocess)
        # Every descriptor up to fd taken (an open takes the lowest free one): the journal's
        # open gets fd + 1, and a limit of fd + 2 leaves nothing for the inotify instance.
        top = max(int(n) for n in os.listdir("/proc/self/fd"))
        while (fd := os.open(os.devnull, os.O_RDONLY)) < top:
            pass
        resource.setrlimit(resource.RLIMIT_NOFILE, (fd + 2, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        got = []

        async def follow():
            async for data in follow_file(path, 0, _inotify.FileWatcher(), 0.05):
                got.append(data)
                if b"".join(got) == b"one\\ntwo\\n":
                    return
        task = asyncio.create_task(follow())
        async with asyncio.timeout(20):
            while not got:
                await asyncio.sleep(0.01)
            os.write(writer, b"two\\n")
            await task
        print("GOT", b"".join(got))
    asyncio.run(main())
''')


def test_a_follow_without_inotify_polls_and_names_the_limit() -> None:
    out = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[-1] == "GOT b'one\\ntwo\\n'", out.stdout
    warnings = [ln for ln in lines if ln.startswith("WARNING")]
    assert warnings == ["WARNING inotify refused (inotify_init1: Too many open files); followed files are "
                        "polled instead: raise fs.inotify.max_user_instances (instances per user, 128 by "
                        "default) or the process's open-file limit"], out.stdout
