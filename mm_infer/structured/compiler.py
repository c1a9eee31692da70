"""xgrammar for one engine: TokenizerInfo from the checkpoint tokenizer, compiled grammars in a byte-bounded LRU,
bitmask fill."""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from typing import Any

import numpy as np
import torch
import xgrammar as xgr
from torch import Tensor

from mm_infer.structured.params import GrammarError, GrammarKey, StructuredOutputsParams

__all__ = ["GrammarCompiler", "GrammarError", "choice_grammar", "fill_bitmask", "hf_tokenizer", "tokenizer_info"]

_XGR_PREFIX = re.compile(r"^(\[[\d:]+\] \S+?:\d+: )?(Check failed: \(.*?\) is false: )?")
_WHAT = {"json": "JSON schema", "json_object": "JSON object grammar", "regex": "regex", "choice": "choice",
         "grammar": "EBNF grammar", "structural_tag": "structural tag"}


def hf_tokenizer(tokenizer: Any, model_dir: str) -> Any:
    """A transformers tokenizer for TokenizerInfo: the engine's own (ours wraps a `tokenizers` backend), else the
    checkpoint's, loaded offline."""
    from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

    if isinstance(tokenizer, PreTrainedTokenizerBase):
        return tokenizer
    backend = getattr(tokenizer, "backend", None)
    if backend is not None and hasattr(backend, "to_str"):
        return PreTrainedTokenizerFast(tokenizer_object=backend)
    return AutoTokenizer.from_pretrained(model_dir, local_files_only=True)


def tokenizer_info(hf: Any, vocab_size: int, stop_ids: list[int]) -> xgr.TokenizerInfo:
    """TokenizerInfo over the model's vocab (lm_head rows; ids past the tokenizer's are never allowed). Special
    tokens other than the stop ids get no text, so a grammar never emits them (not even inside a JSON string)."""
    base = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab_size, stop_token_ids=stop_ids)
    vocab = [""] * vocab_size
    for token, idx in hf.get_vocab().items():
        if idx < vocab_size:
            vocab[idx] = token
    special = {t.content for t in getattr(hf, "added_tokens_decoder", {}).values() if t.special}
    for idx, token in enumerate(vocab):
        if token in special and idx not in stop_ids:
            vocab[idx] = ""
    return xgr.TokenizerInfo(vocab, base.vocab_type, vocab_size=vocab_size, stop_token_ids=stop_ids,
                             add_prefix_space=base.add_prefix_space)


def choice_grammar(choices: list[str]) -> str:
    """EBNF accepting exactly one of the strings (JSON string escapes are xgrammar EBNF literals)."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


class GrammarCompiler:
    """Compiles each (kind, spec) once (thread-safe; Grammars calls it on its own threads); keeps the most recently
    used compiled grammars up to `cache_bytes` (xgrammar's count of a grammar's memory) and `capacity` entries. A
    grammar bigger than the whole budget is used but never kept."""

    def __init__(self, info: xgr.TokenizerInfo, capacity: int = 64, max_threads: int = 8,
                 cache_bytes: int = 256 << 20) -> None:
        self.info = info
        self.capacity = capacity
        self.cache_bytes = cache_bytes
        self._compiler = xgr.GrammarCompiler(info, max_threads=max_threads, cache_enabled=False)
        self._cache: OrderedDict[GrammarKey, tuple[xgr.CompiledGrammar, int]] = OrderedDict()
        self._lock = threading.Lock()
        self.cached_bytes = 0
        self.compilations = 0

    def lookup(self, key: GrammarKey) -> xgr.CompiledGrammar | None:
        """The cached grammar (now most recently used), or None."""
        with self._lock:
            if (hit := self._cache.get(key)) is None:
                return None
            self._cache.move_to_end(key)
            return hit[0]

    def compile(self, spec: StructuredOutputsParams, key: GrammarKey | None = None) -> xgr.CompiledGrammar:
        key = key or spec.key()
        if (hit := self.lookup(key)) is not None:
            return hit
        compiled = self._compile(spec)  # outside the lock: other requests' grammars compile meanwhile
        self._keep(key, compiled)
        return compiled

    def _keep(self, key: GrammarKey, compiled: Any) -> None:
        size = int(compiled.memory_size_bytes)
        with self._lock:
            self.compilations += 1
            if size > self.cache_bytes or key in self._cache:
                return
            self._cache[key] = (compiled, size)
            self.cached_bytes += size
            while self.cached_bytes > self.cache_bytes or len(self._cache) > self.capacity:
                _, (_, freed) = self._cache.popitem(last=False)
                self.cached_bytes -= freed

    def _compile(self, spec: StructuredOutputsParams) -> xgr.CompiledGrammar:
        kind, value, c = spec.kind, getattr(spec, spec.kind), self._compiler
        try:
            if kind in ("json", "json_object"):  # json_object: any JSON object (vLLM's rule)
                schema = {"type": "object"} if kind == "json_object" else value
                compact = spec.disable_any_whitespace  # then no whitespace at all, as vLLM's grammar: "," and ":"
                return c.compile_json_schema(schema if isinstance(schema, str) else json.dumps(schema),
                                             any_whitespace=not compact, separators=(",", ":") if compact else None)
            if kind == "regex":
                return c.compile_regex(value)
            if kind == "choice":
                return c.compile_grammar(choice_grammar(value))
            if kind == "grammar":
                return c.compile_grammar(value)
            return c.compile_structural_tag(value)
        except (RuntimeError, ValueError, TypeError) as e:
            detail = _XGR_PREFIX.sub("", str(e).strip()).strip()
            raise GrammarError(f"invalid {_WHAT[kind]} for structured outputs: {detail}") from None

    def matcher(self, compiled: xgr.CompiledGrammar) -> xgr.GrammarMatcher:
        """A fresh matcher (one per sample): it allows the stop tokens only where the grammar may end."""
        return xgr.GrammarMatcher(compiled)


_batch_matcher: xgr.BatchGrammarMatcher | None = None


def fill_bitmask(matchers: list[xgr.GrammarMatcher], vocab_size: int) -> Tensor:
    """[G, ceil(V/32)] int32 on the host: bit t%32 of word t//32 of row g set where matchers[g] allows token t next.
    Filled in numpy memory: a host buffer whatever torch mode the caller runs under."""
    global _batch_matcher
    if _batch_matcher is None:
        _batch_matcher = xgr.BatchGrammarMatcher()
    bitmask = np.full((len(matchers), -(-vocab_size // 32)), -1, dtype=np.int32)  # [G, W], all allowed
    _batch_matcher.batch_fill_next_token_bitmask(matchers, bitmask)
    return torch.from_numpy(bitmask)
