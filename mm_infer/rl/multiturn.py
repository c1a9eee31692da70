"""Multi-turn rollouts: each sample continues on the model's exact tokens, spliced into the templated next turn."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mm_infer.engine.engine import LLMEngine
from mm_infer.engine.sampling.params import SamplingParams
from mm_infer.prompt.chat_prompt import CarriedTurn, ChatPrompt, chat_token_ids
from mm_infer.prompt.inputs import PromptInput, media_fields
from mm_infer.prompt.request import VLMRequest
from mm_infer.rl.rollout import RewardFn, RolloutAbortedError, RolloutRow, run_to_completion

# (row, turn index, assistant text so far in this sample) -> the next user message text, or None to stop.
NextUserFn = Callable[[RolloutRow, int, str], str | None]
_ids = itertools.count()


@dataclass
class Turn:
    """One assistant turn: the exact prompt it saw and what it generated."""

    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str


@dataclass
class Trajectory:
    """One sample's whole conversation; the last turn's prompt + tokens hold every earlier turn verbatim."""

    messages: list[Mapping[str, Any]] = field(default_factory=list)  # this sample's conversation so far
    turns: list[Turn] = field(default_factory=list)
    reward: float = 0.0

    def token_ids(self) -> list[int]:
        last = self.turns[-1]
        return last.prompt_token_ids + last.token_ids

    def loss_mask(self) -> list[int]:
        """1 on tokens the model generated (in any turn), 0 on prompt and template tokens."""
        mask = [0] * len(self.token_ids())
        for turn in self.turns:
            start = len(turn.prompt_token_ids)
            mask[start : start + len(turn.token_ids)] = [1] * len(turn.token_ids)
        return mask

    def logprobs(self) -> list[float]:
        """Rollout logprobs of the masked tokens, in order."""
        return [lp for turn in self.turns for lp in turn.logprobs]


def _continuation(first: VLMRequest, ids: list[int]) -> PromptInput:
    """The next turn's prompt: exact ids (media already expanded) and the first turn's own media items, so each
    keeps what its expansion was made from (frame count and times, second_per_grid_t, content hash)."""
    return PromptInput(token_ids=ids, **media_fields(first.items), media_tokens_preexpanded=True,
                       cache_salt=first.cache_salt)


def _next_prompt(engine: LLMEngine, traj: Trajectory, user_text: str) -> list[int]:
    """Splice the sample's exact ids with the template of (its conversation + the new user message)."""
    carried = CarriedTurn(len(traj.messages) - 1, traj.token_ids())  # the conversation so far, as sampled
    traj.messages.append({"role": "user", "content": user_text})
    return chat_token_ids(ChatPrompt(traj.messages, carried=carried), engine.preparer.renderer)


def generate_multiturn(engine: LLMEngine, rows: Sequence[RolloutRow], next_user: NextUserFn, reward_fn: RewardFn,
                       params: SamplingParams, *, max_turns: int = 4) -> list[list[Trajectory]]:
    """n trajectories per row. Turn 1 shares the prompt (and its KV and vision work) across the n samples;
    later turns continue each sample on its own exact tokens. The reward scores the last assistant text."""
    for row in rows:
        if "messages" not in row.prompt:
            raise ValueError("multi-turn rollouts need chat prompts (a 'messages' key)")
    firsts = [engine.prepare(row.prompt) for row in rows]
    trajs = [[Trajectory([dict(m) for m in row.prompt["messages"]]) for _ in range(params.n)] for row in rows]
    pending: dict[str, tuple[int, int, VLMRequest]] = {f"mt-{next(_ids)}": (r, -1, req)
                                                       for r, req in enumerate(firsts)}
    for turn in range(max_turns):
        finished = _submit_and_run(engine, pending, params, turn)
        pending = {}
        for r, s, out in finished.values():
            for k, c in enumerate(out.outputs):
                traj = trajs[r][k if s < 0 else s]
                traj.turns.append(Turn(list(out.prompt_token_ids), list(c.token_ids), list(c.logprobs), c.text,
                                       str(c.finish_reason)))
                traj.messages.append({"role": "assistant", "content": c.text})
                user = next_user(rows[r], turn, c.text) if turn + 1 < max_turns else None
                if user is not None:
                    ids = _next_prompt(engine, traj, user)
                    cont = engine.prepare(_continuation(firsts[r], ids))
                    pending[f"mt-{next(_ids)}"] = (r, k if s < 0 else s, cont)
        if not pending:
            break
    for r, row in enumerate(rows):
        for traj in trajs[r]:
            traj.reward = float(reward_fn(traj.turns[-1].text, row.ground_truth))
    return trajs


def _submit_and_run(engine: LLMEngine, pending: Mapping[str, tuple[int, int, VLMRequest]], params: SamplingParams,
                    turn: int) -> dict[str, tuple[int, int, Any]]:
    """Queue every pending request (turn 1: n samples each; later: one), run them, fail on any abort."""
    for rid, (_, sample, req) in pending.items():
        p = params if sample < 0 else _one_sample(params, turn, sample)
        engine.add_request(rid, req, p.final_only())
    done = run_to_completion(engine, list(pending))
    out = {}
    for rid, (r, s, _) in pending.items():
        res = done[rid]
        if any(c.finish_reason == "abort" for c in res.outputs):
            raise RolloutAbortedError(f"{rid}: a multi-turn sample was aborted", res)
        out[rid] = (r, s, res)
    return out


def _one_sample(params: SamplingParams, turn: int, sample: int) -> SamplingParams:
    """Later turns run one sample each; seeds stay distinct per (turn, sample) and reproducible."""
    seed = None if params.seed is None else params.seed + 1_000_003 * turn + sample
    return dataclasses.replace(params, n=1, seed=seed)
