"""A fake-CUDA engine: the real LLMEngine with weights and KV pool on FakeTensorMode `cuda:0`, on a CPU-only build.

FakeTensorMode runs every op's shape and device logic without data. Any op mixing cuda and cpu tensors raises
(FakeTensorDeviceMismatchError, or "not linked with support for cuda" when a CPU index meets a cuda tensor), and
any read of device data on the host (`.tolist()`, `.item()`, boolean-mask indexing) raises. So a step that runs
to the sampler's readback mixes no devices and syncs nothing before it.

One gap of the CPU-only build is bridged here: Python indexing (`x[i]`, `x[:, None]`, `x[i] = v`) takes a CUDA
device guard that this build lacks. `CudaIndexing` runs those on `meta` twins for their shapes instead, and is
stricter than CUDA itself: a CPU index tensor or a CPU value written into a cuda tensor (an implicit copy) raises.
Explicit host-to-device copies (`.to(device)`, `cuda_buffer.copy_(host)`) are how inputs are staged: allowed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.overrides import TorchFunctionMode

from mm_infer.engine import engine as engine_module
from mm_infer.engine.engine import LLMEngine
from mm_infer.engine.sampling.sampler import SampledTokens, SampleResult
from mm_infer.models import load_model

CUDA = torch.device("cuda", 0)  # the bare "cuda" string is refused by .to() on a CPU-only build, even when faked
META = torch.device("meta")


def _meta(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=META)


def _meta_index(index, device: torch.device):
    """The index with device tensors as meta twins; host tensors (but 0-dim ones) meeting a cuda tensor raise."""
    if isinstance(index, tuple | list) and any(isinstance(i, torch.Tensor) for i in index):
        return type(index)(_meta_index(i, device) for i in index)
    if isinstance(index, torch.Tensor):
        if index.device != device and index.dim() > 0:
            raise RuntimeError(f"index tensor on {index.device} used on a tensor on {device}")
        return _meta(index) if index.device == device else index
    return index


HOST_READS = (torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__float__, torch.Tensor.__int__,
              torch.Tensor.__bool__, torch.Tensor.__index__, torch.Tensor.numpy)


class HostSyncError(RuntimeError):
    """A cuda tensor's values were read on the host (a device sync)."""


class CudaIndexing(TorchFunctionMode):
    """Tensor.__getitem__ / __setitem__ on fake cuda tensors, shape-checked on meta (see the module docstring);
    host reads of cuda tensors raise HostSyncError."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in HOST_READS and args[0].device.type == "cuda":
            raise HostSyncError(f"{func.__name__}() read a {tuple(args[0].shape)} cuda tensor on the host")
        if func is torch.Tensor.copy_ and args[0].device.type == "cuda":  # its binding takes a device guard too
            _meta(args[0]).copy_(_meta(args[1]))  # from the host: an explicit, staged input copy (allowed)
            return args[0]
        is_item = func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__)
        if not (is_item and args[0].device.type == "cuda"):
            return func(*args, **(kwargs or {}))
        target, index, device = args[0], args[1], args[0].device
        meta_index = _meta_index(index, device)
        if func is torch.Tensor.__getitem__:
            out = _meta(target)[meta_index]
            return torch.empty_strided(out.shape, out.stride(), dtype=out.dtype, device=device)
        value = args[2]
        if isinstance(value, torch.Tensor):
            if value.device != device and value.dim() > 0:
                raise RuntimeError(f"a tensor on {value.device} written into a tensor on {device}")
            value = _meta(value) if value.device == device else value
        _meta(target)[meta_index] = value
        return None


def _load_on_fake_cuda(mode: FakeTensorMode):
    """load_model's stand-in: read the checkpoint on the real CPU, then map every parameter to fake cuda:0."""

    def load(model_dir: str | Path, dtype: torch.dtype, device: torch.device, group: object = None):
        with torch._subclasses.fake_tensor.unset_fake_temporarily():
            model, config = load_model(model_dir, dtype, "cpu")
        for module in model.modules():
            for name, p in list(module._parameters.items()):
                if p is not None:
                    module._parameters[name] = torch.nn.Parameter(mode.from_tensor(p).to(CUDA), requires_grad=False)
            for name, value in list(vars(module).items()):  # host constants (rope inverse frequencies) stay on cpu
                if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
                    setattr(module, name, mode.from_tensor(value))
        return model, config

    return load


@dataclass
class Readbacks:
    """What reached the sampler's readback each step (device tensors), answered with a fixed token."""

    token: int = 5
    seen: list[SampledTokens] = field(default_factory=list)

    def __call__(self, sampled: SampledTokens) -> SampleResult:
        self.seen.append(sampled)
        seqs = sampled.batch.seqs
        tops = [{self.token: 0.0} if s.params.logprobs else None for s in seqs]
        return SampleResult([self.token] * len(seqs), [0.0] * len(seqs), tops, [0] * len(seqs))


def _reraise(exc: BaseException):
    raise exc


def _on_fake_cuda(mode: FakeTensorMode) -> Callable[[], AbstractContextManager]:
    def enter() -> AbstractContextManager:
        stack = ExitStack()
        stack.enter_context(mode)
        stack.enter_context(CudaIndexing())
        return stack

    return enter


@contextmanager
def fake_cuda_engine(model_dir: Path, monkeypatch: pytest.MonkeyPatch, **options) -> Iterator[tuple]:
    """(engine, on_device, readbacks): run add_request/step inside `with on_device():`; prepare prompts outside."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    on_device = _on_fake_cuda(mode)
    readbacks = Readbacks()
    # host tensors of 0 or 1 elements would otherwise be kept as real constants, and ops on them run for real
    # (on "cuda")
    monkeypatch.setattr(torch._subclasses.fake_tensor, "CONSTANT_NUMEL_LIMIT", -1)
    monkeypatch.setenv("MM_INFER_KERNELS", "torch")  # Triton cannot launch on fakes; its kernels have own tests
    monkeypatch.setattr(engine_module, "load_model", _load_on_fake_cuda(mode))
    monkeypatch.setattr(SampledTokens, "readback", lambda self: readbacks(self))
    monkeypatch.setattr(engine_module, "step_failure", _reraise)  # a device fault fails the test, not one request
    with on_device():
        engine = LLMEngine.from_options(str(model_dir), device="cuda:0", enforce_eager=True,
                                        **{"num_kv_blocks": 64, "dtype": "float32", **options})
    yield engine, on_device, readbacks
