"""Structured outputs in the engine: grammar masks in the sampler, one matcher per sample, mixed batches, devices."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
import xgrammar as xgr
from engine_cases import CKPT
from fake_cuda import CUDA, fake_cuda_engine

from mm_infer import SamplingParams
from mm_infer.engine.sampling import batch as sampling_batch
from mm_infer.engine.sampling.logits_processors import unpack_bitmask
from mm_infer.structured import StructuredOutputsParams as Spec
from mm_infer.structured.compiler import GrammarError, fill_bitmask, hf_tokenizer, tokenizer_info

SCHEMA = {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["color", "ok", "n"], "additionalProperties": False}
REGEX = r"[a-z]{2,6}-[0-9]{2}"
CHOICES = ["alpha", "beta gamma", 'quote "q"']
PROMPT = {"prompt_token_ids": list(range(200, 230))}


def valid_json(text: str) -> bool:
    """What SCHEMA asks, checked by hand (jsonschema is not a dependency)."""
    obj = json.loads(text)
    return (set(obj) == {"color", "ok", "n"} and obj["color"] in ("red", "green", "blue")
            and isinstance(obj["ok"], bool) and isinstance(obj["n"], int) and 0 <= obj["n"] <= 99)


def params(spec: Spec | None, **kw) -> SamplingParams:
    return SamplingParams(**{"max_tokens": 48, "temperature": 1.0, "seed": 7, **kw}, structured_outputs=spec)


def test_bitmask_unpacks_like_xgrammar_and_pads_a_wider_lm_head():
    # catches: a wrong bit order (word t // 32, bit t % 32), and lm_head ids past the bitmask left unmasked
    gen = torch.Generator().manual_seed(0)
    bitmask = torch.randint(-2**31, 2**31 - 1, (3, 4), dtype=torch.int32, generator=gen)  # [G, W]: 128 ids
    logits = torch.randn(3, 128, generator=gen)
    want = logits.clone()
    xgr.apply_token_bitmask_inplace(want, bitmask)
    got = logits.masked_fill(~unpack_bitmask(bitmask, 128), float("-inf"))
    assert torch.equal(got, want)
    wide = unpack_bitmask(bitmask, 150)  # the model's vocab is 150 > 128 the grammar knows
    assert wide.shape == (3, 150) and not wide[:, 128:].any() and torch.equal(wide[:, :128], ~got.isinf())
    assert unpack_bitmask(bitmask, 100).shape == (3, 100)


def test_tokenizer_info_masks_padded_ids_and_special_tokens(llm):
    # catches: TokenizerInfo sized to the tokenizer (ids the lm_head has past it sampled) and added special tokens
    # such as <|im_start|> allowed as text inside a JSON string
    tok = llm.engine.tokenizer
    info = tokenizer_info(hf_tokenizer(tok, str(CKPT)), 3008 + 40, [3002, 3000])
    compiled = xgr.GrammarCompiler(info, max_threads=1).compile_json_schema({"type": "string"})
    matcher = xgr.GrammarMatcher(compiled)
    assert matcher.accept_token(tok.encode('"', add_special_tokens=False)[0])
    allowed = unpack_bitmask(fill_bitmask([matcher], 3048), 3048)[0]  # inside a string: any text
    assert allowed[:3000].sum() > 2500
    assert not allowed[3000:].any()  # stop tokens (only when complete), specials, padding: never here


def test_json_schema_outputs_validate_under_n4(llm):
    # catches: no mask (the tiny model writes no JSON: see the control), a matcher shared by the n samples (their
    # outputs would be spliced together), or one not advanced per token
    spec = Spec(json=SCHEMA, disable_any_whitespace=True)
    out = llm.generate(PROMPT, params(spec, n=4), use_tqdm=False)[0]
    assert len({c.text for c in out.outputs}) > 1  # the four samples differ, yet each is valid
    for c in out.outputs:
        assert c.finish_reason == "stop" and valid_json(c.text), c.text
        assert c.token_ids[-1] in llm.engine.eos_ids  # EOS came only once the object was complete
    control = llm.generate(PROMPT, params(None, n=1), use_tqdm=False)[0].outputs[0].text
    with pytest.raises(json.JSONDecodeError):
        json.loads(control)


def test_regex_choice_and_grammar_outputs(llm):
    # catches: each spec kind wired to the wrong compiler (the regex, the EBNF of the choices, a user grammar)
    specs = [Spec(regex=REGEX), Spec(choice=CHOICES), Spec(grammar='root ::= "(" [0-9]+ ")"')]
    outs = llm.generate([PROMPT] * 3, [params(s, n=3, max_tokens=20) for s in specs], use_tqdm=False)
    for c in outs[0].outputs:
        assert re.fullmatch(REGEX, c.text), c.text
    assert all(c.text in CHOICES for c in outs[1].outputs)
    for c in outs[2].outputs:
        assert c.finish_reason == "length" or re.fullmatch(r"\([0-9]+\)", c.text), c.text
        assert re.fullmatch(r"\([0-9]*\)?", c.text), c.text


def test_mixed_batch_rows_without_grammar_are_untouched(llm, monkeypatch):
    # catches: the mask applied to every row (or in the wrong row order), different grammars in one step mixed up;
    # rows without a grammar must give exactly what they give alone
    kinds = [Spec(json=SCHEMA, disable_any_whitespace=True), None, Spec(regex=REGEX), None, Spec(choice=CHOICES)]
    plain = [dict(temperature=0.0, logprobs=2), dict(temperature=0.9, top_p=0.9, seed=3)]
    ps = [params(s) if s is not None else params(None, **plain.pop(0)) for s in kinds]
    steps: list[list[bool]] = []
    real = sampling_batch.SamplingBatch.build

    def spy(seqs, device, *store):
        batch = real(seqs, device, *store)
        steps.append([s.matcher is not None for s in seqs])
        return batch

    monkeypatch.setattr(sampling_batch.SamplingBatch, "build", staticmethod(spy))
    outs = llm.generate([PROMPT] * 5, ps, use_tqdm=False)
    assert [True, False, True, False, True] in steps  # one step held all five rows: three grammars, two without
    assert valid_json(outs[0].outputs[0].text) and re.fullmatch(REGEX, outs[2].outputs[0].text)
    assert outs[4].outputs[0].text in CHOICES
    for i in (1, 3):
        alone = llm.generate(PROMPT, ps[i], use_tqdm=False)[0].outputs[0]
        assert outs[i].outputs[0].token_ids == alone.token_ids and outs[i].outputs[0].logprobs == alone.logprobs


def test_raw_logprobs_stay_raw_processed_are_masked(llm):
    # catches: the mask applied before the raw log-softmax (raw would drop forbidden tokens), or not before the
    # processed one (processed would put mass on tokens the grammar forbids)
    spec = Spec(choice=["yes", "no"])
    raw, processed = (llm.generate(PROMPT, params(spec, temperature=0.0, logprobs=5, logprobs_mode=m),
                                   use_tqdm=False)[0].outputs[0] for m in ("raw_logprobs", "processed_logprobs"))
    assert raw.token_ids == processed.token_ids and raw.text in ("yes", "no")
    tok = llm.engine.tokenizer

    def starts_a_choice(t: int) -> bool:
        return any(w.startswith(tok.decode([t])) for w in ("yes", "no"))

    assert all(math.isfinite(v) for v in raw.top_logprobs[0].values())  # the model's own top 5
    assert not all(starts_a_choice(t) for t in raw.top_logprobs[0])  # ... which include forbidden tokens
    allowed = {t: v for t, v in processed.top_logprobs[0].items() if math.isfinite(v)}
    assert all(starts_a_choice(t) for t in allowed)
    assert math.isclose(sum(math.exp(v) for v in allowed.values()), 1.0, rel_tol=1e-5)  # the allowed are all
    assert processed.logprobs[0] > raw.logprobs[0]  # renormalised over the allowed tokens


def test_request_ends_when_the_grammar_terminates(llm):
    # catches: a request that runs on to max_tokens after its grammar took the stop token (ignore_eos keeps EOS
    # from ending it: the matcher's termination must)
    out = llm.generate(PROMPT, params(Spec(choice=CHOICES), ignore_eos=True, max_tokens=40), use_tqdm=False)[0]
    c = out.outputs[0]
    assert c.finish_reason == "stop" and c.text in CHOICES and c.token_ids[-1] in llm.engine.eos_ids


def test_invalid_specs_fail_before_queuing_and_grammars_are_cached(llm):
    # catches: a bad schema / regex / grammar found only mid-step (or never), and a compilation per request
    engine = llm.engine
    for bad, what in [(Spec(json={"type": "nope"}), "JSON schema"), (Spec(regex="a(b"), "regex"),
                      (Spec(grammar="root ::= missing"), "EBNF grammar")]:
        with pytest.raises(GrammarError, match=f"invalid {what}"):
            engine.add_request("bad", PROMPT, params(bad))
        assert "bad" not in engine.groups and not engine.has_unfinished()
    for kw in [dict(regex="a", choice=["b"]), dict(), dict(json="{not json"), dict(choice=[])]:
        with pytest.raises(ValueError, match="structured outputs"):
            Spec(**kw)
    compiler = engine.grammars.compiler
    before = compiler.compilations
    spec = {"type": "object", "properties": {"k": {"type": "boolean"}}, "required": ["k"]}
    engine.add_request("c1", PROMPT, params(Spec(json=spec), n=3))
    engine.add_request("c2", PROMPT, params(Spec(json=json.dumps(spec))))  # the same schema, as text
    assert compiler.compilations == before + 1
    matchers = [s.matcher for g in ("c1", "c2") for s in engine.groups[g].seqs]
    assert len({id(m) for m in matchers}) == 4  # one matcher per sample
    engine.abort_many(["c1", "c2"])
    engine.step()


def test_grammar_rows_stay_on_the_device(monkeypatch):
    # catches: the bitmask (filled on the host) meeting the cuda logits without its one copy, or a host read of
    # device data to build it; the fixed readback token 5 ('&') is what the grammar "&+" allows
    with fake_cuda_engine(CKPT, monkeypatch) as (engine, on_device, readbacks):
        requests = [engine.prepare(PROMPT) for _ in range(3)]
        engine.compile_grammar(params(Spec(regex="&+")))  # real xgrammar work: outside the fake mode
        with on_device():
            for i, (req, spec) in enumerate(zip(requests, [Spec(regex="&+"), None, Spec(regex="&+")], strict=True)):
                engine.add_request(f"r{i}", req, params(spec, n=2 if spec else 1, max_tokens=8))
            for _ in range(3):
                engine.step()
    assert len(readbacks.seen) == 3 and readbacks.seen[-1].batch.grammar_rows == [0, 2, 3, 4]  # r1 has none
    assert all(s.num_output_tokens == 3 for s in engine.groups["r0"].seqs[:1])  # the matcher took each '&'
    assert all(s.token_ids.device == CUDA for s in readbacks.seen)


def test_a_bitmask_left_on_the_host_fails_the_harness(monkeypatch):
    # the fake-CUDA harness must be able to fail: the host bitmask used on the cuda logits without its copy
    monkeypatch.setattr(sampling_batch.SamplingBatch, "grammar_bitmask",
                        lambda self, vocab: fill_bitmask([self.seqs[i].matcher for i in self.grammar_rows], vocab))
    with pytest.raises((RuntimeError, torch._subclasses.fake_tensor.FakeTensorDeviceMismatchError)):
        test_grammar_rows_stay_on_the_device(monkeypatch)
