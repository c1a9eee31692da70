"""A light tokenizer on the `tokenizers` backend + the checkpoint's jinja chat template (no transformers import)."""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mm_infer.prompt.jinja_env import compile_template as _compile_template
from mm_infer.prompt.jinja_env import render


class Tokenizer:
    """encode / decode / apply_chat_template with HF semantics for Qwen-style checkpoints."""

    def __init__(self, backend: Any, chat_template: str | None, special: Mapping[str, str | None]) -> None:
        self.backend = backend
        self.chat_template = chat_template
        self.special = dict(special)
        self._compiled: Any = None
        self._others: dict[str, Any] = {}  # compiled per-call templates, by source (a few kept)
        self._compile_lock = threading.Lock()

    @staticmethod
    def from_pretrained(model_dir: str | Path) -> Tokenizer:
        from tokenizers import Tokenizer as Backend

        root = Path(model_dir)
        config = json.loads((root / "tokenizer_config.json").read_text()) if (
            root / "tokenizer_config.json").exists() else {}
        template = config.get("chat_template")
        if (root / "chat_template.jinja").exists():
            template = (root / "chat_template.jinja").read_text()
        special = {k: config.get(k) for k in ("bos_token", "eos_token", "pad_token", "unk_token")}
        special = {k: (v.get("content") if isinstance(v, dict) else v) for k, v in special.items()}
        return Tokenizer(Backend.from_file(str(root / "tokenizer.json")), template, special)

    @property
    def vocab_size(self) -> int:
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    @property
    def eos_token_id(self) -> int | None:
        eos = self.special.get("eos_token")
        return None if eos is None else self.backend.token_to_id(eos)

    def convert_tokens_to_ids(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return str(self.backend.decode(list(token_ids), skip_special_tokens=skip_special_tokens))

    def _template(self, source: str | None) -> Any:
        """The compiled template; compiled once, under a lock (a server's first wave of requests renders on many
        threads at once, and each compile takes tens of milliseconds)."""
        with self._compile_lock:
            if source is None or source == self.chat_template:
                if self.chat_template is None:
                    raise ValueError("this checkpoint has no chat template")
                if self._compiled is None:
                    self._compiled = _compile_template(self.chat_template)
                return self._compiled
            if source not in self._others:
                if len(self._others) >= 8:
                    self._others.clear()
                self._others[source] = _compile_template(source)
            return self._others[source]

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], tokenize: bool = True,
                            add_generation_prompt: bool = False, chat_template: str | None = None,
                            max_chars: int | None = None, **kwargs: Any) -> list[int] | str:
        """HF semantics; `chat_template` (jinja text) renders instead of the checkpoint's; a rendering that would
        pass `max_chars` characters fails (jinja_env.TemplateSizeError) before it is built."""
        template = self._template(chat_template)
        text = render(template, max_chars, messages=list(messages), add_generation_prompt=add_generation_prompt,
                      **{**self.special, **kwargs})
        return self.encode(text, add_special_tokens=False) if tokenize else text
