"""The one place a request's DELTA wire becomes what its reader asked for: deltas as they are, or the cumulative
output assembled once per read; the prompt (text, ids) and prompt logprobs the wire sends once are put back."""

from __future__ import annotations

from typing import Any

from mm_infer.engine.outputs.request_output import OutputAccumulator, RequestOutput
from mm_infer.engine.sampling.params import RequestOutputKind


def wire_kind(kind: RequestOutputKind) -> RequestOutputKind:
    """What an engine behind a process or actor boundary is asked for: deltas, unless only the final output is."""
    return kind if kind is RequestOutputKind.FINAL_ONLY else RequestOutputKind.DELTA


class OutputEdge:
    """One request's outputs at the edge of a wire. `prompt_text` / `prompt_token_ids`: what the server prepared
    (None: keep what the wire carries)."""

    def __init__(self, kind: RequestOutputKind, prompt_text: str | None = None,
                 prompt_token_ids: list[int] | None = None) -> None:
        self.kind = kind
        self.prompt = (prompt_text, prompt_token_ids)
        self.accumulator = OutputAccumulator() if kind is RequestOutputKind.CUMULATIVE else None
        self._scores: tuple[Any, Any, Any] | None = None

    def take(self, out: RequestOutput) -> RequestOutput:
        """The reader's output for one wire output (a delta, or a final output when only that was asked for)."""
        if self.prompt[1] is not None:
            out.prompt, out.prompt_token_ids = self.prompt
        if out.prompt_logprobs is not None:
            self._scores = (out.prompt_logprobs, out.prompt_top_logprobs, out.prompt_ranks)
        elif self._scores is not None:
            out.prompt_logprobs, out.prompt_top_logprobs, out.prompt_ranks = self._scores
        if self.accumulator is None:
            return out
        self.accumulator.add(out)
        whole = self.accumulator.whole()
        assert whole is not None
        return whole
