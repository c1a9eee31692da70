"""The jinja sandbox chat templates render in: HF's globals and filters, with string and list growth capped."""

from __future__ import annotations

import contextvars
import json
from collections.abc import Iterable
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

DEFAULT_MAX_CHARS = 64 << 20  # rendered characters when the caller names no cap (the offline library)
_MAX_POW_BITS = 1 << 16  # an integer ** may make at most this many bits
_max_chars: contextvars.ContextVar[int] = contextvars.ContextVar("mm_infer_template_max_chars",
                                                                 default=DEFAULT_MAX_CHARS)


class TemplateSizeError(jinja2.exceptions.SecurityError):
    """A template tried to make a string or list over the render's cap (raised before it is built)."""


def _size(x: Any) -> int | None:
    return len(x) if isinstance(x, (str, list, tuple)) else None


def _over(what: str, size: int) -> TemplateSizeError:
    cap = _max_chars.get()
    unit = "characters" if what == "string" else "items"
    return TemplateSizeError(f"the template would build a {what} of {size} {unit}, over the cap of {cap} "
                             "characters on a rendered prompt")


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """HF's ImmutableSandboxedEnvironment plus caps on `*`, `+` and `**`: `'a' * 10**8` fails at once instead of
    allocating gigabytes. (Intercepted operators are also never constant-folded at compile time.) Loops and the
    filters that pad are bounded by the caller's deadline, not here."""

    intercepted_binops = frozenset({"*", "+", "**"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        cap = _max_chars.get()
        if operator == "*":
            seq, n = (left, right) if isinstance(right, int) else (right, left)
            if (size := _size(seq)) is not None and isinstance(n, int) and size * n > cap:
                raise _over("string" if isinstance(seq, str) else "list", size * n)
        elif operator == "+":
            a, b = _size(left), _size(right)
            if a is not None and b is not None and a + b > cap:
                raise _over("string" if isinstance(left, str) else "list", a + b)
        elif operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
            if abs(left).bit_length() * right > _MAX_POW_BITS:
                raise TemplateSizeError(f"the template would raise {left} to the power {right}: too large a number")
        return super().call_binop(context, operator, left, right)


def compile_template(source: str) -> jinja2.Template:
    """The template with HF's environment: trim_blocks, lstrip_blocks, loop controls, tojson, raise_exception,
    strftime_now."""

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = BoundedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


def render(template: jinja2.Template, max_chars: int | None = None, **context: Any) -> str:
    """The rendered text, refused (TemplateSizeError) as soon as it passes `max_chars` characters."""
    cap = DEFAULT_MAX_CHARS if max_chars is None else max_chars
    token = _max_chars.set(cap)
    try:
        return _join(template.generate(**context), cap)
    finally:
        _max_chars.reset(token)


def _join(chunks: Iterable[str], cap: int) -> str:
    out, total = [], 0
    for chunk in chunks:
        total += len(chunk)
        if total > cap:
            raise TemplateSizeError(f"the rendered prompt passed {cap} characters, the cap on a rendered prompt")
        out.append(chunk)
    return "".join(out)
