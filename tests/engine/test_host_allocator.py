"""glibc malloc settings of our processes: step-sized blocks come from the heap, and freed ones stay there."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# A fresh interpreter (nothing has freed a large block yet, so glibc's mmap threshold is still its first 128 KiB):
# malloc 24 MiB, as a prefill's scores or a batch's patch rows are; where did it come from, and after free(), does
# the heap keep it? mallinfo2: arena = heap bytes, hblkhd = bytes in mmapped blocks.
PROBE = """
import ctypes
from mm_infer.engine.runner.host_allocator import keep_step_memory
class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
applied = keep_step_memory()
before = libc.mallinfo2()
block = libc.malloc(24 << 20)
ctypes.memset(block, 1, 24 << 20)
alive = libc.mallinfo2()
libc.free(block)
after = libc.mallinfo2()
mib = 1 << 20
print(int(applied), (alive.hblkhd - before.hblkhd) // mib, (alive.arena - before.arena) // mib,
      (after.arena - before.arena) // mib)
"""


def _probe(opt_out: bool) -> list[int]:
    env = {**os.environ, "MM_INFER_KEEP_MALLOC": "1" if opt_out else "0"}
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120,
                         check=True).stdout.split()
    return [int(x) for x in out]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc settings are Linux-only")
def test_step_sized_blocks_come_from_the_heap_and_stay_there():
    # catches: mallopt not applied (a wrong parameter number, a value glibc refuses): the block would be a fresh
    # mapping, faulted in page by page on every step that needs it (engine: ~5k faults a wave against ~1k)
    applied, mapped, heap_alive, heap_after = _probe(opt_out=False)
    assert applied == 1
    assert mapped == 0 and heap_alive >= 20, "a 24 MiB block should come from the heap"
    assert heap_after >= 20, "the freed block should stay in the heap, not be trimmed back to the kernel"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc settings are Linux-only")
def test_opting_out_leaves_glibc_defaults():
    applied, mapped, heap_alive, _ = _probe(opt_out=True)
    assert applied == 0
    assert mapped >= 24 and heap_alive < 4, "glibc's defaults map a 24 MiB block: the probe would show nothing"
