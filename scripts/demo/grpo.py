"""A small GRPO loop on CPU: the engine samples, an HF transformers model trains, the engine is refitted.

Each step prints the mean reward and `token_mult_prob_error`, the mean over tokens of
exp(|rollout logprob - trainer logprob|), which must stay at or below 1.0001 in float32.

    .venv/bin/python scripts/demo/grpo.py --steps 6
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from mm_infer import LLM, SamplingParams
from mm_infer.data import IMAGE_TASKS, make_sample
from mm_infer.rl import RolloutRow, completion_logprobs, generate_rollouts, group_advantages, hf_inputs
from mm_infer.rl import token_mult_prob_error as tmpe

REPO = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = REPO / "assets" / "models" / "tiny-shapes-vl"
FALLBACK_MODEL = REPO / "assets" / "models" / "tiny-qwen2-vl"


def rows(step: int, prompts: int) -> list[RolloutRow]:
    """Image questions (colour, shape, count) generated for this step; ground truth is the short answer."""
    out = []
    for i in range(prompts):
        s = make_sample(1000 + step, i, IMAGE_TASKS[i % len(IMAGE_TASKS)])
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": s.question}]}]
        out.append(RolloutRow({"messages": messages, "multi_modal_data": {"image": [s.media]}}, s.answer))
    return out


def reward(text: str, answer: str) -> float:
    return 1.0 if text.strip().strip(".!").strip().lower() == answer else 0.0


def grpo_step(hf, optimizer, groups, pads: dict[str, int]) -> tuple[float, float]:
    """One policy-gradient update (on-policy, so the clipped ratio is 1). Returns (tmpe, loss)."""
    optimizer.zero_grad()
    rollout_lp, trainer_lp, total, n_tokens = [], [], 0.0, 0
    for group in groups:
        for sample, adv in zip(group.samples, group_advantages(group.rewards), strict=True):
            logits = hf(**hf_inputs(group.request, sample.token_ids, **pads)).logits
            lp = completion_logprobs(logits, sample.token_ids)  # [G] float32, differentiable
            rollout_lp.append(sample.logprobs)
            trainer_lp.append(lp.detach())
            if adv != 0.0:
                loss = -adv * lp.sum()
                loss.backward()
                total += float(loss.detach())
            n_tokens += len(sample.token_ids)
    for p in hf.parameters():
        if p.grad is not None:
            p.grad /= max(n_tokens, 1)
    optimizer.step()
    return tmpe(rollout_lp, trainer_lp), total / max(n_tokens, 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(DEFAULT_MODEL if DEFAULT_MODEL.exists() else FALLBACK_MODEL))
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--max-tokens", type=int, default=6)
    args = parser.parse_args()
    torch.manual_seed(0)
    from transformers import AutoModelForImageTextToText

    llm = LLM(args.model)
    hf = AutoModelForImageTextToText.from_pretrained(args.model, dtype=torch.float32)
    hf.train()
    optimizer = torch.optim.AdamW(hf.parameters(), lr=args.lr, weight_decay=0.0)
    ids = llm.engine.placeholder_ids
    pads = {"image_pad_id": ids.image_pad_id, "video_pad_id": ids.video_pad_id}
    print(f"model {args.model}: {args.prompts} prompts x n={args.n} per step, lr {args.lr}")
    print(f"{'step':>4} {'version':>7} {'mean_reward':>11} {'token_mult_prob_error':>21} {'tokens':>6} {'seconds':>7}")
    worst = 1.0
    for step in range(args.steps):
        t0 = time.perf_counter()
        params = SamplingParams(n=args.n, temperature=1.0, seed=step, max_tokens=args.max_tokens)
        groups = generate_rollouts(llm.engine, rows(step, args.prompts), reward, params, weight_version=step)
        error, _ = grpo_step(hf, optimizer, groups, pads)
        llm.engine.update_weights(((n, p.detach()) for n, p in hf.named_parameters()), version=step + 1)
        mean_reward = sum(sum(g.rewards) for g in groups) / sum(len(g.samples) for g in groups)
        tokens = sum(len(s.token_ids) for g in groups for s in g.samples)
        worst = max(worst, error)
        print(f"{step:>4} {step:>7} {mean_reward:>11.3f} {error:>21.7f} {tokens:>6} {time.perf_counter() - t0:>7.1f}")
    print(f"max token_mult_prob_error={worst:.7f} ({'ok' if worst <= 1.0001 else 'ABOVE 1.0001'})")
    return 0 if worst <= 1.0001 else 1


if __name__ == "__main__":
    sys.exit(main())
