"""Chat messages to a prompt, and the checks before costly work (admission, per-prompt limits)."""
