"""A trainer process for the weight-transfer tests: perturb the tiny HF model, save it (the oracle), broadcast it.

python transfer_trainer.py BASE_URL OUT_DIR [--die-after N] [--buffer-bytes B] [--seed S] [--model DIR]
--die-after N: the process exits abruptly once N packed chunks were broadcast (a broadcast killed halfway)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
CKPT = REPO / "assets" / "models" / "tiny-qwen2-vl"
sys.path.insert(0, str(REPO))

from mm_infer.rl.weight_transfer import WeightTransferClient  # noqa: E402


def perturbed_model(seed: int, model_dir: Path = CKPT) -> torch.nn.Module:
    """The tiny checkpoint with every floating weight moved by N(0, 0.02) (seeded): different greedy outputs."""
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            p.add_(torch.randn(p.shape, generator=gen) * 0.02)
    return model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("base_url")
    ap.add_argument("out_dir")
    ap.add_argument("--die-after", type=int, default=None)
    ap.add_argument("--buffer-bytes", type=int, default=1 << 20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", type=Path, default=CKPT)
    args = ap.parse_args()
    model = perturbed_model(args.seed, args.model)
    model.save_pretrained(args.out_dir)
    client = WeightTransferClient(args.base_url, backend="gloo", buffer_bytes=args.buffer_bytes, timeout_s=60)
    world = client.init()
    if args.die_after is not None:
        group, sent = client.group, [0]
        real = group.broadcast

        def broadcast(tensor: torch.Tensor, src: int = 0) -> None:
            if sent[0] == args.die_after:
                print(json.dumps({"died_after_chunks": sent[0]}), flush=True)
                os._exit(17)  # no goodbye: the engines see the peer vanish mid-broadcast
            real(tensor, src)
            sent[0] += 1

        group.broadcast = broadcast
    report = client.send(model.named_parameters())
    print(json.dumps({"world_size": world, **report.__dict__}), flush=True)
    client.close()


if __name__ == "__main__":
    main()
