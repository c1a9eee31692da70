"""The `mm-infer serve` flags: our names, vLLM's names as aliases, and the value formats vLLM reads."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from mm_infer.sizes import parse_cli_bytes, parse_human_int

DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")  # vLLM's --dtype choices
MODALITIES = ("image", "video", "audio")  # audio: checkpoints with an audio tower
BLOCK_SIZES = (1, 8, 16, 32, 64, 128)  # vLLM's --block-size choices
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


def _typed(parse: Callable[[str], object], what: str) -> Callable[[str], object]:
    """An argparse type whose error names the format instead of the function."""
    def convert(value: str) -> object:
        try:
            return parse(value)
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"{value!r} is not {what} ({e})") from None
    convert.__name__ = what
    return convert


token_count = _typed(parse_human_int, "a token count: an integer, 32k = 32000 or 32K = 32768")
byte_count = _typed(parse_cli_bytes, "a size: 4G = 4 GiB, 4g = 4e9 (vLLM), 4GiB, 512MiB or bytes")


def model_len(value: str) -> int:
    """--max-model-len as vLLM reads it, except its 'auto' / -1 (fit to memory), which would move the limit."""
    if value.strip() == "-1" or value.strip().lower() == "auto":
        raise argparse.ArgumentTypeError("'auto' / -1 (the longest length the KV memory fits) is not supported: give "
                                         "a length, or leave the flag out for the checkpoint's max_position_embeddings")
    return token_count(value)  # type: ignore[return-value]


def _key_values(text: str) -> dict[str, object]:
    """vLLM's older 'image=4,video=1' form (keys lower-cased, a key given twice must agree)."""
    out: dict[str, object] = {}
    for item in text.split(","):
        parts = [part.strip().lower() for part in item.split("=")]
        if len(parts) != 2:
            raise argparse.ArgumentTypeError(f"{item!r}: each item should be MODALITY=COUNT")
        try:
            count = int(parts[1])
        except ValueError:
            raise argparse.ArgumentTypeError(f"{item!r}: the count is not an integer") from None
        if out.get(parts[0], count) != count:
            raise argparse.ArgumentTypeError(f"conflicting counts for {parts[0]!r}")
        out[parts[0]] = count
    return out


def limit_mm(value: str) -> dict[str, int] | None:
    """--limit-mm-per-prompt: '{"image": 4, "video": 1}' (JSON; a modality may be {"count": N, ...} as in newer vLLM,
    whose other keys only size its memory profiling) or 'image=4,video=1'. Empty: no limits."""
    text = value.strip()
    if not text:
        return None
    if text.startswith("{"):
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as e:
            raise argparse.ArgumentTypeError(f"not valid JSON: {e}") from None
    else:
        raw = _key_values(text)
    if not isinstance(raw, dict):
        raise argparse.ArgumentTypeError('expected a JSON object such as {"image": 4, "video": 1}')
    limits: dict[str, int] = {}
    for modality, count in raw.items():
        if isinstance(count, dict):
            if "count" not in count:
                continue  # vLLM: no count means the default (999), i.e. no limit worth enforcing
            count = count["count"]
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise argparse.ArgumentTypeError(f"{modality!r}: the limit must be a non-negative integer, got {count!r}")
        if modality not in MODALITIES:
            if count:
                raise argparse.ArgumentTypeError(f"{modality!r}: mm-infer serves {', '.join(MODALITIES)} only")
            continue
        limits[modality] = count
    return limits or None


def chat_template(value: str) -> str:
    """--chat-template: vLLM's rule: the file's text if VALUE opens as a file, else VALUE itself when it looks like
    a template (has '{', '}' or a newline); a path-like VALUE that cannot be read is an error."""
    try:
        return Path(value).read_text(encoding="utf-8")
    except (OSError, ValueError) as e:
        if not any(c in value for c in "{}\n"):
            raise argparse.ArgumentTypeError(f"{value!r} looks like a file path, but it cannot be read ({e})") from None
    return value


def generation_config(value: str) -> str:
    """--generation-config: 'auto' (the checkpoint's generation_config.json), 'vllm' (none) or a folder holding one."""
    if value in ("auto", "vllm"):
        return value
    if not (Path(value) / "generation_config.json").is_file():
        raise argparse.ArgumentTypeError(f"{value!r} is not 'auto', 'vllm' or a folder holding generation_config.json")
    return value


def weight_transfer_config(value: str) -> str:
    """--weight-transfer-config '{"backend": "nccl"}' (vLLM's JSON; gloo runs on CPU): the backend's name."""
    try:
        backend = json.loads(value).get("backend", "nccl")
    except (json.JSONDecodeError, AttributeError):
        raise argparse.ArgumentTypeError(f'{value!r} is not a JSON object such as {{"backend": "gloo"}}') from None
    if backend not in ("gloo", "nccl"):
        raise argparse.ArgumentTypeError(f"backend {backend!r} is not one of ['gloo', 'nccl']")
    return backend


# mm_infer.media.frame_sampling.SAMPLERS (not imported: torch)
VIDEO_SAMPLERS = ("hf", "vllm", "qwen", "qwen3", "hf_base")


def media_io_kwargs(value: str) -> tuple[tuple[str, float | int], ...]:
    """--media-io-kwargs '{"video": {"num_frames": 8}}' or '{"video": {"fps": 1}}' (vLLM's JSON): the server's
    video defaults, which a request's own media_io_kwargs / mm_processor_kwargs override."""
    try:
        raw = json.loads(value)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON: {e}") from None
    if not isinstance(raw, dict) or set(raw) - {"video"} or not isinstance(raw.get("video", {}), dict):
        raise argparse.ArgumentTypeError('expected {"video": {"fps": F}} or {"video": {"num_frames": N}}')
    video = raw.get("video", {})
    if unknown := sorted(set(video) - {"fps", "num_frames"}):
        raise argparse.ArgumentTypeError(f"unsupported video keys {unknown}: only fps and num_frames")
    if len(video) > 1:
        raise argparse.ArgumentTypeError("fps and num_frames are mutually exclusive: give one")
    for key, v in video.items():
        kind = (int, float) if key == "fps" else int
        if not isinstance(v, kind) or isinstance(v, bool) or v <= 0:
            what = "number" if key == "fps" else "integer"
            raise argparse.ArgumentTypeError(f"video.{key} must be a positive {what}")
    return tuple(sorted(video.items()))


def add_serve_flags(srv: argparse.ArgumentParser) -> None:
    """Every flag `mm-infer serve` reads itself (the vLLM flags it only accepts or refuses are in vllm_flags)."""
    _add_server_flags(srv)
    _add_media_flags(srv)
    _add_engine_flags(srv)
    _add_limit_flags(srv)


def _add_server_flags(srv: argparse.ArgumentParser) -> None:
    srv.add_argument("model", help="checkpoint folder in Hugging Face format")
    srv.add_argument("--host", default="127.0.0.1")
    srv.add_argument("--port", type=int, default=8000)
    srv.add_argument("--api-key", nargs="+", default=None,
                     help="require Authorization: Bearer <key> (default: $MM_INFER_API_KEY, then $VLLM_API_KEY)")
    srv.add_argument("--served-model-name", nargs="+", default=None,
                     help="name(s) the API answers to; the first is reported (default: the model folder's name)")
    srv.add_argument("--chat-template", type=chat_template, default=None, help="a template file, or the template")
    srv.add_argument("--trust-request-chat-template", action="store_true",
                     help="accepted (vLLM): a request's chat_template is always used")
    srv.add_argument("--generation-config", type=generation_config, default="auto",
                     help="default sampling parameters: auto (checkpoint), vllm (none) or a folder")
    srv.add_argument("--reasoning-parser", default=None, choices=["qwen3", "deepseek_r1", "think"])
    srv.add_argument("--tool-parser", "--tool-call-parser", dest="tool_parser", default=None,
                     choices=["hermes", "qwen", "qwen3_coder"])
    srv.add_argument("--tool-strict-level", default="auto", choices=["auto", "function", "parameter"],
                     help="tool-call grammar floor (vLLM's): auto holds arguments to a tool's schema only when it is "
                          "strict; function constrains the call envelope for tool_choice auto too; parameter also "
                          "holds every tool's arguments to its schema")
    srv.add_argument("--enable-auto-tool-choice", action="store_true",
                     help="accepted (vLLM): with a tool parser, tool_choice 'auto' is always on")
    srv.add_argument("--replicas", type=int, default=None,
                     help="run N engine replicas as Ray actors behind a cache-aware router (default: one in-process)")
    srv.add_argument("--engine-core", choices=["process", "thread"], default="process",
                     help="process (default, as vLLM): the engine core schedules, runs and samples in its own "
                          "process, restarted if it dies; thread: on a thread of the server process")
    srv.add_argument("--ray-address", default=None, help="Ray cluster to join with --replicas (default: a local Ray)")
    srv.add_argument("--log-level", "--uvicorn-log-level", dest="log_level", default="info", choices=LOG_LEVELS)
    srv.add_argument("--max-body-bytes", type=int, default=100 * 1024 * 1024)


def _add_media_flags(srv: argparse.ArgumentParser) -> None:
    srv.add_argument("--allowed-media-path", "--allowed-local-media-path", dest="allowed_media_path",
                     action="append", default=[], help="folder file:// URLs may read (repeatable)")
    srv.add_argument("--allow-private-media-urls", action="store_true", help="allow http(s) to private addresses")
    srv.add_argument("--media-fetch-timeout", type=float, default=10.0,
                     help="wall-clock seconds for one whole media download (connect, headers and body)")
    srv.add_argument("--max-media-bytes", type=int, default=64 * 1024 * 1024)
    srv.add_argument("--max-pixels", type=int, default=None, help="image max_pixels cap (default: checkpoint)")
    srv.add_argument("--video-max-pixels", type=int, default=None)
    srv.add_argument("--max-video-frames", type=int, default=768)
    srv.add_argument("--max-video-fps", type=float, default=None, help="cap on a request's fps (default 30)")
    srv.add_argument("--media-io-kwargs", type=media_io_kwargs, default=(),
                     help='video defaults, as vLLM takes them: \'{"video": {"num_frames": 8}}\' or fps instead')
    srv.add_argument("--video-sampler", default=None, choices=VIDEO_SAMPLERS,
                     help="frame rule (default: the checkpoint's HF video processor's; docs/video.md)")
    srv.add_argument("--mrope-after-video", default=None, choices=("hf", "vllm"),
                     help="where text positions resume after a video: hf (transformers 5, default) or vllm")
    srv.add_argument("--limit-mm-per-prompt", type=limit_mm, default=None,
                     help='most media items per request, \'{"image": 4, "video": 1}\' or image=4,video=1')
    srv.add_argument("--trust-request-mm-kwargs", action="store_true",
                     help="accepted (vLLM): requests may always set mm_processor_kwargs, under the server's caps")


def _add_engine_flags(srv: argparse.ArgumentParser) -> None:
    srv.add_argument("--dtype", default=None, choices=DTYPES)
    srv.add_argument("--seed", type=int, default=None)
    srv.add_argument("--device", default=None, help="auto, cpu, cuda or cuda:N")
    srv.add_argument("--max-model-len", type=model_len, default=None, help="32768, 32k (32000) or 32K (32768)")
    srv.add_argument("--max-num-seqs", type=int, default=None)
    srv.add_argument("--max-num-batched-tokens", type=token_count, default=None, help="token budget of one step")
    srv.add_argument("--long-prefill-token-threshold", type=token_count, default=None,
                     help="most prompt tokens one request prefills in a step (0: the step's budget)")
    srv.add_argument("--num-kv-blocks", "--num-gpu-blocks-override", dest="num_kv_blocks", type=int, default=None)
    srv.add_argument("--block-size", type=int, default=None, choices=BLOCK_SIZES, help="tokens per KV block (16)")
    srv.add_argument("--kv-cache-memory-bytes", type=byte_count, default=None,
                     help="KV pool size, e.g. 4GiB (default: on CUDA from --gpu-memory-utilization, on CPU 256MiB)")
    srv.add_argument("--gpu-memory-utilization", type=float, default=None,
                     help="fraction of the GPU this engine may use, KV pool included (default 0.9)")
    srv.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None,
                     help="reuse KV of shared prompt prefixes (default: on)")
    srv.add_argument("--state-snapshots", type=int, default=None,
                     help="hybrid models (Nemotron-H): recurrent-state snapshots kept for prefix hits and n-sample "
                          "forks, out of the KV budget (default: --max-num-seqs)")
    srv.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=None,
                     help="no CUDA graphs for decode steps")
    srv.add_argument("--tensor-parallel-size", "-tp", type=int, default=None,
                     help="ranks (one process and device each) the model is split over, Megatron-style (default 1)")
    srv.add_argument("--tp-deterministic", action=argparse.BooleanOptionalAction, default=None,
                     help="tensor parallelism: add the ranks' partial sums in rank order, so results do not depend "
                          "on the batch or the all-reduce algorithm")
    srv.add_argument("--batch-invariant", action="store_true",
                     help="a request's tokens and logprobs identical alone or in any batch (slower on CPU)")
    srv.add_argument("--enable-return-routed-experts", action=argparse.BooleanOptionalAction, default=None,
                     help="R3: every answer's choices carry routed_experts, the top-k experts of each token at every "
                          "layer (base64 .npy, as vLLM's); MoE models only")


def _add_limit_flags(srv: argparse.ArgumentParser) -> None:
    """Per-request limits, slow-client deadlines, shutdown and what refits and /metrics may touch."""
    srv.add_argument("--max-sequences-per-request", type=int, default=256, help="prompts x n in one request")
    srv.add_argument("--max-logprob-entries", type=token_count, default=1 << 20,
                     help="logprobs one answer may carry: n x new tokens x (1 + top logprobs), plus the prompt's "
                          "(1M = 1048576); past it a 400")
    srv.add_argument("--metrics-public", action="store_true", help="/metrics and /version without the API key")
    srv.add_argument("--body-timeout", type=float, default=30.0, help="seconds for a whole request body to arrive")
    srv.add_argument("--header-timeout", type=float, default=10.0,
                     help="seconds for request headers to arrive (slow clients are cut off)")
    srv.add_argument("--shutdown-timeout", type=float, default=30.0,
                     help="on SIGTERM, seconds in-flight requests get before they end with an error")
    srv.add_argument("--allowed-weights-path", action="append", default=[],
                     help="folder /update_weights_from_disk may read (default: the model folder's parent)")
    srv.add_argument("--weight-transfer-config", type=weight_transfer_config, default=None,
                     help='weights broadcast by a trainer: \'{"backend": "nccl"}\' (CUDA) or gloo (CPU)')
    srv.add_argument("--enable-sleep-mode", action="store_true", help="serve /sleep and /wake_up (vLLM's levels)")
    srv.add_argument("--template-workers", type=int, default=2,
                     help="subprocesses that render a request's own chat_template (each killable)")
    srv.add_argument("--template-timeout", type=float, default=5.0,
                     help="seconds a request's own chat_template may render (then its worker is killed: a 400)")
    srv.add_argument("--max-grammar-bytes", dest="max_grammar_bytes", type=byte_count, default=None,
                     help="largest structured-outputs spec (JSON schema, regex, EBNF) a request may send (256K)")
    srv.add_argument("--grammar-timeout", dest="grammar_timeout_s", type=float, default=None,
                     help="seconds a grammar may take to compile, off the step loop (30); past it a 400")
    srv.add_argument("--grammar-cache-bytes", type=byte_count, default=None,
                     help="memory kept for compiled grammars, least recently used dropped first (256M)")
