"""vLLM's chat content format: a template that never loops over a message's content parts gets text-only content
as one string (the parts joined with newlines), as vLLM's `--chat-template-content-format auto` decides."""

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


def text_parts_joined(messages: Sequence[Mapping[str, Any]], template: Any) -> list[Mapping[str, Any]]:
    """For a template that reads strings: each message whose content is a list of text parts only, with the texts
    joined by newlines (vLLM's string format). Content with media keeps its parts: the template must place them."""
    if not isinstance(template, str) or reads_parts(template):
        return list(messages)
    out: list[Mapping[str, Any]] = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list) and content and all(
                isinstance(p, Mapping) and p.get("type") == "text" for p in content):
            m = {**m, "content": "\n".join(str(p.get("text", "")) for p in content)}
        out.append(m)
    return out
