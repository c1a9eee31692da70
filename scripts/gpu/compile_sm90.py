"""Compile the Triton kernels for an H100/H200 (sm_90) on any machine, at the shapes a 7B model and its vision tower
run, and read each compiled kernel's registers and local-memory spills (cuobjdump, shipped with Triton). Each
launcher runs on CPU tensors with its launch captured instead of run, so the arguments, constexprs and options are
exactly the launcher's own. Usage: python scripts/gpu/compile_sm90.py [--json OUT]; a JSON line per kernel, then
the worst spill LAST. Runs without TRITON_INTERPRET (set, the jit modules would be interpreter functions)."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.pop("TRITON_INTERPRET", None)
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from mm_infer_kernels import _triton  # noqa: E402

DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp64",
          torch.int32: "i32", torch.int64: "i64", torch.uint8: "u8", torch.int8: "i8", torch.bool: "i1"}
Launch = tuple[Any, tuple, dict]  # (the JITFunction or Autotuner, positional args, keyword args)


class _Captured:
    """Stands in for a jit module: kernel[grid](...) records the launch instead of running it."""

    def __init__(self, module: Any, launches: list[Launch]) -> None:
        self._module, self._launches = module, launches

    def __getattr__(self, name: str) -> Any:
        kernel, launches = getattr(self._module, name), self._launches

        class _Grid:
            def __getitem__(self, grid: Any) -> Callable[..., None]:
                return lambda *args, **kw: launches.append((kernel, args, kw))

        return _Grid()


def capture(run: Callable[[], Any]) -> list[Launch]:
    """The launches `run` makes, none of them run."""
    launches: list[Launch] = []
    real = _triton.load
    _triton.load = lambda name, *tensors: _Captured(importlib.import_module(f"mm_infer_kernels.{name}"), launches)
    try:
        run()
    finally:
        _triton.load = real
    return launches


def _arg_type(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return "*" + DTYPES[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2 ** 31) <= value < 2 ** 31 else "i64"
    return "fp32"


def compile_launch(kernel: Any, args: tuple, kw: dict) -> list[dict]:
    """Compile one captured launch for sm_90 (every config of an autotuned kernel); registers and spills of each."""
    import triton
    from triton.backends.compiler import GPUTarget

    tuned = hasattr(kernel, "configs")  # an Autotuner: its JITFunction is .fn (a JITFunction's .fn is Python's)
    configs = kernel.configs if tuned else [None]
    fn = kernel.fn if tuned else kernel
    out = []
    for cfg in configs:
        values = {**dict(zip(fn.arg_names, args, strict=False)), **kw, **(cfg.kwargs if cfg else {})}
        options = {k: values.pop(k) for k in ("num_warps", "num_stages", "enable_fp_fusion") if k in values}
        if cfg is not None:
            options.update(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        signature, constexprs = {}, {}
        for p in fn.params:
            value = values.get(p.name, p.default)
            if p.is_constexpr:
                signature[p.name], constexprs[p.name] = "constexpr", value
            else:
                signature[p.name] = _arg_type(value)
        compiled = triton.compile(triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs),
                                  target=GPUTarget("cuda", 90, 32), options=options)
        out.append({"kernel": fn.__name__, "config": cfg.kwargs if cfg else {}, **resources(compiled.asm["cubin"])})
    return out


def resources(cubin: bytes) -> dict[str, int]:
    """REG and LOCAL (spill bytes per thread) of the cubin's one function, from cuobjdump --dump-resource-usage."""
    import triton.backends.nvidia as nvidia

    tool = Path(nvidia.__file__).parent / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([str(tool), "--dump-resource-usage", f.name], capture_output=True, text=True,
                              check=True).stdout
    fields = dict(part.split(":") for line in text.splitlines() if "REG:" in line for part in line.split()
                  if ":" in part and part.split(":")[1].isdigit())
    return {"registers": int(fields["REG"]), "spill_bytes": int(fields["LOCAL"])}


def cases() -> dict[str, Callable[[], Any]]:
    """Each launcher at production shapes: a 7B LM (28 q heads, 4 KV heads, head dim 128, bf16) and Qwen2-VL's
    vision tower (448x448 frames, 1280 wide; rope over 16 heads of 80)."""
    from mm_infer_kernels import fused_patch_embed, paged_decode, paged_prefill, vision_rope

    bf16 = torch.bfloat16
    cache = torch.zeros(4, 4096, 128, dtype=bf16)
    tables = torch.zeros(8, 64, dtype=torch.int32)
    meta = torch.full((8,), 512, dtype=torch.int64)
    frames = torch.zeros(2, 448, 448, 3, dtype=torch.uint8)
    q_vis = torch.zeros(1024, 16, 80, dtype=bf16)
    return {
        "paged_decode": lambda: paged_decode.paged_decode_triton(
            torch.zeros(64, 28, 128, dtype=bf16), cache, cache, torch.zeros(64, 64, dtype=torch.int32),
            torch.full((64,), 1024, dtype=torch.int32), 16),
        "paged_prefill": lambda: paged_prefill.paged_prefill_triton(
            torch.zeros(8 * 512, 28, 128, dtype=bf16), cache, cache, tables, meta * torch.arange(8), meta, meta, 16,
            max_q=512),
        "patch_embed": lambda: fused_patch_embed.patch_embed_triton(frames,
                                                                    torch.zeros(1280, 3, 2, 14, 14, dtype=bf16)),
        "vision_rope": lambda: vision_rope.vision_rope_triton(q_vis, q_vis, torch.zeros(1024, 80),
                                                              torch.zeros(1024, 80)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = []
    for name, run in cases().items():
        for kernel, launch_args, kw in capture(run):
            for res in compile_launch(kernel, launch_args, kw):
                results.append({"case": name, **res})
                print(json.dumps(results[-1]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    worst = max(results, key=lambda r: r["spill_bytes"])
    print(f"worst spill: {worst['spill_bytes']} B in {worst['case']} ({worst['kernel']}, "
          f"{worst['registers']} registers)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
