"""A `vllm serve` launch line means the same to `mm-infer serve`: vLLM's names, value formats, --config YAML; flags
without effect are accepted with a warning, flags that would change outputs stop the server before it starts."""

from __future__ import annotations

import json
import logging
import re
import signal
from pathlib import Path

import httpx
import pytest
import torch
from serve_process import REPO, start_serve, stop_serve
from server_cases import CKPT

import servers.openai.launch
from mm_infer.config import EngineConfig
from mm_infer.engine.runtime import resolve_dtype
from mm_infer.sizes import parse_cli_bytes, parse_human_int
from servers import vllm_flags
from servers.cli import main, parse_args, server_config
from servers.cli_flags import DTYPES
from servers.openai.launch import free_port


def serve(*flags: str):
    return parse_args(["serve", str(CKPT), *flags])


def engine(*flags: str) -> dict[str, object]:
    return server_config(serve(*flags)).engine_options


@pytest.mark.parametrize("text, count", [("32k", 32_000), ("32K", 32_768), ("1m", 10**6), ("1M", 2**20),
                                         ("25.6k", 25_600), ("2g", 2 * 10**9), ("1T", 2**40), (" 4096 ", 4096)])
def test_counts_are_read_as_vllm_reads_them(text, count):
    """vLLM's human_readable_int: lower case is powers of 1000, upper case powers of 1024."""
    assert parse_human_int(text) == count
    assert engine("--max-model-len", text)["max_model_len"] == count
    assert engine("--max-num-batched-tokens", text)["max_num_batched_tokens"] == count


@pytest.mark.parametrize("bad", ["1.5K", "1e3", "32kb", "k", "auto", "-1"])
def test_bad_counts_and_auto_model_len_are_refused(bad, capsys):
    with pytest.raises(SystemExit):
        serve("--max-model-len", bad)
    assert "--max-model-len" in capsys.readouterr().err


def test_kv_cache_bytes_read_vllms_form_and_ours():
    """vLLM's 4G is 4 GiB (ours read it as 4e9); 4GiB and 2e9 keep working."""
    assert [parse_cli_bytes(v) for v in ("4G", "4g", "4GiB", "2e9", "512MiB")] == [4 * 2**30, 4 * 10**9, 4 * 2**30,
                                                                                 2 * 10**9, 512 * 2**20]
    assert engine("--kv-cache-memory-bytes", "4G")["kv_cache_memory_bytes"] == 4 * 2**30
    with pytest.raises(ValueError):
        parse_cli_bytes("1.5G")  # vLLM: decimals only with decimal suffixes


@pytest.mark.parametrize("vllm_line, our_line", [
    (["--allowed-local-media-path", "/d"], ["--allowed-media-path", "/d"]),
    (["--tool-call-parser", "hermes", "--enable-auto-tool-choice"], ["--tool-parser", "hermes"]),
    (["--num-gpu-blocks-override", "64"], ["--num-kv-blocks", "64"]),
    (["--uvicorn-log-level", "warning"], ["--log-level", "warning"]),
    (["-tp", "2"], ["--tensor-parallel-size", "2"]),
    (["--trust-request-mm-kwargs", "--trust-request-chat-template", "-pp", "1", "--quantization", "None",
      "--kv-cache-dtype", "auto", "--no-enable-lora", "--tokenizer", str(CKPT)], []),
])
def test_vllm_names_mean_our_names(vllm_line, our_line):
    assert server_config(serve(*vllm_line)) == server_config(serve(*our_line))
    assert serve(*vllm_line).log_level == serve(*our_line).log_level


@pytest.mark.parametrize("text, limits", [
    ('{"image": 4, "video": 1}', {"image": 4, "video": 1}), ("image=4,video=1", {"image": 4, "video": 1}),
    (" Image = 2 ", {"image": 2}), ('{"video": {"count": 1, "num_frames": 32}, "image": 0}', {"video": 1, "image": 0}),
    ('{"image": 2, "audio": 0}', {"image": 2, "audio": 0}), ('{"image": 2, "vision_chunk": 0}', {"image": 2}),
    ('{"audio": 1}', {"audio": 1}), ("", None), ("{}", None)])
def test_limit_mm_per_prompt_forms(text, limits):
    assert server_config(serve("--limit-mm-per-prompt", text)).limit_mm_per_prompt == limits


@pytest.mark.parametrize("bad", ['{"vision_chunk": 1}', '{"image": -1}', '{"image": 1.5}', '{"image": true}', "image=x",
                                 "image=1,image=2", "image", '{"image": 2', "[1]"])
def test_bad_limit_mm_per_prompt_is_refused(bad, capsys):
    with pytest.raises(SystemExit):
        serve("--limit-mm-per-prompt", bad)
    assert "--limit-mm-per-prompt" in capsys.readouterr().err


def test_chat_template_is_a_file_or_the_template_itself(tmp_path, capsys):
    path = tmp_path / "t.jinja"
    path.write_text("{{ messages[0].content }}")
    assert server_config(serve("--chat-template", str(path))).chat_template == "{{ messages[0].content }}"
    assert server_config(serve("--chat-template", "{% for m in messages %}x{% endfor %}")).chat_template == (
        "{% for m in messages %}x{% endfor %}")
    with pytest.raises(SystemExit):
        serve("--chat-template", str(tmp_path / "missing.jinja"))
    assert "looks like a file path" in capsys.readouterr().err


def test_generation_config_auto_vllm_or_a_folder(tmp_path):
    assert server_config(serve()).generation_config == "auto"
    assert server_config(serve("--generation-config", "vllm")).generation_config == "vllm"
    assert server_config(serve("--generation-config", str(CKPT))).generation_config == str(CKPT)
    with pytest.raises(SystemExit):
        serve("--generation-config", str(tmp_path))  # no generation_config.json there


def test_several_served_model_names():
    config = server_config(serve("--served-model-name", "a", "b", "c", "b"))
    assert (config.served_model_name, config.extra_served_names, config.model_name) == ("a", ("b", "c"), "a")
    assert server_config(serve("--served-model-name", "a")).extra_served_names == ()


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_vllm_dtype_is_one_the_engine_resolves(dtype):
    assert isinstance(resolve_dtype(engine("--dtype", dtype)["dtype"], torch.device("cpu")), torch.dtype)


def test_prefix_caching_switch_reaches_the_engine():
    assert EngineConfig.from_options(str(CKPT), **engine("--no-enable-prefix-caching")).cache.enable_prefix_caching \
        is False
    assert engine("--enable-prefix-caching")["enable_prefix_caching"] is True
    assert "enable_prefix_caching" not in engine()


def test_the_launch_line_from_vllms_docs_means_the_same():
    line = (f"serve {CKPT} --max-model-len 32k --limit-mm-per-prompt {{\"image\":2}} --allowed-local-media-path /data "
            "--served-model-name qwen vl --gpu-memory-utilization 0.8 --enable-prefix-caching --tool-call-parser "
            "hermes --enable-auto-tool-choice --dtype half")
    config = server_config(parse_args(line.split()))
    assert (config.served_model_name, config.extra_served_names, config.tool_parser) == ("qwen", ("vl",), "hermes")
    assert (config.limit_mm_per_prompt, config.fetch.allowed_media_paths) == ({"image": 2}, (Path("/data"),))
    assert config.engine_options == {"max_model_len": 32_000, "gpu_memory_utilization": 0.8,
                                     "enable_prefix_caching": True, "dtype": "half"}
    engine_config = EngineConfig.from_options(config.model_dir, **config.engine_options)
    assert (engine_config.scheduler.max_model_len, engine_config.dtype) == (32_000, "half")


def test_config_file_sets_flags_and_the_command_line_wins(tmp_path):
    path = tmp_path / "serve.yaml"
    path.write_text(f"model: {CKPT}\nmax_model_len: 2k\nport: 9000\nserved-model-name: [a, b]\n"
                    "enable-prefix-caching: false\nallowed-local-media-path: /file\nlimit-mm-per-prompt: {image: 3}\n"
                    "disable-log-stats: true\nbatch-invariant: false\n")
    config = server_config(parse_args(["serve", "--config", str(path), "--port", "9001", "--allowed-media-path",
                                       "/cli"]))
    assert (config.model_dir, config.port, config.served_model_name, config.extra_served_names) == (
        str(CKPT), 9001, "a", ("b",))
    assert config.fetch.allowed_media_paths == (Path("/cli"),)  # the file's /file is replaced, not added to
    assert config.engine_options == {"max_model_len": 2000, "enable_prefix_caching": False}
    assert config.limit_mm_per_prompt == {"image": 3}
    on_line = server_config(parse_args(["serve", "--model", "elsewhere", f"--config={path}"]))
    assert on_line.model_dir == "elsewhere" and on_line.port == 9000  # the command line's model wins too


@pytest.mark.parametrize("content, name, message", [
    ("port: 1\n", "c.json", ".yaml or .yml"), ("- a\n", "c.yaml", "mapping"), ("port: [\n", "c.yaml", "c.yaml"),
    ("no-such-flag: 1\n", "c.yaml", "unrecognized arguments: --no-such-flag")])
def test_bad_config_files_stop_the_server(content, name, message, tmp_path, capsys, no_serving):
    (tmp_path / name).write_text(content)
    assert exit_code(["serve", str(CKPT), "--config", str(tmp_path / name)]) == 2
    assert message in capsys.readouterr().err


def test_snake_case_flags_and_model_flag():
    args = parse_args(["serve", "--max_model_len=1k", "--model", str(CKPT), "--gpu_memory_utilization", "0.5"])
    assert (args.model, args.max_model_len, args.gpu_memory_utilization) == (str(CKPT), 1000, 0.5)


@pytest.fixture
def no_serving(monkeypatch) -> list:
    """Replaces the server with a recorder, so a line that should have been refused cannot start one."""
    started: list = []
    monkeypatch.setattr(servers.openai.launch, "serve", lambda config, level: started.append((config, level)))
    return started


def exit_code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as e:
        return int(e.code or 0)


def test_flags_without_effect_start_the_server_with_a_warning_each(no_serving, caplog):
    line = ["serve", str(CKPT), "--disable-log-requests", "--swap-space", "4", "-O3", "--trust-remote-code",
            "--cuda-graph-sizes", "1", "2", "--no-enable-chunked-prefill", "--uvicorn-log-level", "debug"]
    with caplog.at_level(logging.WARNING, logger="mm_infer.server"):
        assert main(line) == 0
    mine = [r for r in caplog.records if r.name == "mm_infer.server"]
    warned = " ".join(r.getMessage() for r in mine)
    for flag in ("--disable-log-requests", "--swap-space", "--compilation-config", "--trust-remote-code",
                 "--cuda-graph-sizes", "--enable-chunked-prefill"):
        assert f"{flag} has no effect" in warned
    assert len(mine) == 6 and no_serving[0][1] == "debug"


@pytest.mark.parametrize("line, named", [
    (["-pp", "2"], "--pipeline-parallel-size/-pp"), (["--pipeline-parallel-size", "4"], "--pipeline-parallel-size"),
    (["-dp", "2"], "--replicas"), (["--quantization", "awq"], "--quantization"), (["--kv-cache-dtype", "fp8"], "fp8"),
    (["--enable-lora"], "--enable-lora"), (["--speculative-config", "{}"], "--speculative-config"),
    (["--mm-processor-kwargs", '{"max_pixels": 1}'], "--max-pixels"), (["--max-logprobs", "50"], "--max-logprobs"),
    (["--allowed-media-domains", "a.com", "b.com"], "--allowed-media-domains"), (["--dtype", "fp8"], "--dtype"),
    (["--tokenizer", "/other"], "--tokenizer"), (["--api-key", "a", "b"], "--api-key"),
    (["--enable-auto-tool-choice"], "--tool-call-parser"), (["--disable-sliding-window"], "--disable-sliding-window"),
    (["--return-tokens-as-token-ids"], "--return-tokens-as-token-ids"), (["--max-model-len", "auto"], "auto")])
def test_flags_that_would_change_outputs_stop_the_server(line, named, no_serving, capsys):
    assert exit_code(["serve", str(CKPT), *line]) == 2 and not no_serving
    assert named in capsys.readouterr().err


def test_every_vllm_flag_we_accept_or_refuse_is_in_the_docs():
    table = (REPO / "docs" / "vllm-cli.md").read_text()
    names = ([n for n, _ in vllm_flags.IGNORED_SWITCHES + vllm_flags.REFUSED_SWITCHES]
             + [names[0] for names, *_ in vllm_flags.IGNORED_VALUES + vllm_flags.RESTRICTED])
    missing = [n for n in names if not re.search(rf"`--{re.escape(n)}\b", table)]
    assert not missing, f"docs/vllm-cli.md lacks {missing}"


def test_a_vllm_launch_line_with_a_config_file_serves(tmp_path, monkeypatch):
    """python -m servers.cli with vLLM's spellings, a --config file and $VLLM_API_KEY answers /v1/models."""
    (tmp_path / "vllm.yaml").write_text(json.dumps({"max_model_len": "1k", "num-gpu-blocks-override": 64,
                                                    "served-model-name": ["qwen", "vl"]}))  # JSON is YAML
    monkeypatch.setenv("VLLM_API_KEY", "vk")
    monkeypatch.delenv("MM_INFER_API_KEY", raising=False)
    proc, base = start_serve([str(CKPT), "--config", str(tmp_path / "vllm.yaml"), "--uvicorn-log-level", "warning",
                              "--dtype", "float32", "--enable-prefix-caching", "--disable-log-requests"],
                             free_port(), timeout_s=120)
    try:
        models = httpx.get(f"{base}/v1/models", headers={"Authorization": "Bearer vk"}).json()
        assert models["data"][0]["id"] == "qwen" and models["data"][0]["max_model_len"] == 1000
        assert httpx.get(f"{base}/v1/models").status_code == 401
    finally:
        printed = stop_serve(proc, timeout_s=30)
    assert proc.returncode in (0, -signal.SIGTERM)
    assert "--disable-log-requests has no effect" in printed
