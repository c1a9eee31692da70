"""What leaves the engine: request outputs, incremental detokenisation, stop rules, per-request streams and stats."""
