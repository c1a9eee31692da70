"""The vLLM CPU peer for tests: scripts/peers/vllm_peer.py's launcher, and a marker that skips (with why) without it."""

from __future__ import annotations

import pytest
from script_modules import load_script

_peer = load_script("peers.vllm_peer")
vllm_peer = _peer.vllm_peer
needs_peer = pytest.mark.skipif(not _peer.peer_available(), reason=_peer.SETUP_HINT)
