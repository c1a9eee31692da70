"""RL integration: one rollout pipeline with token-exact records, and trainer-side helpers."""

from mm_infer.rl.multiturn import Trajectory, Turn, generate_multiturn
from mm_infer.rl.rollout import (
                                 RolloutAbortedError,
                                 RolloutGroup,
                                 RolloutRow,
                                 RolloutSample,
                                 generate_rollouts,
                                 group_advantages,
)
from mm_infer.rl.routing_replay import decode_routed_experts, replayed_routing, routing_tensors
from mm_infer.rl.trainer_inputs import (
    completion_logprobs,
    hf_inputs,
    masked_logprobs,
    omni_hf_inputs,
    token_mult_prob_error,
    trainer_hf_inputs,
)

__all__ = [
    "RolloutAbortedError", "RolloutGroup", "RolloutRow", "RolloutSample", "Trajectory", "Turn",
    "completion_logprobs", "generate_multiturn", "generate_rollouts", "group_advantages", "hf_inputs",
    "masked_logprobs", "omni_hf_inputs", "token_mult_prob_error", "trainer_hf_inputs", "decode_routed_experts",
    "replayed_routing", "routing_tensors",
]
