"""Request and response bodies (pydantic, vLLM's shapes and fields), errors, and bodies to SamplingParams."""
