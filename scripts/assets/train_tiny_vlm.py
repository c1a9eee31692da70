"""Train the tiny Qwen2-VL on the synthetic shapes tasks on CPU and save it as a full HF checkpoint.

Usage:
  python scripts/assets/train_tiny_vlm.py                       # -> assets/models/tiny-shapes-vl/ (3000 x 16 samples)
  python scripts/assets/train_tiny_vlm.py --out /tmp/shapes      # the same run elsewhere

3000 steps took 18 min on 2 shared, busy cores (0.25-0.9 s/step); ~0.25 s/step when the cores are free.
Answers stay at chance for a few hundred steps, colour is learnt first, then shape and count; the video
direction task clicks last (around step 2000). Fewer steps give a much weaker model.

The trainer is HF transformers' Qwen2VLForConditionalGeneration (loss on answer tokens only, with
mm_token_type_ids so M-RoPE is right); pixels come from mm_infer.media, so they are bit-identical to
what the engine feeds the model at inference. Everything is seeded: the same command gives the same weights
on the same torch build and thread count.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # the checkout: `scripts.*` imports as a package

from mm_infer.data import TASKS, ChatEncoder, make_sample  # noqa: E402
from mm_infer.data.batching import collate  # noqa: E402
from scripts.assets.make_tiny_checkpoint import (  # noqa: E402
    PRESETS,
    SPECIAL_TOKENS,
    build_hf_config,
    random_state_dict,
    write_processor_files,
    write_tokenizer_files,
)

TASK_WEIGHTS = {"colour": 0.1, "shape": 0.3, "count": 0.3, "direction": 0.3}
BASE_TOKENIZER = REPO / "assets" / "models" / "tiny-qwen2-vl" / "tokenizer.json"


def write_skeleton(out: Path, preset: str, rope_theta: float) -> dict:
    """Everything but the weights: config, generation config, tokenizer + chat template, preprocessor configs.

    rope_theta: M-RoPE base. With head_dim 32 and mrope_section [4, 6, 6], the (h, w) sections get the
    lowest frequencies; at Qwen's 1e6 they barely turn over a 4x4 token grid, so the LM can hardly tell
    where a token sits and spatial reasoning is left to the vision tower. A small base would change that.
    """
    spec = PRESETS[preset]
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer.from_file(str(BASE_TOKENIZER))
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    config = build_hf_config(spec, tok.get_vocab_size(), ids) | {"rope_theta": rope_theta}
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    gen = {"bos_token_id": ids["<|endoftext|>"], "pad_token_id": ids["<|endoftext|>"],
           "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]]}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    write_tokenizer_files(tok, out)
    write_processor_files(spec, out)
    return config


def legacy_name(name: str) -> str:
    """transformers 5 module names -> the legacy checkpoint names the tiny assets use (model.*, visual.*)."""
    if name.startswith("model.visual."):
        return name[len("model."):]
    if name.startswith("model.language_model."):
        return "model." + name[len("model.language_model."):]
    return name


def hf_name(name: str) -> str:
    """Inverse of legacy_name."""
    if name.startswith("visual."):
        return "model." + name
    if name.startswith("model."):
        return "model.language_model." + name[len("model."):]
    return name


def init_weights(model: torch.nn.Module, preset: str, vocab_size: int, seed: int) -> None:
    """make_tiny_checkpoint's seeded init (matrices N(0, 0.05)): wider than HF's 0.02, so the tiny vision
    tower's MLPs start out non-linear and shape/motion features are learnt far sooner."""
    state = {hf_name(k): v for k, v in random_state_dict(PRESETS[preset], vocab_size, seed).items()}
    model.load_state_dict(state, strict=True)


def save_weights(model: torch.nn.Module, out: Path) -> float:
    tensors = {legacy_name(k): v.detach().to(torch.float32).contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return (out / "model.safetensors").stat().st_size / 2**20


class TrainBatches(torch.utils.data.IterableDataset):
    """Collated training batches, step by step; each step's tasks and samples depend only on (seed, step)."""

    def __init__(self, model_dir: Path, seed: int, steps: int, batch_size: int, weights: dict[str, float]) -> None:
        self.model_dir, self.seed, self.steps, self.batch_size = model_dir, seed, steps, batch_size
        self.weights = weights

    def __iter__(self):
        torch.set_num_threads(1)
        enc = ChatEncoder.from_dir(self.model_dir)
        for step in range(self.steps):
            rng = np.random.default_rng([self.seed, step])
            probs = np.asarray(list(self.weights.values())) / sum(self.weights.values())
            tasks = rng.choice(list(self.weights), size=self.batch_size, p=probs)
            examples = [enc.encode(make_sample(self.seed, step * self.batch_size + j, str(t)))
                        for j, t in enumerate(tasks)]
            yield collate(examples, enc.tokenizer.pad_token_id)


def lr_at(step: int, steps: int, peak: float, warmup: int, decay_frac: float = 0.3) -> float:
    """Warmup, constant, then a linear decay to 5% over the last `decay_frac` of the steps."""
    if step < warmup:
        return peak * (step + 1) / warmup
    decay_start = int(steps * (1 - decay_frac))
    if step < decay_start:
        return peak
    return peak * (1 - 0.95 * (step - decay_start) / max(1, steps - decay_start))


def answer_logits(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits [N, V] at the N positions that predict an answer token, and those N target ids.

    The LM head runs only where the loss is taken: most positions are prompt and media.
    """
    labels = batch["labels"][:, 1:]  # [B, L-1]
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    hidden = model.model(**inputs).last_hidden_state[:, :-1]  # [B, L-1, H]
    keep = labels != -100
    return model.lm_head(hidden[keep]), labels[keep]


@torch.no_grad()
def answer_accuracy(model: torch.nn.Module, enc: ChatEncoder, seed: int, per_task: int) -> dict[str, float]:
    """Teacher-forced exact-answer accuracy per task (every answer token is the argmax) on held-out samples."""
    model.eval()
    acc = {}
    for task in TASKS:
        examples = [enc.encode(make_sample(seed, i, task)) for i in range(per_task)]
        batch = collate(examples, enc.tokenizer.pad_token_id)
        logits, targets = answer_logits(model, batch)
        hits = (logits.argmax(-1) == targets).split([len(e.answer_ids) for e in examples])
        acc[task] = sum(bool(h.all()) for h in hits) / len(examples)
    model.train()
    return acc


def train(args: argparse.Namespace) -> None:
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    write_skeleton(args.out, args.preset, args.rope_theta)
    enc = ChatEncoder.from_dir(args.out)
    model = Qwen2VLForConditionalGeneration(Qwen2VLConfig.from_pretrained(str(args.out))).float().train()
    if args.init_from is not None:
        state = load_file(str(args.init_from / "model.safetensors"))
        model.load_state_dict({hf_name(k): v for k, v in state.items()}, strict=True)
        print(f"continuing from {args.init_from}", flush=True)
    elif args.init == "tiny":
        init_weights(model, args.preset, model.get_input_embeddings().num_embeddings, args.seed)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f}M params; {args.steps} steps x {args.batch_size} samples", flush=True)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=args.lr)
    batches = TrainBatches(args.out, args.seed, args.steps, args.batch_size, args.task_weights)
    loader = torch.utils.data.DataLoader(batches, batch_size=None, num_workers=1, prefetch_factor=4)
    start, running = time.perf_counter(), 0.0
    for step, batch in enumerate(loader):
        logits, targets = answer_logits(model, batch)
        loss = torch.nn.functional.cross_entropy(logits, targets)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        running = loss.item() if step == 0 else 0.95 * running + 0.05 * loss.item()
        if (step + 1) % args.log_every == 0 or step == args.steps - 1:
            elapsed = time.perf_counter() - start
            print(f"step {step + 1}/{args.steps}  loss {running:.4f}  lr {opt.param_groups[0]['lr']:.2e}  "
                  f"{elapsed:.0f}s", flush=True)
        if args.eval_every and ((step + 1) % args.eval_every == 0 or step == args.steps - 1):
            acc = answer_accuracy(model, enc, args.seed + 1, args.eval_per_task)
            print("  held-out teacher-forced accuracy: " + "  ".join(f"{k} {v:.2f}" for k, v in acc.items()),
                  flush=True)
    size = save_weights(model, args.out)
    print(f"trained in {time.perf_counter() - start:.0f}s; wrote {args.out} ({size:.2f} MiB weights)")


def parse_weights(text: str) -> dict[str, float]:
    weights = {k: float(v) for k, v in (kv.split("=") for kv in text.split(","))}
    if unknown := set(weights) - set(TASKS):
        raise argparse.ArgumentTypeError(f"unknown tasks {sorted(unknown)}")
    return weights


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=REPO / "assets" / "models" / "tiny-shapes-vl")
    p.add_argument("--preset", default="tiny-qwen2-vl", choices=["tiny-qwen2-vl"])
    p.add_argument("--init-from", type=Path, help="start from this checkpoint's weights (a second stage)")
    p.add_argument("--task-weights", type=parse_weights, default=dict(TASK_WEIGHTS),
                   help="e.g. colour=0.1,shape=0.3,count=0.3,direction=0.3")
    p.add_argument("--init", choices=["tiny", "hf"], default="tiny",
                   help="tiny: make_tiny_checkpoint's N(0, 0.05) init; hf: transformers' N(0, 0.02)")
    p.add_argument("--rope-theta", type=float, default=1e6,
                   help="M-RoPE base (Qwen2-VL's 1e6); a small base (e.g. 10) lets the LM localize media tokens")
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads for the trainer; batches are built in one worker process alongside")
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--eval-every", type=int, default=250, help="0 disables the in-training held-out check")
    p.add_argument("--eval-per-task", type=int, default=32)
    train(p.parse_args())


if __name__ == "__main__":
    main()
