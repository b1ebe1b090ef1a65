"""Bounds on what a speech request may carry, checked before any real work.

Pure helpers for the HTTP server: the body is read against a size limit (taken from
``Content-Length`` before reading, counted while reading otherwise) and a deadline; JSON
is refused past a nesting depth; every string in it must be valid Unicode (a lone
surrogate such as ``"\\ud800"`` parses as JSON but cannot be encoded); messages quote
client input only as a short prefix. Each failure is an :class:`APIError`, so the
client gets a 4xx in OpenAI's error shape and the server never a 500.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator

from chattts_runtime.errors import APIError

QUOTE_CHARS = 40  # how much of a client's value an error message may quote


def quote(value: object, limit: int = QUOTE_CHARS) -> str:
    """``repr`` of a client value, cut to a short prefix so an error never echoes long input."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) > limit:
        return repr(text[:limit]) + f"... ({len(text)} characters)"
    return repr(text)


# The rest of an unread body must not be parsed as a next request on the same connection.
_CLOSE = {"Connection": "close"}


async def read_body(chunks: AsyncIterator[bytes], content_length: str | None, *, max_bytes: int,
                    timeout: float) -> bytes:
    """The whole body, or 413 (too large: from the header before reading) / 408 (not in ``timeout``)."""
    if content_length is not None:
        if not content_length.isdigit():
            raise APIError(400, "Content-Length is not a number", code="invalid_content_length", headers=_CLOSE)
        if int(content_length) > max_bytes:
            raise APIError(413, f"request body of {int(content_length)} bytes exceeds the limit of {max_bytes}",
                           code="request_too_large", headers=_CLOSE)

    async def collect() -> bytes:
        parts, size = [], 0
        async for part in chunks:
            size += len(part)
            if size > max_bytes:  # a chunked body has no Content-Length: count as it comes
                raise APIError(413, f"request body exceeds the limit of {max_bytes} bytes",
                               code="request_too_large", headers=_CLOSE)
            parts.append(part)
        return b"".join(parts)

    try:
        return await asyncio.wait_for(collect(), timeout)
    except TimeoutError:
        raise APIError(408, f"request body did not arrive within {timeout:g} s",
                       code="request_timeout", headers=_CLOSE) from None


def nesting_depth_exceeds(raw: bytes, max_depth: int) -> bool:
    """Whether brackets outside strings nest deeper than ``max_depth`` (a linear scan, no recursion)."""
    depth, in_string, escaped = 0, False, False
    # bytes.translate keeps only the characters that matter, so the Python loop runs over few of them
    for byte in raw.translate(None, _NOT_STRUCTURAL):
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            if depth > max_depth:
                return True
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return False


_NOT_STRUCTURAL = bytes(b for b in range(256) if b not in b'[]{}"\\')


def parse_json_object(raw: bytes, *, max_depth: int) -> dict[str, Any]:
    if nesting_depth_exceeds(raw, max_depth):
        raise APIError(400, f"request body nests deeper than {max_depth} levels", code="invalid_json")
    try:
        payload = json.loads(raw)
    except json.JSONDecodeError as err:
        raise APIError(400, f"request body is not valid JSON: {err.msg} at position {err.pos}",
                       code="invalid_json") from None
    except (UnicodeDecodeError, ValueError, RecursionError):  # not UTF-8; an integer of > 4300 digits
        raise APIError(400, "request body is not valid JSON (bad encoding or a number too long)",
                       code="invalid_json") from None
    if not isinstance(payload, dict):
        raise APIError(400, "request body must be a JSON object", code="invalid_json")
    check_unicode(payload)
    return payload


def printable(text: str, limit: int = QUOTE_CHARS) -> str:
    """A client string made safe to put in a message or header: escaped, cut to ``limit``."""
    return text[:limit].encode("unicode_escape").decode("ascii")  # control characters escaped too


def check_unicode(value: Any) -> None:
    """Every string (keys too) must encode as UTF-8: JSON admits lone surrogates, nothing after it does."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise APIError(400, f"{where or 'body'}: text is not valid Unicode (a lone surrogate)",
                               param=where or None, code="invalid_unicode") from None
        elif isinstance(item, dict):
            for key, sub in item.items():
                name = f"{where}.{printable(key)}" if where else printable(key)
                stack.append((name, key))
                stack.append((name, sub))
        elif isinstance(item, list):
            stack.extend((f"{where}[{i}]", sub) for i, sub in enumerate(item))


def unknown_fields(payload: dict[str, Any], model: type) -> list[str]:
    """Keys of ``payload`` that the pydantic ``model`` does not declare (by name or alias).

    Derived from the model, so an extension field added to it is accepted with no list to update."""
    known = set()
    for name, field in model.model_fields.items():
        known.add(name)
        if field.alias:
            known.add(field.alias)
    return [key for key in payload if key not in known]


def names_for_header(names: list[str], limit: int = 8) -> str:
    """A bounded, header-safe list of field names (ASCII, no separators of their own)."""
    shown = [printable(name).replace(",", "\\x2c") for name in names[:limit]]
    return ", ".join(shown) + (f", ... ({len(names)} in all)" if len(names) > limit else "")
