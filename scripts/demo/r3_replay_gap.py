"""R3 on tiny Qwen3-VL-MoE: how many routing rows equal HF's router, and the replayed trainer's logprob gap.

Rolls out n=4 samples of a text and an image prompt with --enable-return-routed-experts, compares every returned row
with HF's router over prompt + completion (teacher-forced), then moves every router (a refit), rolls out again and
prints the largest |logprob| gap of an HF forward that replays the rollout's routing, and of one that does not.
Usage: python scripts/demo/r3_replay_gap.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[2]
CKPT = REPO / "assets" / "models" / "tiny-qwen3-vl-moe"
PROMPTS = [{"messages": [{"role": "user", "content": "def f(x): return x"}]},
           {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe it."}]}],
            "multi_modal_data": {"image": [str(REPO / "assets" / "media" / "images" / "photo.png")]}}]


def hf_router_rows(model, kw) -> np.ndarray:
    """HF's top-k per token and layer in one teacher-forced forward ([T, L, k], dense layers 0)."""
    layers = model.model.language_model.layers
    out = np.zeros((kw["input_ids"].shape[1], len(layers), 2), dtype=np.uint8)
    hooks = [layer.mlp.gate.register_forward_hook(lambda _m, _i, r, i=i: out.__setitem__((slice(None), i),
                                                                                          r[2].numpy()))
             for i, layer in enumerate(layers) if hasattr(layer.mlp, "gate")]
    model(**kw)
    for h in hooks:
        h.remove()
    return out


@torch.no_grad()
def main() -> None:
    sys.path.insert(0, str(REPO))
    from transformers import AutoModelForImageTextToText

    from mm_infer import LLM, SamplingParams
    from mm_infer.rl import completion_logprobs, hf_inputs, replayed_routing
    from mm_infer.rl.rollout import RolloutRow, generate_rollouts

    llm = LLM(str(CKPT), enable_return_routed_experts=True, batch_invariant=True, num_kv_blocks=256)
    hf = AutoModelForImageTextToText.from_pretrained(CKPT, dtype=torch.float32).eval()
    ids = llm.engine.placeholder_ids
    params = SamplingParams(n=4, temperature=1.0, seed=4, max_tokens=16)
    rows = equal = 0
    for group in generate_rollouts(llm.engine, [RolloutRow(p) for p in PROMPTS], lambda t, g: 0.0, params):
        for s in group.samples:
            kw = hf_inputs(group.request, s.token_ids, image_pad_id=ids.image_pad_id, video_pad_id=ids.video_pad_id)
            want = hf_router_rows(hf, kw)[:-1]
            rows += len(want)
            equal += int((want == s.routed_experts).all(axis=(1, 2)).sum())
    print(f"rows equal to HF's router: {equal}/{rows} (every MoE layer, top-2 ids in order)")
    old = {k: v.clone() for k, v in hf.state_dict().items()}
    moved = {k: v + 0.5 * torch.randn(v.shape, generator=torch.Generator().manual_seed(9))
             for k, v in old.items() if k.endswith("mlp.gate.weight")}
    llm.update_weights(list(moved.items()))
    gap = {"replayed": 0.0, "own routing, old routers": 0.0}
    for group in generate_rollouts(llm.engine, [RolloutRow(p) for p in PROMPTS], lambda t, g: 0.0, params):
        for s in group.samples:
            kw = hf_inputs(group.request, s.token_ids, image_pad_id=ids.image_pad_id, video_pad_id=ids.video_pad_id)
            got = torch.tensor(s.logprobs)
            hf.load_state_dict({**old, **moved})
            with replayed_routing(hf, s.routed_experts):
                lp = completion_logprobs(hf(**kw).logits, s.token_ids)
            gap["replayed"] = max(gap["replayed"], (lp - got).abs().max().item())
            hf.load_state_dict(old)  # a trainer that has not taken the refit: routers elsewhere
            lp = completion_logprobs(hf(**kw).logits, s.token_ids)
            gap["own routing, old routers"] = max(gap["own routing, old routers"], (lp - got).abs().max().item())
    for name, value in gap.items():
        print(f"max |logprob gap|, {name}: {value:.2e}")
    print(f"replayed logprob gap: {gap['replayed']:.2e}")


if __name__ == "__main__":
    main()
