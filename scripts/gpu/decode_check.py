"""The decode section of engine_check.py: a 7B-shaped random LM's decode step, eager and graphed, vs HBM."""

from __future__ import annotations

import time
from typing import Any

import torch

from scripts.gpu.check_common import BLOCK, HBM_PEAK, Report, median_ms, say


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
    from mm_infer.models.qwen_vl import QwenVLModel

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


def decode_graphs(model: Any, batch: int, ctx: int, capture: bool) -> tuple[Any, Any]:
    """The engine's static decode path for one step of `batch` sequences at context `ctx` (new token included):
    a KV pool of contiguous tables plus the scratch block, and the bucket's filled device buffers."""
    from mm_infer.engine.runner.decode_graphs import DecodeBuffers, DecodeGraphs
    from mm_infer.engine.runner.paged_attention import KVCache

    text, dev = model.config.text, model.device
    nblk = -(-ctx // BLOCK)
    kv = KVCache.allocate(text.num_layers, batch * nblk + 1, BLOCK, text.num_kv_heads, text.head_dim,
                          model.dtype, dev)
    graphs = DecodeGraphs(model, kv, batch * nblk, nblk, batch, capture)
    buf = DecodeBuffers.allocate(batch, nblk, dev)
    buf.ids.copy_(torch.randint(0, text.vocab_size, (batch,), device=dev))
    buf.positions.fill_(ctx - 1)
    tables = torch.arange(batch * nblk, device=dev, dtype=torch.int32).view(batch, nblk)  # seq i: its own blocks
    buf.tables.copy_(tables)
    buf.slots.copy_(tables[:, (ctx - 1) // BLOCK].long() * BLOCK + (ctx - 1) % BLOCK)
    buf.lens.fill_(ctx)
    graphs.buffers[batch] = buf
    return graphs, buf


def time_step(model: Any, device: str, batch: int, ctx: int, graphed: bool) -> float:
    """Median ms of one decode step (embed, LM through paged decode attention, logits): CUDA events on CUDA."""
    graphs, buf = decode_graphs(model, batch, ctx, capture=graphed)
    if graphed:
        graph = graphs._capture(batch, buf)
        if graph is None:
            raise RuntimeError("CUDA graph capture failed (see the warning above)")
        return median_ms(graph.replay, device, events=True)
    return median_ms(lambda: graphs._forward(buf), device, events=True)


def decode_row(model: Any, device: str, batch: int, ctx: int, weight_bytes: int, bw: float) -> Report:
    """One (batch, context) size: eager and graphed ms per step, HBM floors (4.8 TB/s and copy bandwidth)."""
    text = model.config.text
    read = weight_bytes + batch * ctx * 2 * text.num_layers * text.num_kv_heads * text.head_dim * model.dtype.itemsize
    floor, floor_bw = read / HBM_PEAK * 1e3, read / bw * 1e3
    row: Report = {"batch": batch, "ctx": ctx, "bytes_read": read, "floor_ms": floor, "floor_copy_bw_ms": floor_bw}
    for mode in ("eager", "graphed") if device.startswith("cuda") else ("eager",):
        try:
            ms = time_step(model, device, batch, ctx, graphed=mode == "graphed")
            row |= {f"{mode}_ms": ms, f"{mode}_ratio": ms / floor, f"{mode}_ratio_copy_bw": ms / floor_bw}
            msg = (f"{ms:.2f} ms/step, floor {floor:.2f} ms (4.8 TB/s) / {floor_bw:.2f} ms (copy bw), "
                   f"ratio {ms / floor:.2f}x / {ms / floor_bw:.2f}x")
        except torch.cuda.OutOfMemoryError:
            row[f"{mode}_skipped"] = msg = "oom"
        except Exception as exc:  # noqa: BLE001 - one mode's failure is a figure, not the end of the section
            row[f"{mode}_error"] = msg = f"{type(exc).__name__}: {exc}"
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
        say(f"decode {mode} b={batch} ctx={ctx}", msg)
    return row


def decode_bench(device: str, quick: bool, deadline: float) -> Report:
    """7B-shaped random LM: decode ms per step, eager and CUDA-graphed, vs the HBM floor (weights + KV read once)."""
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
    return {"ok": any("eager_ms" in r for r in rows), "weight_bytes": weight_bytes, "copy_bw_Bps": bw,
            "steps": rows}
