"""RL integration: one rollout pipeline with token-exact records, and trainer-side helpers."""

from mm_infer.rl.rollout import (
                                 RolloutAbortedError,
                                 RolloutGroup,
                                 RolloutRow,
                                 RolloutSample,
                                 generate_rollouts,
                                 group_advantages,
)
from mm_infer.rl.trainer_inputs import completion_logprobs, hf_inputs, token_mult_prob_error

__all__ = ["RolloutAbortedError", "RolloutGroup", "RolloutRow", "RolloutSample", "generate_rollouts",
           "completion_logprobs", "group_advantages", "hf_inputs", "token_mult_prob_error"]
