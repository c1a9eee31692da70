"""The differential suite's allowlist: differences from vLLM that are intended and documented, each with its reason."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fnmatch import fnmatchcase

from scripts.peers.diff_compare import Diff, Reply, fold_stream


@dataclass(frozen=True)
class Allowed:
    """Differences on cases named like `case` (a glob), of `kind`, at paths like `path` (a glob), and why; `when`,
    if given, must also hold of vLLM's reply (None when the caller has no reply to show)."""
    case: str
    kind: str
    path: str
    reason: str
    when: Callable[[Reply], bool] | None = None

    def explains(self, case: str, diff: Diff, theirs: Reply | None = None) -> bool:
        if not (fnmatchcase(case, self.case) and diff.kind == self.kind and fnmatchcase(diff.path, self.path)):
            return False
        return self.when is None or (theirs is not None and self.when(theirs))


def _stream_cut_by_length(reply: Reply) -> bool:
    """A stream whose every choice ended for length (max_tokens cut the output)."""
    choices = fold_stream(reply.events or ())["choices"].values()
    return bool(choices) and all(c.get("finish_reason") == "length" for c in choices)


RL_FIELDS = "RL token fields (servers/openai/README.md)"
# ours only, in stream chunks too: left out of the event shapes compared (each still has its allowlist entry
# where a whole answer carries it)
EXTENSION_KEYS = frozenset({"weight_version", "prompt_media", "usage.prompt_tokens_details"})

ALLOWLIST: tuple[Allowed, ...] = (
    Allowed("error.beam_search", "status", "status",
            "beam search is refused with a 400 naming it (docs/vllm-compat.md): RL rollouts sample, and vLLM's "
            "beam search is a separate, slower path whose logprobs are not the sampled token's"),
    Allowed("health", "value", "*", "the /health body is empty on both; only the status is a contract"),
    Allowed("*", "skeleton", "*weight_version", "every answer names the weight version that produced it, so a "
            "trainer can drop rollouts from before a refit (docs/rl-protocols.md)"),
    Allowed("*", "skeleton", "body.prompt_media", "with return_token_ids the prompt's media (grid, content hash, "
            "frames used) come beside its ids, what a trainer needs to rebuild the inputs (" + RL_FIELDS + ")"),
    Allowed("*", "skeleton", "body.choices[].message.prompt_token_ids", "NeMo RL's " + RL_FIELDS),
    Allowed("*", "skeleton", "body.choices[].message.generation_token_ids", "NeMo RL's " + RL_FIELDS),
    Allowed("*", "skeleton", "body.choices[].message.generation_log_probs", "NeMo RL's " + RL_FIELDS),
    Allowed("*", "skeleton", "*reasoning_content", "reasoning_content, the alias vLLM used before `reasoning`, is "
            "kept beside it for clients written against older vLLM servers"),
    Allowed("tokenize.*", "skeleton", "body.placeholders", "/tokenize also gives the media placeholder ranges"),
    Allowed("*", "skeleton", "*usage.prompt_tokens_details", "usage always carries cached_tokens (prefix-cache "
            "hits matter to RL throughput); vLLM sends it with --enable-prompt-tokens-details, accepted here"),
    Allowed("error.bad_role", "status", "status", "an unknown message role is a 400 naming it; vLLM renders it"),
    Allowed("error.image_missing_file", "status", "status", "a missing local media file is the client's error: "
            "400 naming it (vLLM: 500)"),
    Allowed("null.completion.n", "status", "status", "a null n is the default (1), as every optional field sent as "
            "null is; vLLM's completions refuse null for n alone"),
    Allowed("structured.*.json_schema", "status", "status", "these cases send response_format beside a "
            "structured_outputs holding only options (disable_any_whitespace): vLLM 0.32 then finds no constraint "
            "and answers 400; mm-infer applies the options to response_format's schema"),
    Allowed("structured.*.so_json", "value", "*.content", "structured_outputs.disable_any_whitespace is honoured per "
            "request here (compact JSON, vLLM's \",\" and \":\" separators); vLLM 0.32 reads only its server-level "
            "option, so its JSON keeps whitespace"),
    *(Allowed(case, "value", path, "the suite's video (pan_h264_2fps_59.mp4, 59 frames) is one where vLLM's M-RoPE "
              "positions after a video differ from HF's: mm-infer follows HF, the oracle, by default; "
              "--mrope-after-video vllm gives vLLM's ids and logprobs (docs/video.md, test_vllm_peer_video.py)")
      for case in ("*.video.*", "*.video")
      for path in ("*logprob*", "*content*", "*reasoning*", "*.token", "*.bytes*", "*text*")),
    *(Allowed(case, "status", "status", "n > 1 at temperature 0 gives n equal greedy samples here (a GRPO group "
              "evaluated greedily keeps its shape); vLLM 0.32 refuses it with a 400")
      for case in ("*.n", "*.n+*", "*+n", "*+n+*")),  # the cases that set n (named by their fields)
    *(Allowed(case, "value", path, "a token-id prompt that ends inside a UTF-8 character ([2141, 185], [159]): "
              "vLLM primes tokenizers' DecodeStream with the prompt, and a prompt whose text ends in U+FFFD makes "
              "the stream start over, so vLLM's first answer text repeats the whole prompt (' special\ufffdactions'"
              ", then cut at the stop string 'a'). mm-infer's text is the generated tokens' alone. Ids and "
              "logprobs agree") for case, path in (("completion.292.*", "body.choices[].text"),
                                                   ("completion.15.defaults", "stream.choices.0.text"))),
    Allowed("*", "value", "stream.usage.completion_tokens_details.reasoning_tokens", "vLLM's streamed count skips "
            "a token whose text its detokenizer held back (an empty delta, e.g. a partial UTF-8 byte), so it is "
            "one less than vLLM's own count of the same answer unstreamed; mm-infer counts the same streamed or not "
            "(and equals vLLM's unstreamed count)"),
    *(Allowed(case, "skeleton", path, "a logit_bias that forces the reasoning end token over and over: vLLM "
              "0.32 streams the later </think> tokens as content but drops them from the whole answer (content "
              "null); mm-infer keeps them as content both ways, so its stream and its answer agree")
      for case in ("reasoning.*.logit_bias",) for path in ("body.choices[].message.content",)),
    Allowed("error.n_zero", "skeleton", "body.error.param", "the 400 names the field (n); vLLM leaves param null"),
    Allowed("error.top_logprobs_too_many", "value", "body.error.param", "the 400 names the field the client sent "
            "(top_logprobs); vLLM names its internal one (logprobs)"),
    *(Allowed("tools.*", kind, path, "a forced tool call cut by max_tokens: vLLM 0.32 streams its name and partial "
              "arguments as tool_calls but answers the same output unstreamed as content (its hermes parser cannot "
              "load the cut JSON); mm-infer answers content both ways, so its stream and its answer agree",
              when=_stream_cut_by_length)
      for kind, path in (("skeleton", "stream.choices.*.tool_calls"), ("value", "stream.choices.*.content"),
                         ("sse", "events[[]*[]]"))),
    *(Allowed(case, "status", "status", "vLLM 0.32 bug: a media request right after one with the same media "
              "that it refused can find its multimodal cache out of step between API server and engine core "
              "(its log: 'Multi-modal cache miss ... P0/P1 cache drift; returning a retryable response') and "
              "answers 500; the same request alone answers 200 there, with the ids mm-infer gives",
              when=lambda theirs: theirs.status == 500) for case in ("*.video*", "*.image*")),
)


def explained_by(case: str, diff: Diff, theirs: Reply | None = None,
                 allowlist: tuple[Allowed, ...] = ALLOWLIST) -> Allowed | None:
    return next((entry for entry in allowlist if entry.explains(case, diff, theirs)), None)
