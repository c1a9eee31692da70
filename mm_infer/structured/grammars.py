"""Grammars: the engine's handle on structured outputs, compiled off the step loop; xgrammar (and transformers)
load on the first grammar, on a compile thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any

from mm_infer.config import StructuredConfig
from mm_infer.structured.params import GrammarError, GrammarKey, StructuredOutputsParams

if TYPE_CHECKING:
    from mm_infer.structured.compiler import GrammarCompiler


class Grammars:
    """Compiles specs on `grammar_threads` threads of its own (cached, byte-bounded; one compile per spec however
    many requests wait on it) under a size cap and a deadline, and makes one matcher per sample. A request waits
    for its own grammar only: `submit` never blocks; `compile` blocks, `wait` awaits, the one caller."""

    def __init__(self, tokenizer: Callable[[], Any], model_dir: str, vocab_size: int, stop_ids: Sequence[int],
                 config: StructuredConfig | None = None, capacity: int = 64) -> None:
        self._tokenizer = tokenizer
        self.model_dir = model_dir
        self.vocab_size = vocab_size
        self.stop_ids = list(stop_ids)
        self.config = config or StructuredConfig()
        self.capacity = capacity
        self._compiler: GrammarCompiler | None = None
        self._lock = threading.Lock()  # the compiler's construction
        self._inflight: dict[GrammarKey, Future[Any]] = {}
        self._inflight_lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    @property
    def timeout_s(self) -> float:
        return self.config.grammar_timeout_s

    @property
    def compiler(self) -> GrammarCompiler:
        """Built once (importing xgrammar and TokenizerInfo from the tokenizer take seconds); thread-safe."""
        with self._lock:
            if self._compiler is None:
                from mm_infer.structured.compiler import GrammarCompiler, hf_tokenizer, tokenizer_info

                hf = hf_tokenizer(self._tokenizer(), self.model_dir)
                self._compiler = GrammarCompiler(tokenizer_info(hf, self.vocab_size, self.stop_ids), self.capacity,
                                                 cache_bytes=int(self.config.grammar_cache_bytes))
            return self._compiler

    def submit(self, spec: StructuredOutputsParams) -> Future[Any]:
        """The compiled grammar as a future (done already on a cache hit); GrammarError at once for a spec over the
        size cap. The future raises GrammarError for an invalid spec."""
        key = spec.key()
        size, cap = len(key[1].encode()), int(self.config.max_grammar_bytes)
        if size > cap:
            raise GrammarError(f"the structured outputs {spec.kind} spec is {size} bytes, over this server's limit of "
                               f"{cap} bytes (max_grammar_bytes, --max-grammar-bytes)")
        if self._compiler is not None and (hit := self._compiler.lookup(key)) is not None:
            done: Future[Any] = Future()
            done.set_result(hit)
            return done
        with self._inflight_lock:
            if (running := self._inflight.get(key)) is not None:
                return running
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.config.grammar_threads, thread_name_prefix="mm-infer-grammar")
            future = self._inflight[key] = self._pool.submit(self._compile, spec, key)
            return future

    def _compile(self, spec: StructuredOutputsParams, key: GrammarKey) -> Any:
        try:
            return self.compiler.compile(spec, key)
        finally:
            with self._inflight_lock:
                self._inflight.pop(key, None)

    def timed_out(self) -> GrammarError:
        return GrammarError(f"the structured outputs grammar did not compile within {self.timeout_s:g}s "
                            "(grammar_timeout_s, --grammar-timeout): simplify the schema")

    def compile(self, spec: StructuredOutputsParams | None) -> Any:
        """The compiled grammar, or None without a spec; GrammarError (a 400) if it is invalid, over the size cap
        or not compiled within the deadline. Blocks the calling thread only."""
        if spec is None:
            return None
        try:
            return self.submit(spec).result(timeout=self.timeout_s)
        except FutureTimeout:
            raise self.timed_out() from None

    async def wait(self, spec: StructuredOutputsParams | None) -> Any:
        """`compile` for a coroutine: awaits the compile without holding a thread."""
        if spec is None:
            return None
        future = self.submit(spec)
        try:  # shielded: this request's deadline must not cancel a compile other requests share
            return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), self.timeout_s)
        except asyncio.TimeoutError:
            raise self.timed_out() from None

    def matcher(self, compiled: Any) -> Any:
        return None if compiled is None else self.compiler.matcher(compiled)
