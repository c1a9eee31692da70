"""Sampling defaults from a generation_config.json, as vLLM's --generation-config: "auto", "vllm" or a folder."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from mm_infer.engine.sampling.params import SamplingParams

log = logging.getLogger("mm_infer.server")

# generation_config.json keys vLLM reads (max_new_tokens becomes max_tokens); the rest (do_sample, ...) are ignored
KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_new_tokens")
BUILTIN = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0}


def load_generation_defaults(setting: str, model_dir: str | Path) -> dict[str, Any]:
    """The defaults a request's missing sampling fields take: none for "vllm", the checkpoint's for "auto"
    (none if it has no generation_config.json), else DIR/generation_config.json (which must exist)."""
    if setting == "vllm":
        return {}
    path = Path(model_dir if setting == "auto" else setting) / "generation_config.json"
    if not path.is_file():
        if setting == "auto":
            return {}
        raise ValueError(f"generation_config {setting!r}: {path} does not exist")
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"generation_config: {path} is not readable JSON: {e}") from None
    out = {k: raw[k] for k in KEYS if isinstance(raw, dict) and raw.get(k) is not None}
    if "max_new_tokens" in out:
        out["max_tokens"] = out.pop("max_new_tokens")
    try:
        SamplingParams(**out)  # a bad default fails at start-up, not in every request
    except (TypeError, ValueError) as e:
        raise ValueError(f"generation_config: {path} has unusable sampling defaults: {e}") from None
    return out


def log_generation_defaults(setting: str, defaults: dict[str, Any]) -> None:
    if defaults:
        log.warning("sampling defaults from generation_config (%s) apply to requests that leave them out: %s "
                    "(serve with generation_config='vllm' for none)", setting, defaults)
    else:
        log.info("no generation_config sampling defaults (%s): temperature 1.0, top_p 1.0, ...", setting)


def sampling_value(name: str, given: Any, defaults: dict[str, Any]) -> Any:
    """The request's value, else the generation config's, else the built-in default."""
    if given is not None:
        return given
    return defaults.get(name, BUILTIN[name])


def max_tokens_cap(requested: int | None, defaults: dict[str, Any]) -> int | None:
    """vLLM's rule: the generation config's max_tokens caps the request's (and stands in when it gives none)."""
    cap = defaults.get("max_tokens")
    if cap is None:
        return requested
    return cap if requested is None else min(requested, cap)
