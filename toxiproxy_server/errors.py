"""API errors (the ``ApiError`` of upstream's api.go and the errors it answers with), and JSON
decoding with the rules of Go's encoding/json.
"""

from __future__ import annotations

import json
from typing import Any

INT64 = (-(2**63), 2**63 - 1)


class ApiError(Exception):
    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.message, self.status = message, status

    def to_json(self) -> dict[str, Any]:
        return {"error": self.message, "status": self.status}


def _bad_body(detail: str) -> ApiError:
    return ApiError(f"bad request body: {detail}", 400)


def _missing(what: str) -> ApiError:
    return ApiError(f"missing required field: {what}", 400)


PROXY_NOT_FOUND = ("proxy not found", 404)
PROXY_EXISTS = ("proxy already exists", 409)
INVALID_STREAM = ("stream was invalid, can be either upstream or downstream", 400)
INVALID_TOXIC_TYPE = ("invalid toxic type", 400)
TOXIC_EXISTS = ("toxic already exists", 409)
TOXIC_NOT_FOUND = ("toxic not found", 404)


def _decode(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError as e:  # Go says "EOF" for an empty body; any message will do
        raise _bad_body(str(e) if body.strip() else "EOF") from None


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _bad_body(f"json: cannot unmarshal {_json_kind(value)} into Go value of type {what}")
    return value


def _json_kind(value: Any) -> str:
    return {bool: "bool", str: "string", list: "array", dict: "object"}.get(type(value), "number")


def _get(obj: dict[str, Any], key: str, kind: type | tuple[type, ...], default: Any) -> Any:
    """obj[key] checked like Go's decoder does: case-insensitive key, null keeps the default,
    bool is no number, and an integer field takes no fraction."""
    matches = [k for k in obj if k == key] or [k for k in obj if k.lower() == key.lower()]
    if not matches or obj[matches[-1]] is None:
        return default
    value = obj[matches[-1]]
    ok = isinstance(value, kind) and not (isinstance(value, bool) and kind is not bool)
    if ok and kind is int and not INT64[0] <= value <= INT64[1]:
        ok = False
    if not ok:
        go_type = {str: "string", bool: "bool", int: "int64"}.get(kind, "float32")  # type: ignore[arg-type]
        raise _bad_body(f"json: cannot unmarshal {_json_kind(value)} into Go struct field .{key} of type {go_type}")
    return float(value) if kind == (int, float) else value
