"""The exactness tests once more under ATEN_CPU_CAPABILITY=default: a test tied to one CPU's float bits fails here.

DESIGN.md, "Portable exactness": our maths is fixed, the order of summation of the BLAS build and of torch's
vectorised kernels is not. `default` switches torch to its non-vectorised kernels, which changes float bits on this
very machine, so a test that holds float bits made on another CPU fails on every CPU, not only on the next one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# The float32 tests that compare floats with a recording, with HF, or across batch compositions and cache paths,
# and the media goldens (float32 pixel_values made on another machine, held bit for bit: portable because the
# resize is integer arithmetic and the normalisation one correctly rounded op per element). About 15 s idle on 2
# cores. Not here: tests/models' bf16 cases, because torch's own bf16 SDPA on CPU raises "pack_vnni2 is only supported
# when avx512 is supported" under `default` on a CPU with AMX (a torch limitation, not our maths).
EXACTNESS_TESTS = [
    "tests/engine/test_recorded_outputs.py",  # the recording, made on an AVX2-only CPU, within the stated bound
    "tests/engine/test_engine_parity.py",  # greedy ids equal HF generate, logprobs within 1e-4 of teacher forcing
    "tests/engine/test_engine_sampling.py",  # logprob modes and prompt logprobs against HF
    "tests/engine/test_engine_batch_invariance.py",  # alone == inside a batch, bit for bit, in one process
    "tests/engine/test_prefill_runs.py",  # batched prefill runs give the rows of attending alone
    "tests/engine/test_engine_caches.py",  # prefix and encoder cache hits give what computing afresh gives
    "tests/media/test_golden.py",  # HF processor goldens, bit for bit
    "tests/media/test_hf_sampling_golden.py",
]

_RUN = """
import sys, pytest, torch
capability = torch.backends.cpu.get_cpu_capability()
assert capability == "DEFAULT", f"ATEN_CPU_CAPABILITY=default was not honoured: {capability}"
sys.exit(pytest.main(sys.argv[1:]))
"""


@pytest.mark.skipif(os.environ.get("ATEN_CPU_CAPABILITY") == "default", reason="this whole run is already under it")
def test_exactness_tests_pass_with_torch_default_cpu_kernels():
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default", "HF_HUB_OFFLINE": "1"}
    env.pop("PYTEST_ADDOPTS", None)
    done = subprocess.run([sys.executable, "-c", _RUN, "-q", "-p", "no:cacheprovider", *EXACTNESS_TESTS],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"exactness tests fail under ATEN_CPU_CAPABILITY=default:\n{done.stdout[-6000:]}" \
                                 f"\n{done.stderr[-2000:]}"
