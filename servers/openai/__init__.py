"""The OpenAI-compatible server: `build_app(state)` and `ServerConfig`; started by `mm-infer serve`."""
