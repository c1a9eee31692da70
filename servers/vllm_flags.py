"""vLLM launch lines for `mm-infer serve`: --config YAML, vLLM's spellings, and the vLLM flags we only accept
(no effect on outputs, a warning at start-up) or refuse (they would change outputs; the server does not start)."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

ONE_DEVICE = "mm-infer splits a model by --tensor-parallel-size only (use --replicas N for N engines)"

# vLLM flags that do not change outputs here: accepted with a warning. Switches: name, why it does not matter
IGNORED_SWITCHES: tuple[tuple[str, str], ...] = (
    ("disable-log-requests", "mm-infer never logs request contents"),
    ("enable-log-requests", "mm-infer never logs request contents"),
    ("enable-log-outputs", "mm-infer never logs generated text"),
    ("disable-log-stats", "mm-infer logs no periodic stats (see /metrics)"),
    ("disable-uvicorn-access-log", "logging only"),
    ("disable-frontend-multiprocessing", "the server and the engine share one process"),
    ("trust-remote-code", "checkpoints run on mm-infer's own model code, never code they ship"),
    ("enable-chunked-prefill", "prefills are always chunked under --max-num-batched-tokens"),
    ("async-scheduling", "scheduling only"),
    ("disable-custom-all-reduce", ONE_DEVICE),
    ("enable-expert-parallel", ONE_DEVICE),
    ("disable-mm-preprocessor-cache", "caching only"),
    ("disable-fastapi-docs", "no docs routes are served"),
    ("enable-server-load-tracking", "see /metrics"),
    ("enable-request-id-headers", "headers only"),
    ("allow-credentials", "no CORS headers are sent"),
    ("enable-prompt-embeds", "a request with prompt_embeds is a 400"),
    ("enable-prompt-tokens-details", "usage always carries prompt_tokens_details (cached_tokens)"),
)
# flags taking a value: names (aliases after the first), whether it takes a list, why it does not matter
IGNORED_VALUES: tuple[tuple[tuple[str, ...], bool, str], ...] = (
    (("max-log-len",), False, "mm-infer never logs prompts"),
    (("swap-space",), False, "memory only"),
    (("cpu-offload-gb",), False, "memory only"),
    (("max-seq-len-to-capture",), False, "CUDA graphs cover decode steps; see --enforce-eager"),
    (("cuda-graph-sizes",), True, "CUDA graphs cover decode steps; see --enforce-eager"),
    (("cudagraph-capture-sizes",), True, "CUDA graphs cover decode steps; see --enforce-eager"),
    (("max-cudagraph-capture-size",), False, "CUDA graphs cover decode steps; see --enforce-eager"),
    (("compilation-config", "-O", "--optimization-level"), False, "speed only"),
    (("max-parallel-loading-workers",), False, "loading only"),
    (("max-num-partial-prefills",), False, "scheduling only"),
    (("max-long-partial-prefills",), False, "scheduling only"),
    (("scheduling-policy",), False, "requests are served first come, first served"),
    (("preemption-mode",), False, "scheduling only"),
    (("distributed-executor-backend",), False, ONE_DEVICE),
    (("api-server-count", "-asc"), False, "one server process"),
    (("download-dir",), False, "MODEL is a local folder"),
    (("revision",), False, "MODEL is a local folder"),
    (("code-revision",), False, "MODEL is a local folder"),
    (("tokenizer-revision",), False, "MODEL is a local folder"),
    (("mm-processor-cache-gb",), False, "caching only"),
    (("guided-decoding-backend",), False, "structured outputs use mm-infer's own grammar masks"),
    (("structured-outputs-config",), False, "structured outputs use mm-infer's own grammar masks"),
    (("model-impl",), False, "checkpoints run on mm-infer's own model code"),
    (("worker-extension-cls",), False, "no collective_rpc; weights move through /update_weights_from_disk"),
    (("allowed-origins",), False, "no CORS headers are sent"),
    (("allowed-methods",), False, "no CORS headers are sent"),
    (("allowed-headers",), False, "no CORS headers are sent"),
    (("otlp-traces-endpoint",), False, "tracing only"),
    (("collect-detailed-traces",), False, "tracing only"),
    (("log-config-file",), False, "logging only"),
)
# names, the values honoured as they are (vLLM's defaults; none: any value is refused), why the rest are refused
RESTRICTED: tuple[tuple[tuple[str, ...], tuple[str, ...], str], ...] = (
    (("pipeline-parallel-size", "-pp"), ("1",), ONE_DEVICE),
    (("data-parallel-size", "-dp"), ("1",), ONE_DEVICE),
    (("quantization", "-q"), ("", "None"), "mm-infer serves unquantized weights only"),
    (("kv-cache-dtype",), ("auto",), "the KV cache is kept in the model's dtype"),
    (("load-format",), ("auto", "safetensors"), "weights are read from safetensors"),
    (("tokenizer-mode",), ("auto", "hf"), "the checkpoint's Hugging Face tokenizer is used"),
    (("config-format",), ("auto", "hf"), "the checkpoint's Hugging Face config is read"),
    (("task",), ("auto", "generate"), "mm-infer generates text"),
    (("runner",), ("auto", "generate"), "mm-infer generates text"),
    (("convert",), ("auto", "none"), "mm-infer generates text"),
    (("logprobs-mode",), ("raw_logprobs",), "a request picks its own logprobs_mode"),
    (("max-logprobs",), ("20",), "a request may ask for at most 20 logprobs per token, vLLM's default"),
    (("response-role",), ("assistant",), "replies come from the assistant role"),
    (("chat-template-content-format",), ("auto",), "message content reaches the template as mm-infer renders it"),
    (("allowed-media-domains",), (), "http(s) media may come from any public address (see --allow-private-media-urls)"),
    (("speculative-config",), (), "no speculative decoding"),
    (("hf-overrides",), (), "the checkpoint's config is used as it is"),
    (("rope-scaling",), (), "the checkpoint's config is used as it is"),
    (("rope-theta",), (), "the checkpoint's config is used as it is"),
    (("override-generation-config",), (), "use --generation-config DIR"),
    (("mm-processor-kwargs",), (), "use --max-pixels / --video-max-pixels / --max-video-frames"),
    (("lora-modules",), (), "no LoRA adapters"),
    (("tool-parser-plugin",), (), "built-in tool parsers only"),
    (("reasoning-parser-plugin",), (), "built-in reasoning parsers only"),
    (("logits-processors",), (), "no custom logits processors"),
    (("kv-transfer-config",), (), "no KV transfer"),
    (("tool-server",), (), "no built-in tool server"),
    (("middleware",), (), "no extra ASGI middleware"),
    (("root-path",), (), "routes are served at /"),
    (("uds",), (), "the server listens on --host / --port"),
    (("ssl-keyfile",), (), "the server speaks plain HTTP"),
    (("ssl-certfile",), (), "the server speaks plain HTTP"),
    (("ssl-ca-certs",), (), "the server speaks plain HTTP"),
)
# switches that would change outputs (their --no- form, vLLM's default, is accepted)
REFUSED_SWITCHES: tuple[tuple[str, str], ...] = (
    ("enable-lora", "no LoRA adapters"),
    ("return-tokens-as-token-ids", "a request asks for it with return_tokens_as_token_ids"),
    ("enable-force-include-usage", "a stream carries usage when the request's stream_options ask"),
    ("exclude-tools-when-tool-choice-none", "tools always reach the template"),
    ("skip-tokenizer-init", "prompts and outputs are always (de)tokenized"),
    ("headless", "one node, one server"),
    ("enable-ssl-refresh", "the server speaks plain HTTP"),
)
LIST_VALUED = {"allowed-media-domains", "middleware"}


def _option_strings(names: tuple[str, ...]) -> list[str]:
    return [n if n.startswith("-") else f"--{n}" for n in names]


def _dest(names: tuple[str, ...], kind: str) -> str:
    return f"vllm_{kind}_{names[0].replace('-', '_')}"


def _accepting(allowed: tuple[str, ...], reason: str) -> Callable[[str], str]:
    def check(value: str) -> str:
        if value.strip() in allowed:
            return value
        raise argparse.ArgumentTypeError(f"{value!r} is not supported: {reason}")
    return check


class _Refused(argparse.Action):
    """A vLLM switch that would change outputs: naming it stops the server before it starts."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=None, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        raise argparse.ArgumentError(self, f"not supported: {self.help}")


def add_vllm_flags(srv: argparse.ArgumentParser) -> None:
    """The vLLM flags `mm-infer serve` accepts without effect, or refuses with the reason."""
    group = srv.add_argument_group("vLLM flags accepted without effect or refused (docs/vllm-cli.md)")
    for name, reason in IGNORED_SWITCHES:
        group.add_argument(f"--{name}", dest=_dest((name,), "ignored"), action=argparse.BooleanOptionalAction,
                           default=None, help=f"no effect: {reason}")
    for names, many, reason in IGNORED_VALUES:
        group.add_argument(*_option_strings(names), dest=_dest(names, "ignored"), nargs="+" if many else None,
                           default=None, metavar="V", help=f"no effect: {reason}")
    for names, allowed, reason in RESTRICTED:
        group.add_argument(*_option_strings(names), dest=_dest(names, "checked"), type=_accepting(allowed, reason),
                           nargs="+" if names[0] in LIST_VALUED else None, default=None, metavar="V",
                           help=f"only {', '.join(allowed)}: {reason}" if allowed else f"refused: {reason}")
    for name, reason in REFUSED_SWITCHES:
        group.add_argument(f"--{name}", dest=_dest((name,), "refused"), action=_Refused, help=reason)
        group.add_argument(f"--no-{name}", dest=_dest((name,), "refused"), action="store_const", const=False,
                           help=argparse.SUPPRESS)
    group.add_argument("--tokenizer", dest="vllm_tokenizer", default=None, metavar="DIR",
                       help="only the model folder itself")


def ignored_flag_warnings(args: argparse.Namespace) -> list[str]:
    """One line per given vLLM flag that has no effect here."""
    named = [(name,) for name, _ in IGNORED_SWITCHES] + [names for names, _, _ in IGNORED_VALUES]
    reasons = [reason for _, reason in IGNORED_SWITCHES] + [reason for _, _, reason in IGNORED_VALUES]
    return [f"{_option_strings(names)[0]} has no effect in mm-infer ({reason}); accepted for vLLM compatibility"
            for names, reason in zip(named, reasons, strict=True)
            if getattr(args, _dest(names, "ignored"), None) is not None]


def check_tokenizer(args: argparse.Namespace) -> str | None:
    """vLLM's --tokenizer is honoured only when it is the model folder; else the reason it is refused."""
    tokenizer = getattr(args, "vllm_tokenizer", None)
    if tokenizer is None or Path(tokenizer).resolve() == Path(args.model).resolve():
        return None
    return f"--tokenizer {tokenizer}: only the model folder's own tokenizer is supported"


class FlagError(ValueError):
    """A command line `mm-infer serve` cannot honour; the message names the flag."""


_UNDERSCORES = re.compile(r"(?<=--)[^.=]*")


def _dashed(arg: str) -> str:
    """vLLM reads --max_model_len as --max-model-len."""
    return _UNDERSCORES.sub(lambda m: m.group(0).replace("_", "-"), arg, count=1) if arg.startswith("--") else arg


def vllm_argv(argv: list[str], actions: Mapping[str, argparse.Action]) -> list[str]:
    """A `serve` command line as vLLM reads it: snake_case flag names, --config FILE.yaml (flags on the command line
    win over the file's), and --model NAME for the positional model. `actions`: the serve flags by option string."""
    if not argv or argv[0] != "serve":
        return argv
    return _model_first(_with_config(_model_first([_dashed(a) for a in argv]), actions))


def _model_first(argv: list[str]) -> list[str]:
    """`serve --port 1 --model M` -> `serve M --port 1` (the command line's --model, then the file's)."""
    for i, arg in enumerate(argv):
        if arg == "--model" and i + 1 < len(argv):
            return [argv[0], argv[i + 1], *argv[1:i], *argv[i + 2:]]
        if arg.startswith("--model="):
            return [argv[0], arg.removeprefix("--model="), *argv[1:i], *argv[i + 1:]]
    return argv


def _with_config(argv: list[str], actions: Mapping[str, argparse.Action]) -> list[str]:
    spots = [i for i, a in enumerate(argv) if a == "--config" or a.startswith("--config=")]
    if not spots:
        return argv
    if len(spots) > 1:
        raise FlagError("--config is given more than once")
    i = spots[0]
    if argv[i] == "--config" and i + 1 >= len(argv):
        raise FlagError("--config needs a YAML file")
    path = argv[i + 1] if argv[i] == "--config" else argv[i].removeprefix("--config=")
    rest = argv[:i] + argv[i + (2 if argv[i] == "--config" else 1):]
    given = {actions[a.split("=", 1)[0]].dest for a in rest[1:] if a.split("=", 1)[0] in actions}
    model_on_line = len(rest) > 1 and not rest[1].startswith("-")
    file_args = []
    for flag, tokens in config_file_args(path, actions):
        if flag == "--model":
            file_args += [] if model_on_line else tokens
        elif flag not in actions or actions[flag].dest not in given:
            file_args += tokens
    head = 2 if model_on_line else 1
    return rest[:head] + file_args + rest[head:]


def config_file_args(path: str, actions: Mapping[str, argparse.Action]) -> list[tuple[str, list[str]]]:
    """vLLM's --config: a YAML mapping of flag names to values, as (flag, command-line tokens) pairs."""
    import yaml

    if Path(path).suffix not in (".yaml", ".yml"):
        raise FlagError(f"--config {path}: the file must be .yaml or .yml")
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise FlagError(f"--config {path}: {e}") from None
    if not isinstance(data, dict | None):
        raise FlagError(f"--config {path}: expected a mapping of flag names to values")
    out = []
    for key, value in (data or {}).items():
        flag = _dashed(f"--{key}")
        out.append((flag, _tokens(flag, value, actions)))
    return out


def _tokens(flag: str, value: object, actions: Mapping[str, argparse.Action]) -> list[str]:
    if isinstance(value, bool):
        negative = f"--no-{flag[2:]}"
        return [flag] if value else [negative] if negative in actions else []
    if isinstance(value, list):
        if isinstance(actions.get(flag), argparse._AppendAction):
            return [token for item in value for token in (flag, str(item))]
        return [flag, *map(str, value)] if value else []
    if isinstance(value, dict):
        return [flag, json.dumps(value)]
    return [flag, str(value)]
