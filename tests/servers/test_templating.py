"""ChatRenderer: the checkpoint's template, the fallback template, continue_final_message, return shapes."""

from __future__ import annotations

import pytest
from server_cases import CKPT

from mm_infer.prompt.placeholders import PromptError
from mm_infer.prompt.templating import ChatRenderer
from mm_infer.prompt.tokenizer import Tokenizer

MEDIA_TOKENS = {"image": "<|vision_start|><|image_pad|><|vision_end|>",
                "video": "<|vision_start|><|video_pad|><|vision_end|>"}
CONVO = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]},
         {"role": "assistant", "content": "Hello the"}]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_pretrained(CKPT)


def test_checkpoint_template_and_generation_prompt(tok):
    r = ChatRenderer(tok, MEDIA_TOKENS)
    text = r.render_text(CONVO[:1])
    assert text.endswith("<|im_start|>assistant\n") and "<|image_pad|>" in text
    assert not r.render_text(CONVO[:1], add_generation_prompt=False).endswith("assistant\n")
    assert r.render(CONVO[:1]) == tok.apply_chat_template(CONVO[:1], add_generation_prompt=True)


def test_continue_final_message(tok):
    r = ChatRenderer(tok, MEDIA_TOKENS)
    text = r.render_text(CONVO, add_generation_prompt=False, continue_final_message=True)
    assert text.endswith("<|im_start|>assistant\nHello the")
    with pytest.raises(PromptError, match="both"):
        r.render_text(CONVO, continue_final_message=True)
    with pytest.raises(PromptError, match="assistant"):
        r.render_text(CONVO[:1], add_generation_prompt=False, continue_final_message=True)


def test_chat_template_kwargs_reach_the_template(tok):
    r = ChatRenderer(tok, MEDIA_TOKENS)
    assert "Picture 1: " in r.render_text(CONVO[:1], chat_template_kwargs={"add_vision_id": True})
    with pytest.raises(PromptError, match="may not set"):
        r.render_text(CONVO[:1], chat_template_kwargs={"add_generation_prompt": False})


def test_fallback_template_without_chat_template(tok):
    bare = Tokenizer(tok.backend, None, tok.special)
    r = ChatRenderer(bare, MEDIA_TOKENS)
    text = r.render_text(CONVO[:1])
    assert text == "user: <|vision_start|><|image_pad|><|vision_end|>hi<|im_end|>\nassistant: "
    ids = r.render(CONVO[:1])
    assert 3006 in ids and 3002 in ids


class BatchEncodingTokenizer:
    """Shaped like a transformers 5 tokenizer that answers dicts / nested lists."""

    chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"

    def __init__(self, inner: Tokenizer, shape: str) -> None:
        self.inner, self.shape = inner, shape

    def apply_chat_template(self, messages, tokenize=False, **kw):
        text = "".join(m["content"] for m in messages)
        return [text] if self.shape == "nested" else text

    def encode(self, text, add_special_tokens=False):
        ids = self.inner.encode(text, add_special_tokens=False)
        return {"input_ids": [ids], "attention_mask": [[1] * len(ids)]} if self.shape == "dict" else [ids]


@pytest.mark.parametrize("shape", ["dict", "nested"])
def test_every_return_shape(tok, shape):
    r = ChatRenderer(BatchEncodingTokenizer(tok, shape), MEDIA_TOKENS)
    assert r.render([{"role": "user", "content": "hello world"}]) == tok.encode("hello world",
                                                                                 add_special_tokens=False)


def test_transformers_tokenizer_renders_the_same_ids(tok):
    from transformers import AutoTokenizer

    from mm_infer.prompt.templating import flat_token_ids

    hf = AutoTokenizer.from_pretrained(CKPT)
    convo = CONVO + [{"role": "user", "content": "again"}]
    ours = ChatRenderer(tok, MEDIA_TOKENS).render(convo)
    assert ChatRenderer(hf, MEDIA_TOKENS).render(convo) == ours
    batch_encoding = hf.apply_chat_template(convo, tokenize=True, add_generation_prompt=True)
    assert flat_token_ids(batch_encoding) == ours
    assert ChatRenderer(hf, MEDIA_TOKENS).eos_text == "<|im_end|>"


def test_a_wave_of_threads_compiles_the_template_once(monkeypatch):
    """A server's first requests render on many threads at once: the checkpoint's template compiles once, and every
    thread gets the same text (a compile per thread costs tens of milliseconds each, under the import lock)."""
    import threading

    from mm_infer.prompt import tokenizer as tokenizer_module

    fresh = Tokenizer.from_pretrained(CKPT)
    compiles = []
    real = tokenizer_module._compile_template

    def slow_compile(source):
        compiles.append(source)
        threading.Event().wait(0.05)  # long enough for every thread to arrive while the first compiles
        return real(source)

    monkeypatch.setattr(tokenizer_module, "_compile_template", slow_compile)
    messages = [{"role": "user", "content": "hi"}]
    texts: list[str] = []
    threads = [threading.Thread(target=lambda: texts.append(fresh.apply_chat_template(messages, tokenize=False)))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(compiles) == 1 and len(texts) == 8 and len(set(texts)) == 1


def test_a_template_that_reads_strings_gets_text_parts_joined_as_vllm_does():
    """vLLM's content format `auto`: a template that loops over message['content'] gets OpenAI's parts; any other
    gets text-only content as one string, the parts joined by newlines (a custom template would otherwise print the
    list's Python repr: the differential suite's thinking template gave 44 prompt tokens against vLLM's 18)."""
    from mm_infer.prompt.content_format import reads_parts, text_parts_joined

    qwen = "{% for m in messages %}{% for content in m['content'] %}{{ content['text'] }}{% endfor %}{% endfor %}"
    plain = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    assert reads_parts(qwen) and not reads_parts(plain) and not reads_parts("{% for x in %}")  # unparsable: strings
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert text_parts_joined(parts, plain) == [{"role": "user", "content": "a\nb"}]
    assert text_parts_joined(parts, qwen) == parts
    with_image = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image"}]}]
    assert text_parts_joined(with_image, plain) == with_image  # no placeholder texts given: the parts stay
    pad = "<|vision_start|><|image_pad|><|vision_end|>"  # vLLM: placeholders first, then the texts
    assert text_parts_joined(with_image, plain, {"image": pad}) == [{"role": "user", "content": f"{pad}\na"}]
