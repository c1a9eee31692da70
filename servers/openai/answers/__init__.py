"""Engine outputs to answers: one engine request per HTTP request, the SSE skeleton, parsers, logprobs and usage."""
