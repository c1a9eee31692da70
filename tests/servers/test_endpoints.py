"""The small endpoints (models, health, version, tokenize, detokenize, metrics) and /v1/completions."""

from __future__ import annotations

import httpx
from server_cases import API_KEY, MAX_MODEL_LEN, SMALL

from mm_infer import SamplingParams

AUTH = {"Authorization": f"Bearer {API_KEY}"}


def test_models_health_version(client, server):
    models = client.models.list().data  # conftest serves "m" too: unserved model names are now a 404
    assert [m.id for m in models] == ["tiny-qwen2-vl", "m"] and models[0].model_extra["max_model_len"] == MAX_MODEL_LEN
    assert httpx.get(f"{server.base_url}/health").status_code == 200
    assert httpx.get(f"{server.base_url}/version", headers=AUTH).json()["version"]


def test_tokenize_messages_gives_expanded_ids_and_ranges(server, photo_url):
    body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": photo_url}},
                                                      {"type": "text", "text": "hi"}]}],
            "mm_processor_kwargs": {"max_pixels": SMALL}, "return_token_strs": True}
    r = httpx.post(f"{server.base_url}/tokenize", json=body, headers=AUTH).json()
    (ph,) = r["placeholders"]
    assert ph["modality"] == "image" and ph["length"] > 1
    assert r["tokens"][ph["offset"]:ph["offset"] + ph["length"]] == [3006] * ph["length"]
    assert r["count"] == len(r["tokens"]) == len(r["token_strs"])
    text = httpx.post(f"{server.base_url}/detokenize", json={"tokens": r["tokens"][:4]}, headers=AUTH).json()
    assert text["prompt"].startswith("<|im_start|>system")


def test_completions_text_and_token_ids_match_llm(client, llm):
    ref = llm.generate({"prompt": "Once upon a time"}, SamplingParams(temperature=0.0, max_tokens=5, logprobs=2),
                       use_tqdm=False)[0]
    r = client.completions.create(model="m", prompt="Once upon a time", max_tokens=5, temperature=0, logprobs=2,
                                  extra_body={"return_token_ids": True})
    choice = r.choices[0]
    assert choice.model_extra["token_ids"] == ref.outputs[0].token_ids
    assert choice.model_extra["prompt_token_ids"] == ref.prompt_token_ids
    assert choice.text == ref.outputs[0].text
    assert max(abs(a - b) for a, b in zip(choice.logprobs.token_logprobs, ref.outputs[0].logprobs,
                                           strict=True)) < 1e-5
    assert all(len(t) == 2 for t in choice.logprobs.top_logprobs)
    by_ids = client.completions.create(model="m", prompt=ref.prompt_token_ids, max_tokens=5, temperature=0,
                                       extra_body={"return_token_ids": True})
    assert by_ids.choices[0].model_extra["token_ids"] == ref.outputs[0].token_ids
    batch = client.completions.create(model="m", prompt=[[5, 6, 7], [8, 9]], max_tokens=2, temperature=0, n=2)
    assert sorted(c.index for c in batch.choices) == [0, 1, 2, 3]


def test_completions_stream(client):
    kw = {"model": "m", "prompt": ["abc", [5, 6, 7]], "max_tokens": 4, "temperature": 0, "n": 2, "logprobs": 1}
    whole = client.completions.create(**kw)
    parts = list(client.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    for choice in whole.choices:
        pieces = [c for p in parts for c in p.choices if c.index == choice.index]
        assert "".join(c.text for c in pieces) == choice.text
        assert [t for c in pieces for t in c.logprobs.token_logprobs] == choice.logprobs.token_logprobs
        assert pieces[-1].finish_reason == choice.finish_reason
    assert parts[-1].usage.completion_tokens == whole.usage.completion_tokens == 16


def test_stop_token_ids_and_stop_strings(client):
    base = client.completions.create(model="m", prompt="abc", max_tokens=6, temperature=0,
                                     extra_body={"return_token_ids": True})
    ids = base.choices[0].model_extra["token_ids"]
    stopped = client.completions.create(model="m", prompt="abc", max_tokens=6, temperature=0,
                                        extra_body={"return_token_ids": True, "stop_token_ids": [ids[2]]})
    assert stopped.choices[0].model_extra["token_ids"] == ids[:3] and stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].model_extra["stop_reason"] == ids[2]


def test_metrics_exposition(client, server):
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "m"}], max_tokens=2)
    text = httpx.get(f"{server.base_url}/metrics", headers=AUTH).text
    for name in ("# TYPE mm_infer_requests_total counter",
                 "mm_infer_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"} ",
                 "mm_infer_generation_tokens_total ", "# TYPE mm_infer_num_requests_waiting gauge",
                 "mm_infer_num_requests_waiting ", "# TYPE mm_infer_e2e_request_latency_seconds histogram",
                 "mm_infer_e2e_request_latency_seconds_bucket{le=\"+Inf\"} ",
                 "mm_infer_time_to_first_token_seconds_count ", "# TYPE mm_infer_encoder_cache_hits_total counter",
                 "mm_infer_encoder_cache_hits_total ", "mm_infer_prefix_cache_hit_tokens_total ",
                 "mm_infer_encoder_cache_hits ", "mm_infer_prefix_cache_hit_tokens ",  # the old names, kept
                 "vllm:generation_tokens_total{engine=\"0\",model_name=", "process_resident_memory_bytes "):
        assert name in text, name
    assert httpx.get(f"{server.base_url}/no/such/path/{id(text)}", headers=AUTH).status_code == 404
    text = httpx.get(f"{server.base_url}/metrics", headers=AUTH).text
    assert "/no/such/path" not in text and 'endpoint="other",status="404"' in text
    line = next(ln for ln in text.splitlines() if ln.startswith("mm_infer_generation_tokens_total"))
    assert float(line.split()[-1]) >= 2


def test_media_defaults_come_from_the_checkpoint(server, photo_url):
    import json

    from server_cases import CKPT

    from mm_infer.media import smart_resize

    cfg = json.loads((CKPT / "preprocessor_config.json").read_text())
    h, w = smart_resize(400, 600, 28, cfg["min_pixels"], cfg["max_pixels"])  # photo.png is 600x400
    body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": photo_url}}]}]}
    r = httpx.post(f"{server.base_url}/tokenize", json=body, headers=AUTH).json()
    assert r["placeholders"][0]["length"] == (h // 14) * (w // 14) // 4


def test_logprobs_mode_processed_differs_from_raw(client):
    kw = {"model": "m", "prompt": "abc", "max_tokens": 3, "temperature": 0.5, "seed": 3}
    raw = client.completions.create(**kw, logprobs=0, extra_body={"logprobs_mode": "raw_logprobs"})
    processed = client.completions.create(**kw, logprobs=0, extra_body={"logprobs_mode": "processed_logprobs"})
    assert raw.choices[0].text == processed.choices[0].text  # same seed, same tokens
    a, b = raw.choices[0].logprobs.token_logprobs, processed.choices[0].logprobs.token_logprobs
    assert all(x < 0 for x in a) and any(abs(x - y) > 1e-3 for x, y in zip(a, b, strict=True))


def test_streamed_stop_string_never_leaks(client, server):
    kw = {"model": "m", "prompt": "Once upon a time", "max_tokens": 10, "temperature": 0}
    base = client.completions.create(**kw, extra_body={"return_token_ids": True})
    ids, text = base.choices[0].model_extra["token_ids"], base.choices[0].text
    decode = server.state.preparer.tokenizer.decode
    stop = None
    for k in range(1, len(ids) - 1):  # a stop string straddling a token boundary, first seen there
        b = len(decode(ids[:k], skip_special_tokens=True))
        candidate = text[b - 1:b + 2]
        if b >= 1 and len(candidate) == 3 and text.find(candidate) == b - 1:
            stop = candidate
            break
    assert stop is not None, f"no usable token boundary in {text!r}"
    whole = client.completions.create(**kw, stop=[stop])
    streamed = "".join(p.choices[0].text for p in client.completions.create(**kw, stop=[stop], stream=True)
                       if p.choices)
    assert whole.choices[0].finish_reason == "stop" and stop not in whole.choices[0].text
    assert streamed == whole.choices[0].text
    chat = {"model": "m", "messages": [{"role": "user", "content": "stop test"}], "max_tokens": 10, "temperature": 0}
    full = client.chat.completions.create(**chat).choices[0].message.content
    chat_stop = full[2:5]
    if len(chat_stop) == 3 and full.find(chat_stop) == 2:
        whole_chat = client.chat.completions.create(**chat, stop=chat_stop).choices[0].message.content
        parts = client.chat.completions.create(**chat, stop=chat_stop, stream=True)
        assert "".join(p.choices[0].delta.content or "" for p in parts if p.choices) == whole_chat == full[:2]


def test_continue_final_message_through_the_server(client, server):
    messages = [{"role": "user", "content": "Say hello"}, {"role": "assistant", "content": "Hello the"}]
    body = {"messages": messages, "add_generation_prompt": False, "continue_final_message": True}
    r = httpx.post(f"{server.base_url}/tokenize", json=body, headers=AUTH).json()
    text = httpx.post(f"{server.base_url}/detokenize", json={"tokens": r["tokens"]}, headers=AUTH).json()["prompt"]
    assert text.endswith("<|im_start|>assistant\nHello the")
    out = client.chat.completions.create(model="m", messages=messages, max_tokens=2, temperature=0,
                                         extra_body={"add_generation_prompt": False, "continue_final_message": True,
                                                     "return_token_ids": True})
    assert out.model_extra["prompt_token_ids"] == r["tokens"]


def test_health_is_503_once_the_engine_stopped():
    from server_cases import CKPT

    from servers.openai.config import ServerConfig
    from servers.openai.launch import BackgroundServer, free_port

    config = ServerConfig(model_dir=str(CKPT), port=free_port(), engine_options={"num_kv_blocks": 16})
    with BackgroundServer(config) as srv:
        assert httpx.get(f"{srv.base_url}/health").status_code == 200
        srv.state.backend.shutdown()
        assert httpx.get(f"{srv.base_url}/health").status_code == 503
