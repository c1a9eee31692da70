"""The engine core hands freed heap back to the OS when it goes idle: once per idle spell, at most once a second."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from mm_infer.engine_core.heap_trim import IdleTrimmer, _glibc_trim


def test_trims_at_most_once_per_interval():
    now, calls = [100.0], []
    trimmer = IdleTrimmer(lambda: calls.append(now[0]), clock=lambda: now[0], min_interval_s=1.0)
    trimmer.idle()
    now[0] += 0.5
    trimmer.idle()  # idle again within the second: no second walk of the heap
    now[0] += 0.6
    trimmer.idle()
    assert calls == [100.0, 101.1] and trimmer.trims == 2


def test_without_glibc_it_does_nothing():
    trimmer = IdleTrimmer(trim=None)
    trimmer._trim = None
    trimmer.idle()
    assert trimmer.trims == 0


def test_a_trim_gives_freed_heap_back():
    # 96 MiB in 64 KiB blocks (under glibc's mmap threshold: they live in the heap), all freed but the last, which
    # pins the top of the heap: without a trim the freed pages stay resident
    if _glibc_trim() is None:
        pytest.skip("not glibc")
    code = textwrap.dedent("""
        from mm_infer.engine_core.heap_trim import _glibc_trim
        def rss():
            return int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) // 1024
        blocks = [bytearray(b"x" * (64 << 10)) for _ in range(1536)]
        keep = blocks[-1]
        del blocks
        before = rss()
        _glibc_trim()()
        print(before, rss())
    """)
    before, after = map(int, subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                             check=True).stdout.split())
    assert before - after > 64, (before, after)  # MiB handed back
