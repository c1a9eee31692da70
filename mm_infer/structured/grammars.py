"""Grammars: the engine's handle on structured outputs; xgrammar (and transformers) load on the first grammar."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from mm_infer.structured.params import StructuredOutputsParams

if TYPE_CHECKING:
    from mm_infer.structured.compiler import GrammarCompiler


class Grammars:
    """Compiles specs (cached) and makes one matcher per sample; engines that never see a grammar pay nothing."""

    def __init__(self, tokenizer: Callable[[], Any], model_dir: str, vocab_size: int, stop_ids: Sequence[int],
                 capacity: int = 64) -> None:
        self._tokenizer = tokenizer
        self.model_dir = model_dir
        self.vocab_size = vocab_size
        self.stop_ids = list(stop_ids)
        self.capacity = capacity
        self._compiler: GrammarCompiler | None = None
        self._lock = threading.Lock()

    @property
    def compiler(self) -> GrammarCompiler:
        """Built once (TokenizerInfo from the tokenizer takes seconds); thread-safe."""
        with self._lock:
            if self._compiler is None:
                from mm_infer.structured.compiler import GrammarCompiler, hf_tokenizer, tokenizer_info

                hf = hf_tokenizer(self._tokenizer(), self.model_dir)
                self._compiler = GrammarCompiler(tokenizer_info(hf, self.vocab_size, self.stop_ids), self.capacity)
            return self._compiler

    def compile(self, spec: StructuredOutputsParams | None) -> Any:
        """The compiled grammar (cached per spec), or None without a spec; GrammarError (a 400) if it is invalid."""
        return None if spec is None else self.compiler.compile(spec)

    def matcher(self, compiled: Any) -> Any:
        return None if compiled is None else self.compiler.matcher(compiled)
