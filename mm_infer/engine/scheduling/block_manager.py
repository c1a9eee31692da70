"""BlockManager: a fixed pool of paged KV blocks with ref counts and a hash-chained prefix cache."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from mm_infer.engine.scheduling.sequence import Sequence
from mm_infer.engine.scheduling.state_slots import StateSlots


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: bytes | None = None  # set once the block is full, computed and registered in the cache
    routing: np.ndarray | None = None  # [block_size, L, k] its tokens' MoE routing (R3), kept and dropped with hash
    state_slot: int | None = None  # hybrid models: the recurrent-state snapshot at its end, kept and dropped with hash


@dataclass
class PrefixCacheStats:
    queries: int = 0  # prompt tokens of admitted sequences
    hits: int = 0  # of which served from cache


class BlockManager:
    """Owns every KV block. Free blocks keep their hash until reused, so they still serve prefix hits (LRU)."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 states: StateSlots | None = None) -> None:
        self.states = states  # hybrid models: live state slots, and the snapshots a prefix hit needs
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_ids: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))  # oldest first
        self.used_ids: set[int] = set()
        self.hash_to_block: dict[bytes, int] = {}
        self.stats = PrefixCacheStats()

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_ids)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def match_prefix(self, seq: Sequence) -> int:
        """Pin cached full blocks of seq's tokens (at least one token is left to compute); return tokens hit."""
        assert not seq.block_table and seq.num_computed_tokens == 0, "match_prefix on a fresh sequence only"
        if not self.enable_prefix_caching:
            return 0
        max_blocks = (len(seq) - 1) // self.block_size
        ids: list[int] = []
        while len(ids) < max_blocks:
            block_id = self.hash_to_block.get(seq.block_hash(len(ids), self.block_size))
            if block_id is None or (seq.routing is not None and self.blocks[block_id].routing is None):
                break  # a hit must bring the routing its tokens had (R3); without it they are computed again
            ids.append(block_id)
        if self.states is not None:  # a hybrid model's hit must end where a recurrent-state snapshot was kept
            while ids and self.blocks[ids[-1]].state_slot is None:
                ids.pop()
        for hit, block_id in enumerate(ids):
            self._take(block_id)
            seq.block_table.append(block_id)
            if seq.routing is not None:
                seq.routing.put(hit * self.block_size, self.blocks[block_id].routing)  # type: ignore[arg-type]
        if self.states is not None and ids:
            seq.restore_slot = self.blocks[ids[-1]].state_slot
            self.states.touch(seq.restore_slot)  # type: ignore[arg-type]
            self.states.stats.restores += 1
        num_tokens = len(ids) * self.block_size
        seq.num_computed_tokens = num_tokens
        seq.num_cached_tokens = num_tokens
        return num_tokens

    def can_allocate(self, seq: Sequence, num_tokens: int) -> bool:
        return self.blocks_needed(num_tokens) - len(seq.block_table) <= self.num_free_blocks

    def allocate(self, seq: Sequence, num_tokens: int) -> bool:
        """Grow seq's block table to hold num_tokens tokens (and give it a live state slot, hybrid models); False
        (nothing changed) if the pool is short."""
        needs_slot = self.states is not None and seq.state_slot is None
        if len(seq.block_table) * self.block_size >= num_tokens and not needs_slot:
            return True
        if not self.can_allocate(seq, num_tokens) or (needs_slot and not self.states.free_live):  # type: ignore[union-attr]
            return False
        if needs_slot:
            seq.state_slot = self.states.take_live()  # type: ignore[union-attr]
        for _ in range(self.blocks_needed(num_tokens) - len(seq.block_table)):
            block_id = next(iter(self.free_ids))
            block = self.blocks[block_id]
            if block.hash is not None:  # evict the cached content it held
                if self.hash_to_block.get(block.hash) == block_id:
                    del self.hash_to_block[block.hash]
                self._drop_cached(block)
            self._take(block_id)
            seq.block_table.append(block_id)
        return True

    def _drop_cached(self, block: Block) -> None:
        """Forget what a block caches: its hash, routing and state snapshot."""
        if block.state_slot is not None and self.states is not None:
            self.states.give_snapshot(block.state_slot)
        block.hash, block.routing, block.state_slot = None, None, None

    def take_snapshot_slot(self) -> int | None:
        """A state slot for a new snapshot: a free one, else the oldest whose block no sequence holds."""
        assert self.states is not None
        taken = self.states.take_snapshot(lambda b: self.blocks[b].ref_count == 0)
        if taken is None:
            return None
        slot, old_owner = taken
        if old_owner is not None:  # it keeps its KV and hash, but no longer its state
            self.blocks[old_owner].state_slot = None
        return slot

    def commit(self, seq: Sequence) -> None:
        """Register the hashes of seq's full, computed blocks so later sequences can hit them."""
        if not self.enable_prefix_caching:
            return
        full = min(seq.num_computed_tokens // self.block_size, len(seq.block_table))
        for i in range(seq.num_committed_blocks, full):
            block = self.blocks[seq.block_table[i]]
            if block.hash is None:
                h = seq.block_hash(i, self.block_size)
                if h not in self.hash_to_block:  # a twin computed elsewhere keeps the cache entry
                    self.hash_to_block[h] = block.block_id
                    block.hash = h
                    if seq.routing is not None:
                        block.routing = seq.routing.rows(i * self.block_size, (i + 1) * self.block_size)
                for pos, slot in list(seq.pending_snapshots):
                    if pos == (i + 1) * self.block_size:
                        self._keep_snapshot(seq, (pos, slot), self.blocks[self.hash_to_block[h]])
        seq.num_committed_blocks = max(seq.num_committed_blocks, full)
        self.drop_pending(seq, up_to=seq.num_computed_tokens)  # behind, and no block took them (a twin had one)

    def _keep_snapshot(self, seq: Sequence, pending: tuple[int, int], block: Block) -> None:
        """The state seq's step wrote at this block's end becomes the block's snapshot (unless it has one)."""
        assert self.states is not None
        if block.state_slot is None:
            block.state_slot = pending[1]
            self.states.own(block.state_slot, block.block_id)
            seq.pending_snapshots.remove(pending)

    def drop_pending(self, seq: Sequence, up_to: int | None = None) -> None:
        """Give back the snapshot slots a sequence's chunk was to write (those at positions <= up_to), unused."""
        keep = []
        for pos, slot in seq.pending_snapshots:
            if up_to is None or pos <= up_to:
                if self.states is not None:
                    self.states.give_snapshot(slot)
            else:
                keep.append((pos, slot))
        seq.pending_snapshots = keep

    def free(self, seq: Sequence) -> None:
        """Release seq's blocks (most recent last, so the prefix is evicted last)."""
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.used_ids.discard(block_id)
                self.free_ids[block_id] = None
                if block.hash is None:  # uncached blocks go first in line for reuse
                    self.free_ids.move_to_end(block_id, last=False)
        if seq.state_slot is not None and self.states is not None:
            self.states.give_live(seq.state_slot)
        seq.state_slot = seq.restore_slot = None
        self.drop_pending(seq)
        seq.block_table = []
        seq.num_computed_tokens = 0
        seq.num_committed_blocks = 0

    def reset_prefix_cache(self) -> None:
        """Forget every cached hash (after a weight update the cached KV is stale)."""
        for block_id in list(self.hash_to_block.values()):
            self._drop_cached(self.blocks[block_id])
        self.hash_to_block.clear()

    def _take(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self.free_ids[block_id]
            self.used_ids.add(block_id)
        block.ref_count += 1

    def check_invariants(self, live: Iterable[Sequence]) -> None:
        """Raise AssertionError unless free + used = total, refs match tables and no block is owned twice."""
        live = list(live)
        assert not (set(self.free_ids) & self.used_ids), "a block is both free and used"
        assert len(self.free_ids) + len(self.used_ids) == self.num_blocks, "free + used != total"
        refs = [0] * self.num_blocks
        for seq in live:
            assert len(set(seq.block_table)) == len(seq.block_table), f"seq {seq.seq_id} holds a block twice"
            for block_id in seq.block_table:
                refs[block_id] += 1
        for block in self.blocks:
            assert block.ref_count == refs[block.block_id], f"block {block.block_id} ref count mismatch"
            assert (block.ref_count > 0) == (block.block_id in self.used_ids), f"block {block.block_id} state"
            assert block.ref_count <= 1 or block.hash is not None, f"shared block {block.block_id} not cached"
            assert block.hash is not None or block.routing is None, f"block {block.block_id} keeps stale routing"
            assert block.hash is not None or block.state_slot is None, f"block {block.block_id} keeps a stale state"
        if self.states is not None:
            seqs = list(live)
            self.states.check_invariants([s.state_slot for s in seqs if s.state_slot is not None],
                                         [slot for s in seqs for _, slot in s.pending_snapshots])
        for h, block_id in self.hash_to_block.items():
            assert self.blocks[block_id].hash == h, "hash table points to a block holding other content"
