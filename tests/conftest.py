"""Test-wide setup: never reach the model hub, keep tokenizers single-threaded."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Without CUDA, Triton runs only in its interpreter, and @triton.jit reads this flag when a function is decorated,
# triton.language's own helpers included: set it before anything (FakeTensorMode, inductor) can import triton, so
# that no test's outcome depends on the order the tests run in.
import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
