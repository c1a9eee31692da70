"""vLLM's chat content format: a template that never loops over a message's content parts gets each message's
content as one string (media placeholders, then the texts, joined with newlines), as vLLM's
`--chat-template-content-format auto` decides."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import jinja2
from jinja2 import nodes


def _iterates_content(it: nodes.Node) -> bool:
    while isinstance(it, nodes.Filter | nodes.Test) and it.node is not None:  # `content | selectattr(...)`
        it = it.node
    if isinstance(it, nodes.Getitem):
        return isinstance(it.arg, nodes.Const) and it.arg.value == "content"
    if isinstance(it, nodes.Getattr):
        return it.attr == "content"
    return isinstance(it, nodes.Name) and it.name == "content"


@lru_cache(maxsize=64)
def reads_parts(template: str) -> bool:
    """Whether the template loops over `message['content']` (OpenAI's list of parts); a template that cannot be
    parsed is taken as reading strings, as vLLM does."""
    try:
        tree = jinja2.Environment().parse(template)
    except jinja2.TemplateSyntaxError:
        return False
    return any(_iterates_content(loop.iter) for loop in tree.find_all(nodes.For))


def text_parts_joined(messages: Sequence[Mapping[str, Any]], template: Any,
                      media_tokens: Mapping[str, str] | None = None) -> list[Mapping[str, Any]]:
    """For a template that reads strings: each message whose content is a list of parts, as one string (vLLM's
    string format): the media parts' placeholder texts first, then the text parts, all joined by newlines. Without
    `media_tokens` a message with media keeps its parts."""
    if not isinstance(template, str) or reads_parts(template):
        return list(messages)
    out: list[Mapping[str, Any]] = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list) and content and all(isinstance(p, Mapping) for p in content):
            texts = [str(p.get("text", "")) for p in content if p.get("type") == "text"]
            media = [p.get("type") for p in content if p.get("type") != "text"]
            if not media or (media_tokens is not None and all(kind in media_tokens for kind in media)):
                placeholders = [media_tokens[kind] for kind in media] if media_tokens else []
                m = {**m, "content": "\n".join([*placeholders, "\n".join(texts)])}
        out.append(m)
    return out
