"""Full-prompt logits, packed multi-sequence batches and decode positions against transformers."""

from __future__ import annotations

import pytest
import torch
from model_cases import CHECKPOINTS, PROMPTS, TOL, build_prompt, hf_inputs, max_diff, our_logits, our_positions

from mm_infer.models import DenseAttentionContext, load_model
from mm_infer.prompt.mrope import decode_positions


def prompt_for(cfg, name: str, seed: int = 0):
    seconds = [1.5] * sum(1 for p in PROMPTS[name] if isinstance(p, tuple) and p[0] == "video")
    return build_prompt(cfg, PROMPTS[name], seed=seed, seconds=seconds or None)


@pytest.mark.parametrize("name", sorted(PROMPTS))
@torch.no_grad()
def test_full_prompt_logits_match_hf(kind, ours, hf_model, record, name):
    model, cfg = ours
    prompt = prompt_for(cfg, name)
    ref = hf_model(**hf_inputs(cfg, prompt)).logits[0]
    got = our_logits(model, cfg, prompt)
    assert got.dtype == torch.float32 and got.shape == ref.shape
    assert record(f"{kind}/logits/{name}", max_diff(got, ref)) <= TOL


@torch.no_grad()
def test_logits_depend_on_mrope_positions(ours):
    """Sanity check of the oracle comparison: plain 1-D positions give clearly different logits."""
    model, cfg = ours
    prompt = prompt_for(cfg, "image_and_video")
    n = prompt.input_ids.numel()
    plain = model(prompt.input_ids, torch.arange(n).expand(3, n), prompt.pixel_values, prompt.image_grid_thw,
                  prompt.pixel_values_videos, prompt.video_grid_thw)
    assert max_diff(plain, our_logits(model, cfg, prompt)) > 1e-2


@torch.no_grad()
def test_packed_sequences_equal_each_alone(kind, ours, hf_model, record):
    """Three prompts concatenated through DenseAttentionContext give each prompt's own logits."""
    model, cfg = ours
    prompts = [prompt_for(cfg, n, seed=i) for i, n in enumerate(["one_image", "text_only", "image_and_video"])]
    embeds, positions, alone = [], [], []
    for p in prompts:
        e = model.embed_tokens(p.input_ids)
        for px, grid, tok in ((p.pixel_values, p.image_grid_thw, cfg.image_token_id),
                              (p.pixel_values_videos, p.video_grid_thw, cfg.video_token_id)):
            if px is not None:
                e[p.input_ids == tok] = model.encode_vision(px, grid)
        embeds.append(e)
        positions.append(our_positions(cfg, p)[0])
        alone.append(our_logits(model, cfg, p))
    ctx = DenseAttentionContext([p.input_ids.numel() for p in prompts])
    hidden = model.forward_hidden(torch.cat(embeds), torch.cat(positions, dim=1), ctx)
    packed = model.compute_logits(hidden).split(ctx.seq_lens)
    for got, want in zip(packed, alone, strict=True):
        assert record(f"{kind}/packed_vs_alone", max_diff(got, want)) <= 1e-5
    ref = hf_model(**hf_inputs(cfg, prompts[2])).logits[0]
    assert record(f"{kind}/packed_vs_hf", max_diff(packed[2], ref)) <= TOL


@torch.no_grad()
def test_greedy_decode_with_position_delta_matches_hf_generate(kind, ours, hf_model, record):
    """HF generate (KV cache, rope delta) vs our teacher-forced forward with decode_positions."""
    model, cfg = ours
    prompt = prompt_for(cfg, "image_and_video", seed=5)
    out = hf_model.generate(
        **hf_inputs(cfg, prompt), max_new_tokens=5, do_sample=False, output_logits=True,
        return_dict_in_generate=True, pad_token_id=0,
    )
    n = prompt.input_ids.numel()
    new = out.sequences[0, n:]
    positions, delta = our_positions(cfg, prompt)
    full_pos = torch.cat([positions, decode_positions(n, new.numel(), delta)], dim=1)
    ids = torch.cat([prompt.input_ids, new])
    logits = model(ids, full_pos, prompt.pixel_values, prompt.image_grid_thw,
                   prompt.pixel_values_videos, prompt.video_grid_thw)
    step_logits = logits[n - 1 : n - 1 + new.numel()]
    assert torch.equal(step_logits.argmax(-1), new)
    ref = torch.stack([s[0] for s in out.logits])
    assert record(f"{kind}/generate_step_logits", max_diff(step_logits, ref)) <= TOL


@torch.no_grad()
def test_bfloat16_loading_runs_close_to_float32(kind, ours):
    model32, cfg = ours
    model16, _ = load_model(CHECKPOINTS[kind], dtype=torch.bfloat16)
    assert {p.dtype for p in model16.parameters()} == {torch.bfloat16}
    prompt = prompt_for(cfg, "image_and_video")
    got = our_logits(model16, cfg, prompt)
    want = our_logits(model32, cfg, prompt)
    assert got.dtype == torch.float32 and torch.isfinite(got).all()
    assert max_diff(got, want) < 0.1 * want.abs().max().item()

