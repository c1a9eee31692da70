"""Side by side with peers: the vLLM CPU peer, the differential suite (diff_*), parity harnesses, TRL NCCL sync."""
