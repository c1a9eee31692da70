"""The differential suite's allowlist: differences from vLLM that are intended and documented, each with its reason."""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

from diff_compare import Diff


@dataclass(frozen=True)
class Allowed:
    """Differences on cases named like `case` (a glob), of `kind`, at paths like `path` (a glob), and why."""
    case: str
    kind: str
    path: str
    reason: str

    def explains(self, case: str, diff: Diff) -> bool:
        return fnmatchcase(case, self.case) and diff.kind == self.kind and fnmatchcase(diff.path, self.path)


ALLOWLIST: tuple[Allowed, ...] = (
    Allowed("error.beam_search", "status", "status",
            "beam search is refused with a 400 naming it (docs/vllm-compat.md): RL rollouts sample, and vLLM's "
            "beam search is a separate, slower path whose logprobs are not the sampled token's"),
    Allowed("health", "value", "*", "the /health body is empty on both; only the status is a contract"),
)


def explained_by(case: str, diff: Diff, allowlist: tuple[Allowed, ...] = ALLOWLIST) -> Allowed | None:
    return next((entry for entry in allowlist if entry.explains(case, diff)), None)
