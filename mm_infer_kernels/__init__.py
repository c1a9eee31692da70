"""GPU kernels, one per module (Triton kernel, launcher, torch reference): vision ops and paged LM attention."""
