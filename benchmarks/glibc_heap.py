"""glibc heap control for CPU peak-memory figures (the ``HeapControl`` that ``benchmarks/run.py`` passes).

torch's CPU tensors come from ``malloc``. With glibc's default (dynamic) mmap threshold, a freed large
buffer stays in the heap and is reused, so the resident set does not follow live tensors. Pinning the
threshold to 64 KiB maps every tensor buffer on allocation and unmaps it on free; ``malloc_trim(0)``
returns free heap pages before a measurement. This touches the whole process, so it belongs to the
benchmark runner, not to the library.
"""

from __future__ import annotations

import ctypes

M_MMAP_THRESHOLD = -3  # mallopt parameter number, from glibc's <malloc.h>
PINNED_THRESHOLD = 64 * 1024
DYNAMIC_MAXIMUM = 32 * 1024 * 1024  # glibc's upper bound for the dynamic threshold on 64-bit systems


class GlibcHeap:
    """Pin / trim / unpin glibc's heap through ``mallopt`` and ``malloc_trim`` (no-ops elsewhere)."""

    def __init__(self) -> None:
        self.pinned = False
        try:
            self._libc = ctypes.CDLL("libc.so.6")
        except OSError:  # not glibc: pin() reports False and CPU peak is not measured
            self._libc = None

    def pin(self) -> bool:
        if not self.pinned and self._libc is not None:
            self.pinned = bool(self._libc.mallopt(M_MMAP_THRESHOLD, PINNED_THRESHOLD))
        return self.pinned

    def trim(self) -> None:
        if self._libc is not None:
            self._libc.malloc_trim(0)

    def unpin(self) -> None:
        """Fix the threshold at glibc's dynamic maximum: large buffers are reused again (timings)."""
        if self.pinned:
            self._libc.mallopt(M_MMAP_THRESHOLD, DYNAMIC_MAXIMUM)
            self.pinned = False
