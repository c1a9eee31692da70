"""Which requests a failed model step is to blame on: each request's chunks rerun alone; those that fail again."""

from __future__ import annotations

from collections.abc import Callable

from mm_infer.engine.scheduling.scheduler import ScheduledChunk
from mm_infer.engine.scheduling.sequence import SequenceGroup


def culprits(run: Callable[[list[ScheduledChunk]], object], chunks: list[ScheduledChunk]) -> list[SequenceGroup]:
    """The groups whose chunks fail when run by themselves; all of them if none does (the batch as a whole is
    what fails). A rerun only rewrites KV slots that the next step writes again, so survivors are unaffected."""
    by_group: dict[str, list[ScheduledChunk]] = {}
    for chunk in chunks:
        by_group.setdefault(chunk.seq.group.request_id, []).append(chunk)
    groups = {rid: cs[0].seq.group for rid, cs in by_group.items()}
    if len(by_group) == 1:
        return list(groups.values())
    failed = []
    for rid, group_chunks in by_group.items():
        try:
            run(group_chunks)
        except Exception:
            failed.append(groups[rid])
    return failed or list(groups.values())
