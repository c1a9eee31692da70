"""Weight transfer between a trainer and engines: broadcast groups (gloo, NCCL), the packed wire format, receivers."""
