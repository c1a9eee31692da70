"""Incremental detokenisation: each sample's text grows by a short-window decode per token, never a full re-decode."""

from __future__ import annotations

from collections.abc import Callable

Decode = Callable[[list[int], bool], str]


class TextBuffer:
    """Append-only text held as chunks: appends and reads of the tail cost the size of what they touch."""

    def __init__(self) -> None:
        self._chunks: list[str] = []
        self.length = 0

    def append(self, text: str) -> None:
        if text:
            self._chunks.append(text)
            self.length += len(text)

    def since(self, start: int) -> str:
        """Text from character `start` to the end, walking back over the chunks it covers."""
        need, parts = self.length - start, []
        for chunk in reversed(self._chunks):
            if need <= 0:
                break
            parts.append(chunk if len(chunk) <= need else chunk[len(chunk) - need:])
            need -= len(chunk)
        return "".join(reversed(parts))

    def value(self) -> str:
        """The whole text (joined once and kept as one chunk)."""
        if len(self._chunks) > 1:
            self._chunks = ["".join(self._chunks)]
        return self._chunks[0] if self._chunks else ""


class IncrementalDetokenizer:
    """Text of token_ids[start:], one token at a time: decodes only the ids since the last complete character.

    `committed` holds whole characters; `pending` is the decoded tail that still ends in a partial UTF-8
    character (U+FFFD), as a full decode of the ids would show it right now.
    """

    def __init__(self, decode: Decode, skip_special_tokens: bool, start: int) -> None:
        self._decode = decode
        self._skip = skip_special_tokens
        self._prefix = self._read = start  # token_ids[prefix:read] decode to the last committed piece
        self.committed = TextBuffer()
        self.pending = ""

    def push(self, token_ids: list[int]) -> str:
        """Account for the ids appended since the last call; return the newly committed text."""
        prefix_text = self._decode(token_ids[self._prefix:self._read], self._skip)
        new_text = self._decode(token_ids[self._prefix:], self._skip)
        if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
            self.pending = new_text[len(prefix_text):]
            return ""
        delta = new_text[len(prefix_text):]
        self._prefix, self._read = self._read, len(token_ids)
        self.committed.append(delta)
        self.pending = ""
        return delta
