"""Router: least-loaded replica choice with sticky affinity keys (a GRPO group, shared media), and hit counters."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import asdict, dataclass

from mm_infer.distributed.errors import ReplicaUnavailableError
from mm_infer.prompt.request import VLMRequest


def affinity_key(request: VLMRequest, explicit: str | None = None) -> str:
    """The caller's key if given; else the first media item's content hash; else a hash of the prompt ids.

    The n samples of a GRPO group sent as separate requests share the prompt (and its media), so they share a key;
    so do requests about the same image or video, which then hit one replica's encoder and prefix caches.
    """
    if explicit:
        return f"key:{explicit}"
    for placeholder in request.placeholders:
        if placeholder.content_hash:
            return f"media:{placeholder.content_hash}"
    ids = ",".join(map(str, request.prompt_token_ids)).encode()
    return f"prompt:{hashlib.blake2b(ids, digest_size=16).hexdigest()}"


@dataclass
class RouterStats:
    routed: int = 0
    keyed_repeat: int = 0  # requests whose affinity key was pinned to a replica already
    affinity_hits: int = 0  # ... and were sent to that replica
    spills: int = 0  # ... sent elsewhere: the pinned replica had `spill_slack` more sequences than the least loaded
    repins: int = 0  # ... sent elsewhere: the pinned replica was down

    @property
    def hit_rate(self) -> float:
        return self.affinity_hits / self.keyed_repeat if self.keyed_repeat else 1.0

    def as_dict(self) -> dict[str, float]:
        return {**asdict(self), "hit_rate": self.hit_rate}


class Router:
    """Thread-safe: `pick()` on the event loop, `set_up()` from the health checker. Load = sequences in flight."""

    def __init__(self, num_replicas: int, spill_slack: int = 64, max_keys: int = 1 << 16) -> None:
        if num_replicas < 1:
            raise ValueError(f"a router needs at least one replica, got {num_replicas}")
        self.num_replicas = num_replicas
        self.spill_slack = spill_slack
        self.max_keys = max_keys
        self.load = [0] * num_replicas
        self.up = [True] * num_replicas
        self.stats = RouterStats()
        self._pins: OrderedDict[str, int] = OrderedDict()
        self._next = 0  # rotates ties between equally loaded replicas
        self._lock = threading.Lock()

    def _least_loaded(self) -> int:
        live = [i for i in range(self.num_replicas) if self.up[i]]
        if not live:
            raise ReplicaUnavailableError("no engine replica is up (all died or are restarting); retry shortly")
        n = self.num_replicas
        return min(live, key=lambda i: (self.load[i], (i - self._next) % n))

    def pick(self, key: str | None, weight: int = 1) -> int:
        """The replica for one request of `weight` sequences; its load grows until `release()`."""
        with self._lock:
            least = self._least_loaded()
            choice = least
            pinned = self._pins.get(key) if key is not None else None
            if pinned is not None:
                self.stats.keyed_repeat += 1
                if not self.up[pinned]:
                    self.stats.repins += 1
                elif self.load[pinned] - self.load[least] > self.spill_slack:
                    self.stats.spills += 1
                else:
                    choice = pinned
                    self.stats.affinity_hits += 1
            if key is not None:
                if pinned is None or not self.up[pinned]:
                    self._pins[key] = choice
                self._pins.move_to_end(key)
                while len(self._pins) > self.max_keys:
                    self._pins.popitem(last=False)
            if choice == least:
                self._next = (choice + 1) % self.num_replicas
            self.load[choice] += weight
            self.stats.routed += 1
            return choice

    def release(self, replica: int, weight: int = 1) -> None:
        with self._lock:
            self.load[replica] = max(self.load[replica] - weight, 0)

    def set_up(self, replica: int, up: bool) -> None:
        with self._lock:
            self.up[replica] = up

    def pinned(self, key: str) -> int | None:
        with self._lock:
            return self._pins.get(key)
