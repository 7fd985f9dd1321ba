"""Host memory reuse: freed tensors' memory stays in the process for the next step (``train.reuse_host_memory``).

glibc's malloc serves every block above its mmap threshold (128 KiB, rising to at most 32 MiB) with a fresh
``mmap`` and gives it back with ``munmap`` when the tensor is freed, and trims the top of its heap when more than
twice that threshold is free. A training step allocates and frees the same large blocks every time (activations,
a chunk's logits, a weight's gradient), so each step faults every page of them in again: the kernel zeroes each
4 KiB page on first touch. On SmolLM2-135M's CPU step (a 49,152-token vocabulary) that was 0.6 to 1.0 million page
faults and 3 to 8 s of kernel time per step (docs/performance.md, "Host memory reuse").

:func:`reuse_freed_memory` turns both off for the process (``mallopt``: no mmap'd blocks, no trimming): blocks come
from the heap and return to it, and the next step reuses them without a fault. The cost: the process keeps its
peak heap (what a GPU framework's caching allocator keeps too). Not glibc (musl, macOS): nothing is changed.
"""
from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's malloc.h
_NEVER_TRIM = 2**31 - 1  # mallopt takes an int: 2 GiB of free heap top before a trim, i.e. in practice never


def reuse_freed_memory() -> bool:
    """Keep freed heap memory in the process (see the module docstring); True where glibc accepted it."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, _NEVER_TRIM))
