"""Typed readers for the tables of a TOML config: each refusal names the key and the fix."""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A setting that cannot be used; the message names the key and the fix."""


def subtable(raw: dict[str, Any], key: str) -> dict[str, Any]:
    table = raw.get(key, {})
    expect(isinstance(table, dict), key, table, f"a [{key}] table")
    return table


def no_unknown(table: dict[str, Any], known: set[str], prefix: str) -> None:
    for key in table:
        if key not in known:
            raise ConfigError(f"unknown key {prefix}{key}: known keys here are {', '.join(sorted(known))}")


def read_int(table: dict[str, Any], key: str, default: int, prefix: str, low: int, high: int | None = None) -> int:
    value = table.get(key, default)
    bounds = f"an integer >= {low}" if high is None else f"an integer from {low} to {high}"
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= low and (high is None or value <= high)
    expect(ok, prefix + key, value, bounds)
    return value


def read_positive_int(table: dict[str, Any], key: str, default: int, prefix: str) -> int:
    return read_int(table, key, default, prefix, 1)


def expect(ok: bool, key: str, value: Any, wanted: str) -> None:
    if not ok:
        raise ConfigError(f"{key} = {value!r} is not valid: set it to {wanted}")
