"""Engine-level GPU check: CPU/CUDA greedy parity, seeded n=8 groups, sampler timing, 7B-shaped decode vs HBM floor."""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MODELS = [REPO / "assets" / "models" / "tiny-qwen2-vl", REPO / "assets" / "models" / "tiny-qwen2.5-vl"]
IMAGE = str(REPO / "assets" / "media" / "shapes" / "colour_example.png")
HBM_PEAK = 4.8e12  # H200 HBM3e, bytes/s
BLOCK = 16
Report = dict[str, Any]


def say(name: str, value: object) -> None:
    print(f"{name}: {value}", flush=True)


def median_ms(fn: Callable[..., object], device: str, setup: Callable[[], object] | None = None,
              events: bool = False, warmup: int = 3, iters: int = 10) -> float:
    """Median ms of fn(setup()) (setup untimed), synchronised around each call; CUDA events when `events`."""
    cuda = device.startswith("cuda")
    events &= cuda
    times = []
    for i in range(warmup + iters):
        args = () if setup is None else (setup(),)
        if cuda:
            torch.cuda.synchronize()
        if events:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        fn(*args)
        if events:
            end.record()
        if cuda:
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(end) if events else (time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def prompts() -> list[dict[str, Any]]:
    chat = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour?"}]}]
    return [{"prompt": "The quick brown fox"}, {"prompt": "one two three"}, {"prompt": "Score these prompt tokens"},
            {"messages": chat, "multi_modal_data": {"image": [IMAGE]}}]


def generate(model_dir: Path, device: str, dtype: str, params: Any) -> list[Any]:
    from mm_infer import LLM

    llm = LLM(str(model_dir), device=device, dtype=dtype)
    return llm.generate(prompts(), params, use_tqdm=False)


def logprob_gap(a: Any, b: Any) -> float:
    """Max |logprob difference| of two samples up to and including their first differing token."""
    n = min(len(a.token_ids), len(b.token_ids))
    same = next((i for i in range(n) if a.token_ids[i] != b.token_ids[i]), n)
    return max((abs(x - y) for x, y in zip(a.logprobs[:same + 1], b.logprobs[:same + 1], strict=False)), default=0.0)


def parity(device: str) -> Report:
    """Greedy fp32 on CPU vs on `device` (ids equal, max |logprob diff|), then bf16 on `device` end to end."""
    from mm_infer import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    out: Report = {"ok": True}
    for model in MODELS:
        ref = generate(model, "cpu", "float32", params)
        got = generate(model, device, "float32", params)
        pairs = [(r.outputs[0], g.outputs[0]) for r, g in zip(ref, got, strict=True)]
        equal = sum(a.token_ids == b.token_ids for a, b in pairs)
        diff = max(logprob_gap(a, b) for a, b in pairs)
        bf16 = generate(model, device, "bfloat16", params)
        tokens = sum(len(o.outputs[0].token_ids) for o in bf16)
        agree = sum(o.outputs[0].token_ids == r.outputs[0].token_ids for o, r in zip(bf16, ref, strict=True))
        res = {"prompts": len(ref), "fp32_ids_equal": equal, "fp32_max_abs_logprob_diff": diff,
               "bf16_tokens": tokens, "bf16_prompts_equal_to_fp32": agree}
        out[model.name] = res
        out["ok"] &= equal == len(ref) and diff < 1e-3 and tokens == 24 * len(ref)
        say(f"parity {model.name} fp32 cpu vs {device}", f"ids equal {equal}/{len(ref)}, max|dlogprob| {diff:.3g}")
        say(f"parity {model.name} bf16 {device}", f"ran, {tokens} tokens, {agree}/{len(ref)} prompts equal fp32 ids")
    return out


def group(device: str) -> Report:
    """n=8 temperature-1 group twice with seed 0: distinct samples and same-seed reproducibility."""
    from mm_infer import LLM, SamplingParams

    params = SamplingParams(n=8, temperature=1.0, top_p=0.95, seed=0, max_tokens=32)
    llm = LLM(str(MODELS[0]), device=device, dtype="float32")
    runs = [[tuple(c.token_ids) for c in llm.generate([prompts()[3]], params, use_tqdm=False)[0].outputs]
            for _ in range(2)]
    distinct, same = len(set(runs[0])), runs[0] == runs[1]
    say(f"group n=8 T=1 {device}", f"ran, {distinct}/8 distinct samples, same seed reproduces ids: {same}")
    return {"ok": same and len(runs[0]) == 8, "samples": len(runs[0]), "distinct": distinct, "reproducible": same}


def make_seq(seed: int, prompt: list[int], output: list[int], **kw: Any) -> Any:
    from mm_infer import SamplingParams
    from mm_infer.engine.sequence import Sequence, SequenceGroup

    grp = SequenceGroup("r", SamplingParams(seed=seed, **kw), SimpleNamespace(placeholders=[], item_patches=[]))
    seq = Sequence(grp, prompt)
    seq.token_ids += output
    seq.seed = seed
    return seq


SAMPLER_CASES: dict[str, list[dict[str, Any]]] = {
    "greedy": [dict(temperature=0.0)],
    "t1_top_p0.9_top_k50": [dict(temperature=1.0, top_p=0.9, top_k=50)],
    "mixed_penalties_logprobs5": [
        dict(temperature=0.0, logprobs=5),
        dict(temperature=1.0, top_p=0.9, top_k=50, repetition_penalty=1.1, logprobs=5),
        dict(temperature=0.7, frequency_penalty=0.3, presence_penalty=0.2, logprobs=5),
        dict(temperature=1.0, min_p=0.05, repetition_penalty=1.05, logprobs=5, logprobs_mode="processed_logprobs"),
    ],
}


def sampler_bench(device: str, quick: bool) -> Report:
    """Sampler.sample + readback per step at [rows, vocab] float32 logits, per row mix; median ms."""
    from mm_infer.engine.sampler import Sampler

    rows, vocab = (8, 4096) if quick else (256, 152064)
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(rows, vocab, generator=gen) * 4).to(device)
    sampler = Sampler(never_sample=[vocab - 2, vocab - 1], eos_ids=[vocab - 3])
    out: Report = {"ok": True, "rows": rows, "vocab": vocab}
    for name, kinds in SAMPLER_CASES.items():
        seqs = [make_seq(i, torch.randint(0, vocab, (512,), generator=gen).tolist(),
                         torch.randint(0, vocab, (64,), generator=gen).tolist(), **kinds[i % len(kinds)])
                for i in range(rows)]
        ms = median_ms(lambda x, s=seqs: sampler.sample(x, s).readback(), device, setup=logits.clone)
        out[name] = ms
        say(f"sampler {rows}x{vocab} {name}", f"{ms:.2f} ms/step")
    return out


def lm_config(quick: bool) -> Any:
    """A Qwen2-VL-7B-shaped config (quick: 512 wide, 2 layers, vocab 4096)."""
    from mm_infer.models.config import parse_config

    text = dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                intermediate_size=18944, vocab_size=152064)
    vision = dict(depth=32, embed_dim=1280, num_heads=16, mlp_ratio=4, hidden_size=3584)
    if quick:
        text |= dict(hidden_size=512, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                     intermediate_size=1024, vocab_size=4096)
        vision |= dict(depth=1, embed_dim=64, num_heads=4, hidden_size=512)
    return parse_config(dict(
        architectures=["Qwen2VLForConditionalGeneration"], model_type="qwen2_vl", tie_word_embeddings=False,
        hidden_act="silu", rms_norm_eps=1e-6, rope_theta=1000000.0, use_sliding_window=False,
        rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24] if not quick else [8, 12, 12]},
        eos_token_id=151645, vision_config=dict(vision, in_channels=3, hidden_act="quick_gelu", patch_size=14,
                                                spatial_merge_size=2, temporal_patch_size=2), **text))


def random_model(quick: bool, device: str, dtype: torch.dtype) -> Any:
    """QwenVLModel built on meta, materialised on `device`, filled with N(0, 0.02) (norm weights 1)."""
    from mm_infer.models.loader import materialize
    from mm_infer.models.qwen2_vl import QwenVLModel

    with torch.device("meta"):
        model = QwenVLModel(lm_config(quick))
    materialize(model, dtype, device)
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=gen)
    return model.requires_grad_(False).eval()


def copy_bandwidth(device: str, quick: bool) -> float:
    """Achievable device-to-device copy bytes/s (read + write) on a large tensor."""
    src = torch.empty((64 if quick else 4096) << 20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), device, events=True)
    return 2 * src.numel() / (ms / 1e3)


def decode_inputs(model: Any, batch: int, ctx: int) -> tuple[Any, torch.Tensor, torch.Tensor, Any]:
    """KV cache + one decode step of `batch` sequences at context `ctx` (new token included), contiguous tables."""
    from mm_infer.engine.paged_attention import DecodeGroup, KVCache, PagedAttentionContext

    text, dev = model.config.text, model.device
    lpad = DecodeGroup.bucket(ctx, BLOCK)
    kv = KVCache.allocate(text.num_layers, batch * lpad // BLOCK, BLOCK, text.num_kv_heads, text.head_dim,
                          model.dtype, dev)
    slots = torch.arange(batch * lpad, device=dev).view(batch, lpad)  # seq i owns blocks [i*nblk, (i+1)*nblk)
    pad = (torch.arange(lpad, device=dev) >= ctx)[None, :].expand(batch, lpad).contiguous()
    grp = DecodeGroup(torch.arange(batch, device=dev), slots.masked_fill(pad, 0).reshape(-1), pad)
    attn = PagedAttentionContext(kv, slots[:, ctx - 1].contiguous(), torch.empty(0, dtype=torch.long, device=dev),
                                 [], [grp])
    ids = torch.randint(0, text.vocab_size, (batch,), device=dev)
    positions = torch.full((3, batch), ctx - 1, dtype=torch.long, device=dev)
    return kv, ids, positions, attn


def time_step(model: Any, device: str, batch: int, ctx: int) -> float:
    """Median ms of one eager decode step (embed, LM through paged attention, logits): CUDA events on CUDA."""
    kv, ids, positions, attn = decode_inputs(model, batch, ctx)

    def step() -> torch.Tensor:
        with torch.inference_mode():
            return model.compute_logits(model.forward_hidden(model.embed_tokens(ids), positions, attn))

    return median_ms(step, device, events=True)


def decode_row(model: Any, device: str, batch: int, ctx: int, weight_bytes: int, bw: float) -> Report:
    """One (batch, context) size: eager ms per step, HBM floors (4.8 TB/s and measured copy bandwidth), ratios."""
    text = model.config.text
    read = weight_bytes + batch * ctx * 2 * text.num_layers * text.num_kv_heads * text.head_dim * model.dtype.itemsize
    row: Report = {"batch": batch, "ctx": ctx, "bytes_read": read}
    try:
        ms = time_step(model, device, batch, ctx)
        floor, floor_bw = read / HBM_PEAK * 1e3, read / bw * 1e3
        row |= {"eager_ms": ms, "floor_ms": floor, "floor_copy_bw_ms": floor_bw, "ratio": ms / floor,
                "ratio_copy_bw": ms / floor_bw}
        msg = (f"{ms:.2f} ms/step, floor {floor:.2f} ms (4.8 TB/s) / {floor_bw:.2f} ms (copy bw), "
               f"ratio {ms / floor:.1f}x / {ms / floor_bw:.1f}x")
    except torch.cuda.OutOfMemoryError:
        row["skipped"] = msg = "oom"
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    say(f"decode eager b={batch} ctx={ctx}", msg)
    return row


def decode_bench(device: str, quick: bool, deadline: float) -> Report:
    """7B-shaped random LM: eager decode ms per step vs the HBM floor (weights + KV read once per step)."""
    model = random_model(quick, device, torch.float32 if device == "cpu" else torch.bfloat16)
    text = model.config.text
    weight_bytes = sum(p.numel() * p.element_size() for n, p in model.named_parameters()
                       if not n.startswith(("visual.", "language.embed_tokens")))  # embedding: only N rows read
    bw = copy_bandwidth(device, quick)
    say("decode model", f"{text.num_layers} layers, hidden {text.hidden_size}, {model.dtype}, "
                        f"{weight_bytes / 1e9:.2f} GB weights read/step, copy bandwidth {bw / 1e9:.0f} GB/s")
    rows = []
    for ctx in ((128, 256) if quick else (1024, 2048)):
        for batch in ((1, 4) if quick else (1, 16, 64, 256)):
            if time.monotonic() > deadline:
                rows.append({"batch": batch, "ctx": ctx, "skipped": "time budget"})
                say(f"decode eager b={batch} ctx={ctx}", "skipped (time budget)")
            else:
                rows.append(decode_row(model, device, batch, ctx, weight_bytes, bw))
    say("decode graphed", "not implemented (enforce_eager only)")
    return {"ok": any("eager_ms" in r for r in rows), "weight_bytes": weight_bytes, "copy_bw_Bps": bw,
            "graphed": "not implemented", "steps": rows}


def run_section(name: str, fn: Callable[[], Report], report: Report, json_path: Path | None,
                deadline: float) -> None:
    """Run one section; a failure is recorded (and printed) without stopping the others; JSON rewritten after."""
    start = time.monotonic()
    try:
        report[name] = fn() if start < deadline else {"ok": False, "error": "skipped: time budget spent"}
    except Exception as exc:  # noqa: BLE001 - each section reports its own failure
        traceback.print_exc()
        report[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    if "error" in report[name]:
        say(f"{name} FAILED", report[name]["error"])
    report[name]["seconds"] = round(time.monotonic() - start, 2)
    gc.collect()  # drop the section's engines and tensors before the next one allocates
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    if json_path:
        json_path.write_text(json.dumps(report, indent=1) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (runs on a CPU in well under a minute)")
    parser.add_argument("--json", type=Path, help="write every figure here (rewritten after each section)")
    parser.add_argument("--budget", type=float, default=220.0, help="seconds; later decode sizes are skipped after")
    args = parser.parse_args()
    deadline = time.monotonic() + args.budget
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        say("gpu_engine_check", "CUDA requested but not available")
        return 2
    env = {"torch": torch.__version__, "device": args.device, "quick": args.quick,
           "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None}
    say("env", env)
    report: Report = {"env": env}
    sections: dict[str, Callable[[], Report]] = {
        "parity": lambda: parity(args.device),
        "group": lambda: group(args.device),
        "sampler": lambda: sampler_bench(args.device, args.quick),
        "decode": lambda: decode_bench(args.device, args.quick, deadline),
    }
    for name, fn in sections.items():
        run_section(name, fn, report, args.json, deadline)
    failed = [n for n in sections if not report[n].get("ok")]
    report["summary"] = {"ok": not failed, "failed": failed, "seconds": round(args.budget - deadline
                                                                                + time.monotonic(), 1)}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    say("summary", f"{'all sections ok' if not failed else 'FAILED: ' + ', '.join(failed)} "
                   f"in {report['summary']['seconds']} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
