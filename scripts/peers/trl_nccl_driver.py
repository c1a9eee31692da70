"""TRL's NCCL weight sync, trainer side (runs in a CUDA venv with trl==1.16.0 and a CUDA vLLM): VLLMClient joins our
server's group (`init_communicator`), streams another checkpoint's weights (`update_model_params`), and generates.

Usage: trl_nccl_driver.py BASE_URL NEW_WEIGHTS_DIR PROMPT   (scripts/peers/trl_nccl_check.py runs it; one JSON line out)
HF transformers on the trainer's GPU (float32) is the oracle for what the server must generate after the update.
"""

from __future__ import annotations

import json
import sys
import time
import warnings

warnings.filterwarnings("ignore")

import torch  # noqa: E402
from transformers import AutoModelForImageTextToText  # noqa: E402
from trl.generation.vllm_client import VLLMClient  # noqa: E402

MAX_TOKENS = 8


def _greedy(client: VLLMClient, prompt: str) -> dict:
    return client.generate([prompt], n=1, temperature=0.0, max_tokens=MAX_TOKENS, logprobs=0,
                           generation_kwargs={"ignore_eos": True})


def _hf_greedy(model: torch.nn.Module, prompt_ids: list[int]) -> list[int]:
    model.generation_config.eos_token_id = None  # as ignore_eos: always MAX_TOKENS tokens
    ids = torch.tensor([prompt_ids], device="cuda:0")
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_TOKENS,
                             do_sample=False, pad_token_id=0)
    return out[0, len(prompt_ids):].tolist()


def main(base: str, new_weights: str, prompt: str) -> dict:
    client = VLLMClient(base_url=base, connection_timeout=120)
    version = lambda: client._get(f"{base}/weight_version")["weight_version"]  # noqa: E731
    before, v0 = _greedy(client, prompt), version()
    t0 = time.perf_counter()
    client.init_communicator(device=0)
    t1 = time.perf_counter()
    model = AutoModelForImageTextToText.from_pretrained(new_weights, dtype=torch.float32).to("cuda:0").eval()
    t2 = time.perf_counter()
    client.update_model_params(model)
    client.reset_prefix_cache()
    t3 = time.perf_counter()
    after, v1 = _greedy(client, prompt), version()
    hf = _hf_greedy(model, after["prompt_ids"][0])
    client.close_communicator()
    return {"before": before["completion_ids"][0], "after": after["completion_ids"][0], "hf": hf,
            "versions": [v0, v1], "num_tensors": sum(1 for _ in model.named_parameters()),
            "init_s": round(t1 - t0, 3), "update_s": round(t3 - t2, 3)}


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:4])), flush=True)
