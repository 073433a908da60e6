"""Request parsing for the admin API, pure: query strings and JSON bodies to typed values.

Why a module of its own: every handler's bad input must become a 400 with a JSON error naming the
parameter (never a 500 with a traceback), and these rules are unit-tested without a server.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs

INT64_MAX = (1 << 63) - 1
_INTEGER = re.compile(r"-?[0-9]{1,20}")  # ASCII digits only (str.isdigit also takes other scripts')


class ApiError(Exception):
    """An answer other than 200: ``status`` and a message the client gets as ``{"error": ...}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def bad_request(message: str) -> ApiError:
    return ApiError(400, message)


def parse_query(query: str) -> dict[str, str]:
    """``a=1&b=x`` -> {"a": "1", "b": "x"}; a repeated parameter is a 400 (which one would win is
    a guess the caller should not have to make)."""
    try:
        parsed = parse_qs(query, keep_blank_values=True, strict_parsing=False, max_num_fields=100)
    except ValueError as e:
        raise bad_request(f"bad query string: {e}") from e
    out: dict[str, str] = {}
    for key, values in parsed.items():
        if len(values) != 1:
            raise bad_request(f"parameter {key!r} is given {len(values)} times")
        out[key] = values[0]
    return out


def int_param(params: Mapping[str, str], name: str, *, default: int | None = None, minimum: int = 0,
              maximum: int = INT64_MAX) -> int:
    """The integer parameter ``name`` in [minimum, maximum]; 400 when missing (without a default),
    not a decimal integer, or out of range."""
    raw = params.get(name)
    if raw is None or raw == "":
        if default is None:
            raise bad_request(f"parameter {name!r} is required")
        return default
    text = raw.strip()
    if not _INTEGER.fullmatch(text):
        raise bad_request(f"parameter {name!r} must be an integer, not {raw!r}")
    value = int(text)
    if not minimum <= value <= maximum:
        raise bad_request(f"parameter {name!r} must be in [{minimum}, {maximum}], not {value}")
    return value


def bool_param(params: Mapping[str, str], name: str, default: bool = False) -> bool:
    """``true``/``false`` (any case; also 1/0); 400 for anything else."""
    raw = params.get(name)
    if raw is None or raw == "":
        return default
    lowered = raw.strip().lower()
    if lowered in ("true", "1"):
        return True
    if lowered in ("false", "0"):
        return False
    raise bad_request(f"parameter {name!r} must be true or false, not {raw!r}")


def choice_param(params: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str:
    raw = params.get(name)
    if raw is None or raw == "":
        raise bad_request(f"parameter {name!r} is required (one of {', '.join(choices)})")
    if raw not in choices:
        raise bad_request(f"parameter {name!r} must be one of {', '.join(choices)}, not {raw!r}")
    return raw


def bookie_id_param(value: object, name: str) -> str:
    """A bookie id ``host:port`` with a port in 1..65535."""
    if not isinstance(value, str) or not value:
        raise bad_request(f"{name!r} must be a bookie id host:port")
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise bad_request(f"{name!r} must be a bookie id host:port, not {value!r}")
    return value


def json_body(raw: bytes) -> dict[str, Any]:
    """A request body that must be a JSON object (empty body = {})."""
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise bad_request(f"request body is not JSON: {e}") from e
    if not isinstance(value, dict):
        raise bad_request("request body must be a JSON object")
    return value
