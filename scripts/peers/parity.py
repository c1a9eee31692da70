"""Parity harness: one fixed, seeded multimodal chat suite sent to two OpenAI-compatible servers, compared by token.

Usage:
  python scripts/peers/parity.py --a http://127.0.0.1:8000 --b http://127.0.0.1:8001 --out report.json
  python scripts/peers/parity.py --a http://127.0.0.1:8000 --start-hf assets/models/tiny-qwen2-vl   # b: HF reference
  python scripts/peers/parity.py --a http://127.0.0.1:8000 --b http://127.0.0.1:8001 --suite codecs # every parity video
Greedy, logprobs, `return_token_ids`; per turn and in aggregate: prompt ids agreement, exact match of generated ids
(text when a side gives none), first divergence, max |dlogprob| and mean exp|dlogprob| over the agreeing prefix.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from mm_infer.data.parity_suite import DEFAULT_SUITES, SUITES, Case, build_suite  # noqa: E402


@dataclass
class Reply:
    """What one server answered for one turn (None where it gave no such field)."""

    text: str = ""
    prompt_ids: list[int] | None = None
    gen_ids: list[int] | None = None
    logprobs: list[float] | None = None
    tokens: list[str] | None = None
    finish_reason: str | None = None
    message: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    retried_without_ids: bool = False


def parse_reply(body: dict[str, Any]) -> Reply:
    choice = body["choices"][0]
    msg = choice.get("message") or {}
    content = (choice.get("logprobs") or {}).get("content")
    ids = choice.get("token_ids", msg.get("generation_token_ids"))
    return Reply(text=msg.get("content") or "", prompt_ids=body.get("prompt_token_ids", msg.get("prompt_token_ids")),
                 gen_ids=ids, logprobs=[c["logprob"] for c in content] if content is not None else None,
                 tokens=[c["token"] for c in content] if content is not None else None,
                 finish_reason=choice.get("finish_reason"), message=msg)


class Side:
    """One OpenAI-compatible endpoint."""

    def __init__(self, url: str, model: str | None, api_key: str | None, top_logprobs: int, timeout: float) -> None:
        self.url = url.rstrip("/").removesuffix("/v1")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)
        self.model = model or self.http.get("/v1/models").raise_for_status().json()["data"][0]["id"]
        self.top_logprobs = top_logprobs

    def reset_prefix_cache(self) -> str | None:
        """POST /reset_prefix_cache (mm-infer, vLLM); what went wrong, if anything."""
        with contextlib.suppress(httpx.HTTPError):
            resp = self.http.post("/reset_prefix_cache")
            return None if resp.status_code == 200 else f"HTTP {resp.status_code}"
        return "unreachable"

    def chat(self, messages: list[dict[str, Any]], max_tokens: int) -> Reply:
        body = {"model": self.model, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0,
                "logprobs": True, "top_logprobs": self.top_logprobs, "return_token_ids": True}
        try:
            resp = self.http.post("/v1/chat/completions", json=body)
            if retried := resp.status_code == 400 and "return_token_ids" in resp.text:  # refuses the extension
                resp = self.http.post("/v1/chat/completions", json={k: v for k, v in body.items()
                                                                      if k != "return_token_ids"})
            if resp.status_code != 200:
                return Reply(error=f"HTTP {resp.status_code}: {resp.text[:300]}", retried_without_ids=retried)
            reply = parse_reply(resp.json())
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
            return Reply(error=f"{type(exc).__name__}: {exc}"[:300])
        reply.retried_without_ids = retried
        return reply


def carried_message(reply: Reply) -> dict[str, Any]:
    """The assistant message for the next turn, with the server's token ids when it returned them."""
    ids = {k: v for k in ("prompt_token_ids", "generation_token_ids") if (v := reply.message.get(k)) is not None}
    return {"role": "assistant", "content": reply.text} | (ids if len(ids) == 2 else {})


def carried_prefix(prev: Reply, cur: Reply) -> bool | None:
    """Whether a later turn's prompt starts with the earlier turn's exact prompt + generated ids."""
    if cur.prompt_ids is None or prev.prompt_ids is None or prev.gen_ids is None:
        return None
    return cur.prompt_ids[:len(prev.prompt_ids) + len(prev.gen_ids)] == prev.prompt_ids + prev.gen_ids


def run_case(side: Side, case: Case) -> list[Reply]:
    """Each turn sent with the side's own earlier answers; stops at the first error."""
    messages: list[dict[str, Any]] = []
    replies: list[Reply] = []
    for turn, max_tokens in zip(case.turns, case.max_tokens, strict=True):
        if replies:
            messages.append(carried_message(replies[-1]))
        messages.append({"role": "user", "content": turn})
        replies.append(side.chat(messages, max_tokens))
        if replies[-1].error:
            break
    return replies


def first_divergence(a: list[Any], b: list[Any]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare(a: Reply, b: Reply) -> dict[str, Any]:
    """Per-turn metrics; `compare` says whether generated ids or (lacking ids on a side) text were compared."""
    ids = a.gen_ids is not None and b.gen_ids is not None
    both_lp = a.logprobs is not None and b.logprobs is not None
    out: dict[str, Any] = {"compare": "ids" if ids else "text", "logprobs": both_lp,
                           "prompt_ids_match": a.prompt_ids == b.prompt_ids
                           if a.prompt_ids is not None and b.prompt_ids is not None else None,
                           "exact_match": a.gen_ids == b.gen_ids if ids else a.text == b.text,
                           "len_a": len(a.gen_ids if ids else a.tokens or a.text),
                           "len_b": len(b.gen_ids if ids else b.tokens or b.text),
                           "finish_reason": [a.finish_reason, b.finish_reason]}
    seq_a, seq_b, unit = ((a.gen_ids, b.gen_ids, "token") if ids else (a.tokens, b.tokens, "token_str") if both_lp
                          else (list(a.text), list(b.text), "char"))
    div = first_divergence(seq_a or [], seq_b or [])
    out |= {"first_divergence": div, "divergence_unit": unit}
    if not ids:
        out["text"] = [a.text, b.text]
    if both_lp and unit != "char":
        n = min(len(seq_a or []) if div is None else div, len(a.logprobs or []), len(b.logprobs or []))
        d = [abs(x - y) for x, y in zip((a.logprobs or [])[:n], (b.logprobs or [])[:n], strict=True)]
        out |= {"agreeing_tokens": n, "max_dlogprob": max(d, default=0.0),
                "sum_exp_dlogprob": sum(math.exp(x) for x in d),
                "token_mult_prob_error": sum(math.exp(x) for x in d) / n if n else None}
    return out


def aggregate(records: list[dict[str, Any]]) -> dict[str, Any]:
    m = [t["metrics"] for r in records for t in r["turns"] if "metrics" in t]
    prompt = [x["prompt_ids_match"] for x in m if x["prompt_ids_match"] is not None]
    lp = [x for x in m if "agreeing_tokens" in x]
    n_lp = sum(x["agreeing_tokens"] for x in lp)
    return {"turns": len(m), "errors": sum(1 for r in records for t in r["turns"] if "metrics" not in t),
            "compare": "ids" if m and all(x["compare"] == "ids" for x in m) else "text",
            "prompt_ids_match": sum(prompt) / len(prompt) if prompt else None,
            "exact_match": sum(x["exact_match"] for x in m) / len(m) if m else None,
            "max_dlogprob": max((x["max_dlogprob"] for x in lp), default=None),
            "token_mult_prob_error": sum(x["sum_exp_dlogprob"] for x in lp) / n_lp if n_lp else None,
            "agreeing_tokens": n_lp}


def notes_for(records: list[dict[str, Any]]) -> list[str]:
    """Plain-language notes on what a side lacked and what was skipped or rejected."""
    notes: list[str] = []
    for side in ("a", "b"):
        turns = [t[side] for r in records for t in r["turns"] if "error" not in t[side]]
        if turns and all(t["gen_ids"] is None for t in turns):
            notes.append(f"{side} returned no token ids: generated outputs compared as text")
        if turns and all(t["prompt_ids"] is None for t in turns):
            notes.append(f"{side} returned no prompt token ids: prompt_ids_match not measured")
        if turns and all(t["logprobs"] is None for t in turns):
            notes.append(f"{side} returned no logprobs: max_dlogprob and token_mult_prob_error skipped")
        notes += [f"{side} rejected {r['name']} turn {i} ({r['suite']}): {t[side]['error'][:120]}"
                  for r in records for i, t in enumerate(r["turns"]) if "error" in t[side]]
    return notes


def summary_line(agg: dict[str, Any], notes: list[str]) -> str:
    f = {k: "n/a" if agg[k] is None else format(agg[k], spec) for k, spec in (
        ("prompt_ids_match", ".2f"), ("exact_match", ".2f"), ("max_dlogprob", ".1e"), ("token_mult_prob_error", ".6f"))}
    why = "" if agg["compare"] == "ids" else "(no token ids)"
    no_lp = "(no logprobs)" if any("no logprobs" in n for n in notes) else ""
    return (f"compare={agg['compare']}{why} turns={agg['turns']} errors={agg['errors']} "
            f"prompt_ids_match={f['prompt_ids_match']} exact_match={f['exact_match']} "
            f"max_dlogprob={f['max_dlogprob']}{no_lp} token_mult_prob_error={f['token_mult_prob_error']}")


def _reply_dict(r: Reply) -> dict[str, Any]:
    return {"error": r.error} if r.error else {k: v for k, v in asdict(r).items() if k not in ("message", "error")}


def run_parity(a: Side, b: Side, cases: list[Case], reset: bool = False) -> dict[str, Any]:
    records, notes = [], []
    for name, side in (("a", a), ("b", b)):
        if reset and (err := side.reset_prefix_cache()):
            notes.append(f"{name}: could not reset its prefix cache ({err})")
    for case in cases:
        ra, rb = run_case(a, case), run_case(b, case)
        turns = []
        for i in range(max(len(ra), len(rb))):
            x, y = (r[i] if i < len(r) else Reply(error="not sent") for r in (ra, rb))
            turn: dict[str, Any] = {"a": _reply_dict(x), "b": _reply_dict(y)}
            if not x.error and not y.error:
                turn["metrics"] = compare(x, y)
                for name, replies in (("a", ra), ("b", rb)):
                    if i > 0 and (ok := carried_prefix(replies[i - 1], replies[i])) is not None:
                        turn["metrics"][f"{name}_carried_prefix"] = ok
            turns.append(turn)
        records.append({"name": case.name, "suite": case.suite, "turns": turns})
    notes += notes_for(records)
    agg = aggregate(records)
    return {"a": {"url": a.url, "model": a.model}, "b": {"url": b.url, "model": b.model}, "aggregate": agg,
            "notes": notes, "summary": summary_line(agg, notes), "requests": records}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--a", required=True, help="base URL of server a (with or without /v1)")
    p.add_argument("--b", help="base URL of server b (or --start-hf)")
    p.add_argument("--model", help="model name sent to both (default: each server's first /v1/models entry)")
    p.add_argument("--api-key")
    p.add_argument("--suite", default=",".join(DEFAULT_SUITES),
                   help=f"comma-separated subset of {','.join(SUITES)} (codecs: every video in assets/media/videos)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--top-logprobs", type=int, default=2)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--out", help="write the JSON report here")
    p.add_argument("--start-hf", metavar="MODEL_DIR", help="start the HF reference server as side b")
    p.add_argument("--reset-prefix-cache", action="store_true",
                   help="POST /reset_prefix_cache to both first (KV reused from decode steps is not bit-exact)")
    args = p.parse_args(argv)
    suites = [s for s in args.suite.split(",") if s]
    if bad := sorted(set(suites) - set(SUITES)):
        p.error(f"unknown suites {bad}; choose from {list(SUITES)}")
    if (args.b is None) == (args.start_hf is None):
        p.error("give exactly one of --b and --start-hf")
    args.suites = suites
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    with contextlib.ExitStack() as stack:
        if args.start_hf:
            from servers.hf_reference.launch import hf_subprocess

            args.b = stack.enter_context(hf_subprocess(args.start_hf))
        a, b = (Side(u, args.model, args.api_key, args.top_logprobs, args.timeout) for u in (args.a, args.b))
        report = run_parity(a, b, build_suite(args.suites, args.seed), args.reset_prefix_cache)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    for note in report["notes"]:
        print(f"note: {note}")
    print(report["summary"], flush=True)
    return report


if __name__ == "__main__":
    main()
