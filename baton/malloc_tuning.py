"""Keep freed large blocks in the process instead of handing them back to the kernel (glibc).

A gRPC stream of 1 MiB messages allocates and frees several megabyte-sized buffers per
message (the file read, the protobuf message, its encoding, gRPC's copies). glibc's defaults
serve those from the heap only after its dynamic threshold rose, and then trim the top of the
heap back to the kernel as soon as more than 2 × that threshold is free: every next buffer
faults its pages in again (``brk`` plus one page fault per 4 KiB). Measured on the sandbox
daemon's journal read (bench/sandbox_daemon.py, bench/results/README.md), that churn, not
gRPC, was most of the cost. :func:`retain_freed_memory` raises both thresholds, so freed
buffers are reused: the process keeps up to :data:`TRIM_THRESHOLD` bytes of freed memory.
"""
from __future__ import annotations

import ctypes

#: Allocations below this many bytes come from the heap (reused after free), not ``mmap``.
MMAP_THRESHOLD = 32 << 20
#: Freed bytes at the top of the heap kept before trimming.
TRIM_THRESHOLD = 128 << 20
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def retain_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds for this process (see the module docstring).

    Returns:
        Whether the thresholds were set (``False`` on a C library without ``mallopt``, e.g.
        musl or macOS: nothing changes there).
    """
    try:  # the C library the process runs on (no find_library: that starts ldconfig)
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))


__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "retain_freed_memory"]
