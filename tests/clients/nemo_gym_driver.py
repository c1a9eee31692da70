"""Run NeMo-Gym 0.4.0's real `responses_api_models/vllm_model` server against ours: a two-turn Responses rollout.

Runs in .peers/nemo-gym-venv. Usage: nemo_gym_driver.py OUR_BASE_URL MODEL_NAME IMAGE
The vllm_model app (its FastAPI routes, session middleware, Responses<->Chat converter and aiohttp client) is served
by uvicorn on a free port; the rollout posts to it over HTTP the way a NeMo-Gym agent does, with the previous
turn's output items (carrying their token ids) fed back as input. Prints one JSON line: both turns' responses.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

warnings.filterwarnings("ignore")

import httpx  # noqa: E402
import uvicorn  # noqa: E402
from nemo_gym.server_utils import ServerClient  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from responses_api_models.vllm_model import app as vllm_app  # noqa: E402
from responses_api_models.vllm_model.app import VLLMModel  # noqa: E402

QUESTIONS = ("What colour is the shape?", "How many shapes are there?")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve_vllm_model(base_url: str, model: str) -> tuple[uvicorn.Server, str]:
    """NeMo-Gym's policy model server from its own configs/vllm_model_for_training.yaml (token ids on), handed its
    global config the way `gym env start` hands it to a child server (the NEMO_GYM_CONFIG_* variables)."""
    port = _free_port()
    cfg = OmegaConf.load(Path(vllm_app.__file__).parent / "configs" / "vllm_model_for_training.yaml")
    cfg.policy_model.responses_api_models.vllm_model.host = "127.0.0.1"
    cfg.policy_model.responses_api_models.vllm_model.port = port
    glob = OmegaConf.merge(cfg, {"policy_base_url": f"{base_url}/v1", "policy_api_key": "none",
                                 "policy_model_name": model})
    os.environ["NEMO_GYM_CONFIG_DICT"] = OmegaConf.to_yaml(glob)
    os.environ["NEMO_GYM_CONFIG_PATH"] = "policy_model"
    config = VLLMModel.load_config_from_global_config()
    # its ServerClient only finds other Gym servers (resources, agents); a model-only rollout never calls it
    server = VLLMModel(config=config, server_client=ServerClient.model_construct())
    app = server.setup_webserver()
    server.setup_liveness(app)
    server.setup_exception_middleware(app)
    uv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=uv.run, daemon=True).start()
    deadline = time.monotonic() + 60
    while not uv.started:
        assert time.monotonic() < deadline, "the vllm_model server did not start"
        time.sleep(0.05)
    return uv, f"http://127.0.0.1:{port}"


def _user(parts: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": parts}


def rollout(gym_url: str, image_path: str) -> dict[str, Any]:
    """Turn 1 asks about an image; turn 2 sends turn 1's input and output items back plus a new question."""
    url = "data:image/png;base64," + base64.b64encode(open(image_path, "rb").read()).decode()
    first = [_user([{"type": "input_image", "image_url": url, "detail": "auto"},
                    {"type": "input_text", "text": QUESTIONS[0]}])]
    sampling = {"temperature": 0.0, "max_output_tokens": 8}
    with httpx.Client(base_url=gym_url, timeout=300) as http:  # keeps the session cookie, as Gym's client does
        t0 = time.perf_counter()
        r1 = http.post("/v1/responses", json={"input": first, **sampling})
        assert r1.status_code == 200, r1.text
        t1 = time.perf_counter()
        second = first + r1.json()["output"] + [_user([{"type": "input_text", "text": QUESTIONS[1]}])]
        r2 = http.post("/v1/responses", json={"input": second, **sampling})
        assert r2.status_code == 200, r2.text
        t2 = time.perf_counter()
    return {"turn1": r1.json(), "turn2": r2.json(), "turn2_input": second,
            "seconds": [round(t1 - t0, 3), round(t2 - t1, 3)]}


def main(argv: list[str]) -> None:
    base, model, image_path = argv
    uv, gym_url = _serve_vllm_model(base, model)
    try:
        result = rollout(gym_url, image_path)
    finally:
        uv.should_exit = True
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
