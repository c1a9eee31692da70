"""Drive TRL 1.16's real `VLLMClient` against a server; runs in .peers/trl-venv and prints one JSON line of results.

Usage: trl_driver.py BASE_URL MODEL_DIR IMAGE [SCENARIO ...]   (default: every scenario in SCENARIOS)
Each scenario's value (or its error, as `{"error": "Type: message"}`) lands under its name; nothing is compared
here: the pytest side holds the expectations, computed from mm-infer's own endpoints.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

warnings.filterwarnings("ignore")

from PIL import Image  # noqa: E402
from trl.generation.vllm_client import VLLMClient  # noqa: E402
from trl.generation.vllm_generation import VLLMGeneration  # noqa: E402

TEXT_PROMPTS = ["What colour is the shape?", "How many shapes are there?"]
TOKEN_PROMPT = [3001, 1419, 1483, 198, 56, 1356]
QUESTION = "What colour is the shape?"


def _image_conversation(image: Image.Image) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": QUESTION}]}]


def text(c: VLLMClient, ctx: SimpleNamespace) -> Any:
    return c.generate(TEXT_PROMPTS, n=2, temperature=0.0, max_tokens=6, logprobs=2)


def sampled(c: VLLMClient, ctx: SimpleNamespace) -> Any:
    return c.generate(TEXT_PROMPTS, n=3, temperature=1.0, top_k=50, max_tokens=6, logprobs=0,
                      generation_kwargs={"seed": 7})


def token_ids(c: VLLMClient, ctx: SimpleNamespace) -> Any:
    return c.generate([TOKEN_PROMPT], n=1, temperature=0.0, max_tokens=6, logprobs=1)


def chat_image(c: VLLMClient, ctx: SimpleNamespace) -> Any:
    return c.chat([_image_conversation(ctx.image)], n=1, temperature=0.0, max_tokens=6, logprobs=1)


def sequence_logprobs(c: VLLMClient, ctx: SimpleNamespace) -> Any:
    """Teacher logprobs over a greedy completion of the text scenario's first prompt (5 alternatives each)."""
    first = c.generate(TEXT_PROMPTS[:1], n=1, temperature=0.0, max_tokens=6, logprobs=0)
    seq = first["prompt_ids"][0] + first["completion_ids"][0]
    scored = c.get_sequence_logprobs([seq], [len(first["prompt_ids"][0])], top_logprobs=5)
    return {"generated": first, "scored": scored}


def sequence_logprobs_default_k(c: VLLMClient, ctx: SimpleNamespace) -> Any:
    return c.get_sequence_logprobs([TOKEN_PROMPT], [3])  # TRL's default: 100 alternatives per position


def reset_prefix_cache(c: VLLMClient, ctx: SimpleNamespace) -> Any:
    return c.reset_prefix_cache()


def weight_info(c: VLLMClient, ctx: SimpleNamespace) -> Any:
    return {"weight_transfer_config": c.get_server_info()["weight_transfer_config"],
            "world_size": c.get_world_size()}


def init_communicator_cpu(c: VLLMClient, ctx: SimpleNamespace) -> Any:
    return c.init_communicator(device="cpu")


def weight_update_bracket(c: VLLMClient, ctx: SimpleNamespace) -> Any:
    """TRL's `weight_update()` context (start, finish) with nothing streamed, then a generation on the other side."""
    bracket_error = None
    try:
        with c.weight_update():
            pass
    except Exception as e:  # noqa: BLE001 - the test reads it
        bracket_error = f"{type(e).__name__}: {e}"
    after = c.generate(TEXT_PROMPTS[:1], n=1, temperature=0.0, max_tokens=6, logprobs=0)
    return {"bracket_error": bracket_error, "after": after}


def multimodal_generate(c: VLLMClient, ctx: SimpleNamespace) -> Any:
    """GRPOTrainer's path: the trainer tokenizes (processor), the server renders features, TRL places them."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(ctx.model_dir)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
    text_prompt = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt_ids = processor(text=[text_prompt], images=[ctx.image], return_tensors=None)["input_ids"][0]
    features = c.image_features([[ctx.image]])
    trainer_side = SimpleNamespace(processing_class=processor)  # GRPOTrainer's processing_class is the processor
    placed = [VLLMGeneration._place_features(trainer_side, f, prompt_ids) for f in features]
    out = c.generate([prompt_ids], features=placed, n=2, temperature=0.0, max_tokens=6, logprobs=1)
    return {"trainer_prompt_ids": prompt_ids, **out}


SCENARIOS: dict[str, Callable[[VLLMClient, SimpleNamespace], Any]] = {
    f.__name__: f for f in (text, sampled, token_ids, chat_image, sequence_logprobs, sequence_logprobs_default_k,
                            reset_prefix_cache, weight_info, init_communicator_cpu, weight_update_bracket,
                            multimodal_generate)
}


def main(argv: list[str]) -> None:
    base, model_dir, image_path, *names = argv
    ctx = SimpleNamespace(model_dir=model_dir, image=Image.open(image_path).convert("RGB"))
    client = VLLMClient(base_url=base, connection_timeout=60)
    results: dict[str, Any] = {"model": client.model}
    for name in names or list(SCENARIOS):
        start = time.perf_counter()
        try:
            results[name] = {"value": SCENARIOS[name](client, ctx)}
        except Exception as e:  # noqa: BLE001 - reported to the test, which decides
            results[name] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-1500:]}
        results[name]["seconds"] = round(time.perf_counter() - start, 3)
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
