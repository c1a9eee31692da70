"""Time weight-transfer rounds (gloo, one local engine) for a checkpoint: init, then 5 rounds per chunk size.

python scripts/bench/weight_transfer.py [MODEL_DIR]   (default: assets/models/tiny-qwen2-vl)"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from mm_infer.rl.weight_transfer import WeightTransferClient  # noqa: E402
from servers.openai.config import ServerConfig  # noqa: E402
from servers.openai.launch import BackgroundServer, free_port  # noqa: E402


def main() -> None:
    from transformers import AutoModelForImageTextToText

    ckpt = sys.argv[1] if len(sys.argv) > 1 else str(REPO / "assets" / "models" / "tiny-qwen2-vl")
    srv = BackgroundServer(ServerConfig(model_dir=ckpt, port=free_port(), weight_transfer_backend="gloo",
                                        engine_options={"num_kv_blocks": 64, "max_model_len": 512})).start()
    model = AutoModelForImageTextToText.from_pretrained(ckpt, dtype=torch.float32)
    try:
        for buffer in (1 << 20, 1 << 30):
            client = WeightTransferClient(srv.base_url, buffer_bytes=buffer)
            start = time.perf_counter()
            client.init()
            init_s = time.perf_counter() - start
            rounds = [client.send(model.named_parameters()) for _ in range(5)]
            ms = [r.seconds * 1e3 for r in rounds]
            print(f"chunks of {buffer >> 20} MiB: init {init_s:.2f} s; a round {min(ms):.0f}-{max(ms):.0f} ms for "
                  f"{rounds[0].num_tensors} tensors, {rounds[0].num_bytes / 2**20:.2f} MiB")
            client.close()
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
