"""The ``options`` rule, one for every entry point: a dict or list is stored as compact JSON, a str must
already be JSON text both backends take, anything else is ``InvalidBatchInput`` naming ``options``.

The store's functions check JSON text on their hot path in SQL (SQLite's ``json_valid``, PostgreSQL's
``json``); a model write checks it here, in Python, to the same verdict.
"""

from __future__ import annotations

import json
import re
from typing import Any, NoReturn

from .counters import counters
from .errors import InvalidBatchInput

#: The deepest nesting of arrays and objects ``options`` may have on both backends: SQLite's ``json_valid``
#: refuses deeper text, PostgreSQL's ``json`` stores it (and fails with "stack depth" far deeper still).
MAX_JSON_DEPTH = 2000
#: The longest options text (JSON) of a target, in UTF-8 bytes.
MAX_OPTIONS_BYTES = 65_536

_JSON_STRING_OR_BRACKET = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')
# One JSON token after optional whitespace (RFC 8259): what the iterative check below reads.
_TOKEN = re.compile(
    r'[ \t\n\r]*(?:(?P<s>"(?:[^"\\\x00-\x1f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*")'
    r"|(?P<n>-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)|(?P<l>true|false|null)|(?P<p>[\[\]{},:]))"
)
_TRAILING_SPACE = re.compile(r"[ \t\n\r]*\Z")


def refuse(problem: str) -> NoReturn:
    counters.add("invalid_input")
    raise InvalidBatchInput("options", problem)


def options_text(value: Any) -> str:
    """JSON text as given (the store's functions check it in SQL), or a dict/list dumped as compact JSON:
    ``separators=(",", ":")``, non-ASCII kept as UTF-8 (``ensure_ascii=False``), keys in the dict's order."""
    if isinstance(value, str):
        return value if type(value) is str else str.__str__(value)  # what a subclass holds
    if isinstance(value, (dict, list)):
        try:
            return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as exc:
            refuse(f"cannot be stored as JSON: {exc}")
        except RecursionError:
            refuse("cannot be stored as JSON: it is nested too deeply")
    refuse(f"must be JSON text or a dict or list, got {type(value).__name__}")


def checked_options(value: Any) -> str:
    """:func:`options_text`, with JSON text also checked here as the store would: the text a model
    write stores. Valid JSON holds no NaN or Infinity, no NUL, no lone surrogate, at most 2000 levels."""
    text = options_text(value)
    if len(text) > MAX_OPTIONS_BYTES // 4 and len(text.encode("utf-8", "surrogatepass")) > MAX_OPTIONS_BYTES:
        refuse(f"must be at most {MAX_OPTIONS_BYTES} bytes of UTF-8")
    if "\x00" in text:  # never JSON, and SQLite's json_valid stops reading at a NUL
        refuse("is not valid JSON text (it holds a NUL character)")
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            refuse("is not valid UTF-8 text (it contains a lone surrogate)")
    if json_too_deep(text):
        refuse(f"is nested deeper than {MAX_JSON_DEPTH} levels")
    if type(value) is str and not is_json(text):
        refuse(f"is not valid JSON text: {_show(text)}")
    return text


def is_json(text: str) -> bool:
    """Whether ``text`` is one JSON value (RFC 8259: no NaN or Infinity), as both backends judge it."""
    try:
        json.loads(text, parse_constant=_no_constant)
    except ValueError:
        return False
    except RecursionError:  # deeper than Python's parser goes: read it without recursion
        return _is_json_iterative(text)
    return True


def json_too_deep(text: str) -> bool:
    """Whether JSON ``text`` nests arrays and objects deeper than :data:`MAX_JSON_DEPTH` (brackets inside
    strings do not count). Cheap unless the text holds that many opening brackets."""
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH:
        return False
    depth = 0
    for match in _JSON_STRING_OR_BRACKET.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                return True
        elif token in "]}":
            depth -= 1
    return False


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


def _is_json_iterative(text: str) -> bool:
    """The grammar of RFC 8259 read with a stack, not recursion."""
    stack: list[str] = []  # the open containers: "[" or "{"
    expect = "value"  # value, value_or_close, key, key_or_close, colon, comma_or_close, end
    pos = 0
    while expect != "end":
        match = _TOKEN.match(text, pos)
        if match is None:
            return False
        pos, punct = match.end(), match.group("p")
        if expect in ("value", "value_or_close") and punct is None:
            expect = "comma_or_close" if stack else "end"
        elif expect in ("value", "value_or_close") and punct in ("[", "{"):
            stack.append(punct)
            expect = "value_or_close" if punct == "[" else "key_or_close"
        elif expect in ("key", "key_or_close") and match.group("s") is not None:
            expect = "colon"
        elif expect == "colon" and punct == ":":
            expect = "value"
        elif expect == "comma_or_close" and punct == ",":
            expect = "value" if stack[-1] == "[" else "key"
        elif punct in ("]", "}") and stack and _closes(expect, stack[-1], punct):
            stack.pop()
            expect = "comma_or_close" if stack else "end"
        else:
            return False
    return _TRAILING_SPACE.match(text, pos) is not None


def _closes(expect: str, opened: str, punct: str) -> bool:
    """Whether ``punct`` closes the container ``opened`` where the reader is (after a value, or empty)."""
    if opened == "[":
        return punct == "]" and expect in ("comma_or_close", "value_or_close")
    return punct == "}" and expect in ("comma_or_close", "key_or_close")


def _show(value: str) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
