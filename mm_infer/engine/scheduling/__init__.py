"""Which work runs next: requests and samples, the scheduler, paged KV blocks and prefix cache, the encoder cache."""
