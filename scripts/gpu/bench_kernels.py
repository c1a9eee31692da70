"""Times each mm_infer_kernels/ op against its torch reference on CUDA: ms, GB/s and fraction of peak bandwidth."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

# HBM peak GB/s by device-name substring, most specific first.
PEAK_GBPS = [("H200", 4800.0), ("H100 NVL", 3900.0), ("H100 PCIe", 2000.0), ("H100", 3350.0),
             ("A100-SXM4-80GB", 2039.0), ("A100 80GB PCIe", 1935.0), ("A100", 1555.0)]


@dataclass
class Result:
    op: str
    case: str
    impl: str
    ms: float
    gbps: float
    peak_frac: float | None
    tflops: float | None = None


def peak_gbps(name: str, override: float | None) -> float | None:
    """Device HBM peak from --peak-gbps or the name table; None when unknown."""
    if override:
        return override
    return next((gbps for key, gbps in PEAK_GBPS if key in name), None)


def time_ms(fn: Callable[[], object]) -> float:
    """Median milliseconds per call (triton.testing.do_bench: warm-up, L2 flush between runs)."""
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median"))


def measure(op: str, case: str, impls: dict[str, Callable[[], object]], nbytes: int, peak: float | None,
            flops: int = 0) -> list[Result]:
    out = []
    for impl, fn in impls.items():
        ms = time_ms(fn)
        gbps = nbytes / ms / 1e6
        out.append(Result(op, case, impl, ms, gbps, gbps / peak if peak else None,
                          flops / ms / 1e9 if flops else None))
    return out


def frames_batch(sizes: list[tuple[int, int, int]]) -> list[torch.Tensor]:
    return [torch.randint(0, 256, (t, h, w, 3), dtype=torch.uint8, device="cuda") for t, h, w in sizes]


def bench_patchify(peak: float | None) -> list[Result]:
    from mm_infer_kernels import fused_patchify as pf
    from mm_infer_kernels.dispatch import pack_frames

    res = []
    for case, sizes in [("16 images 448x448", [(1, 448, 448)] * 16), ("video 32x336x588", [(32, 336, 588)])]:
        buf, offs, thw = pack_frames(frames_batch(sizes))
        rows = sum(pf.QWEN2_VL.grid(s)[0] * (s[1] // 14) * (s[2] // 14) for s in thw)
        for dtype in (torch.float32, torch.bfloat16):
            nbytes = buf.numel() + rows * 1176 * dtype.itemsize
            res += measure("patchify", f"{case} {str(dtype)[6:]}", {
                "triton": partial(pf.patchify_packed_triton, buf, offs, thw, out_dtype=dtype),
                "torch": partial(pf.patchify_packed_reference, buf, offs, thw, out_dtype=dtype),
            }, nbytes, peak)
    return res


def bench_patch_embed(peak: float | None) -> list[Result]:
    from mm_infer_kernels import fused_patch_embed as pe
    from mm_infer_kernels.dispatch import pack_frames

    res, d = [], 1280
    for case, sizes in [("16 images 448x448", [(1, 448, 448)] * 16), ("video 32x336x588", [(32, 336, 588)])]:
        buf, offs, thw = pack_frames(frames_batch(sizes))
        rows = sum(((t + 1) // 2) * (h // 14) * (w // 14) for t, h, w in thw)
        w = torch.randn(d, 3, 2, 14, 14, device="cuda", dtype=torch.bfloat16) * 0.02
        nbytes = buf.numel() + w.numel() * 2 + rows * d * 2
        res += measure("patch_embed", f"{case} D={d} bf16", {
            "triton": partial(pe.patch_embed_packed_triton, buf, offs, thw, w),
            "2pass": partial(pe.patch_embed_two_pass_triton, buf, offs, thw, w),
            "torch": partial(pe.patch_embed_packed_reference, buf, offs, thw, w),
        }, nbytes, peak, flops=2 * rows * 1176 * d)
    return res


def bench_rope(peak: float | None) -> list[Result]:
    from mm_infer_kernels import vision_rope as vr

    grid = [[1, 32, 32]] * 16  # 16384 patches
    cos, sin = vr.vision_rope_cos_sin(grid, 80, device="cuda")
    qkv = torch.randn(cos.shape[0], 3, 16, 80, device="cuda", dtype=torch.bfloat16)
    q, k, _ = qkv.unbind(1)
    nbytes = 4 * q.numel() * 2 + 2 * cos.numel() * 4
    return measure("vision_rope", "S=16384 H=16 Dh=80 bf16 (qkv views)", {
        "triton": lambda: vr.vision_rope_triton(q, k, cos, sin),
        "torch": lambda: vr.vision_rope_reference(q, k, cos, sin),
    }, nbytes, peak)


def bench_patch_merge(peak: float | None) -> list[Result]:
    from mm_infer_kernels import patch_merge as pm

    grid = [[1, 32, 32]] * 16
    x = torch.randn(16 * 1024, 1280, device="cuda", dtype=torch.bfloat16)
    return measure("patch_merge", "S=16384 D=1280 bf16", {
        "triton": lambda: pm.patch_merge_triton(x, grid),
        "torch": lambda: pm.patch_merge_reference(x, grid),
    }, 2 * x.numel() * 2, peak)


def bench_encoder(peak: float | None, depth: int) -> list[Result]:
    """Whole Qwen2-VL-2B-sized vision tower (random weights, bf16), fed by torch vs Triton patchify."""
    try:
        from mm_infer.models.config import VisionConfig
        from mm_infer.models.vision import Qwen2VisionTower
    except ImportError as e:
        print(f"encoder: skipped ({e})")
        return []
    from mm_infer_kernels import fused_patchify as pf
    from mm_infer_kernels.dispatch import grid_thw, pack_frames

    cfg = VisionConfig(kind="qwen2_vl", depth=depth, embed_dim=1280, num_heads=16, mlp_hidden=5120,
                       hidden_act="quick_gelu", out_dim=1536)
    tower = Qwen2VisionTower(cfg).to("cuda", torch.bfloat16).eval()
    for p in tower.parameters():
        torch.nn.init.normal_(p, std=0.02)
    buf, offs, thw = pack_frames(frames_batch([(1, 448, 448)] * 4))
    grid = grid_thw(thw).cuda()

    def run(fn: Callable) -> Callable[[], object]:
        def call() -> object:
            with torch.no_grad():
                return tower(fn(buf, offs, thw, out_dtype=torch.bfloat16), grid)
        return call

    return measure("encoder", f"4 images 448x448 depth={depth} bf16", {
        "triton": run(pf.patchify_packed_triton), "torch": run(pf.patchify_packed_reference),
    }, buf.numel(), peak)


def _paged_case(seqs: int, ctx: int, hkv: int, d: int, block: int = 16):
    """bf16 caches [Hkv, slots, D] with each sequence's blocks shuffled, and int32 block tables [B, ctx/block]."""
    nblk = seqs * (ctx // block)
    k, v = (torch.randn(hkv, nblk * block, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    tables = torch.randperm(nblk, device="cuda").view(seqs, ctx // block).to(torch.int32)
    return k, v, tables


def bench_attention(peak: float | None) -> list[Result]:
    """Paged decode (one query per sequence) and prefill (chunks over cached prefixes), Qwen2.5-7B heads."""
    from mm_infer_kernels import paged_decode as pd
    from mm_infer_kernels import paged_prefill as pp

    hq, hkv, d, block = 28, 4, 128, 16
    seqs, ctx = 64, 2048
    k, v, tables = _paged_case(seqs, ctx, hkv, d, block)
    q = torch.randn(seqs, hq, d, device="cuda", dtype=torch.bfloat16)
    lens = torch.full((seqs,), ctx, device="cuda")
    res = measure("paged_decode", f"B={seqs} ctx={ctx} Hq={hq} Hkv={hkv} bf16", {
        "triton": partial(pd.paged_decode_triton, q, k, v, tables, lens, block),
        "torch": partial(pd.paged_decode_reference, q, k, v, tables, lens, block),
    }, 2 * k.numel() * 2 + 2 * q.numel() * 2, peak)
    chunks, new, total = 8, 512, 1536  # 512 new tokens each over 1024 cached ones
    k, v, tables = _paged_case(chunks, total, hkv, d, block)
    q = torch.randn(chunks * new, hq, d, device="cuda", dtype=torch.bfloat16)
    starts = torch.arange(chunks, device="cuda") * new
    q_lens, ctx_lens = (torch.full((chunks,), n, device="cuda") for n in (new, total))
    flops = 4 * chunks * hq * d * sum(total - new + i + 1 for i in range(new))
    res += measure("paged_prefill", f"{chunks}x{new} new over {total - new} cached bf16", {
        "triton": partial(pp.paged_prefill_triton, q, k, v, tables, starts, q_lens, ctx_lens, block, new),
        "torch": partial(pp.paged_prefill_reference, q, k, v, tables, starts, q_lens, ctx_lens, block),
    }, 2 * k.numel() * 2 + 2 * q.numel() * 2, peak, flops=flops)
    return res


def report(results: list[Result]) -> float:
    """Print a table and return the geometric-mean torch/triton speedup over all cases."""
    print(f"{'op':<12} {'case':<44} {'impl':<7} {'ms':>9} {'GB/s':>8} {'%peak':>6} {'TFLOP/s':>8}")
    for r in results:
        frac = f"{100 * r.peak_frac:5.1f}%" if r.peak_frac is not None else "    -"
        tf = f"{r.tflops:8.1f}" if r.tflops is not None else "       -"
        print(f"{r.op:<12} {r.case:<44} {r.impl:<7} {r.ms:9.4f} {r.gbps:8.1f} {frac:>6} {tf}")
    pairs = {}
    for r in results:
        pairs.setdefault((r.op, r.case), {})[r.impl] = r.ms
    ratios = [p["torch"] / p["triton"] for p in pairs.values() if "torch" in p and "triton" in p]
    for (op, case), p in pairs.items():
        others = "".join(f", torch/{k} = {p['torch'] / v:.2f}x" for k, v in p.items() if k not in ("torch", "triton"))
        print(f"speedup {op:<12} {case:<44} torch/triton = {p['torch'] / p['triton']:.2f}x{others}")
    return math.exp(sum(math.log(x) for x in ratios) / len(ratios)) if ratios else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--peak-gbps", type=float, default=None, help="device HBM peak (default: from the name)")
    ap.add_argument("--encoder-depth", type=int, default=32, help="vision tower depth; 0 skips the encoder")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_kernels needs CUDA (Triton kernels are timed on a GPU); nothing to do on this machine")
        return 0
    name = torch.cuda.get_device_name()
    peak = peak_gbps(name, args.peak_gbps)
    print(f"device: {name}, peak {peak or 'unknown'} GB/s")
    results = bench_patchify(peak) + bench_patch_embed(peak) + bench_rope(peak) + bench_patch_merge(peak)
    try:
        results += bench_attention(peak)
    except Exception as e:  # untimed on a GPU until a device run: keep the rest of the bench
        print(f"attention: skipped ({type(e).__name__}: {e})")
    if args.encoder_depth > 0:
        try:
            results += bench_encoder(peak, args.encoder_depth)
        except Exception as e:  # the tower belongs to mm_infer.models and may change under us
            print(f"encoder: skipped ({type(e).__name__}: {e})")
    geo = report(results)
    if args.json:
        args.json.write_text(json.dumps({"device": name, "peak_gbps": peak,
                                         "results": [asdict(r) for r in results]}, indent=1))
    cases = len({(r.op, r.case) for r in results})
    print(f"ratio torch/triton (geomean speedup over {cases} cases): {geo:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
