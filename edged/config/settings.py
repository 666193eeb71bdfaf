"""Typed readers for the tables of a TOML config: each refusal names the key and the fix.

Each key is defined once, as a Key (edged.config.keys): what it holds, what a valid
value is and what it means. The readers here check against it, and the reference
(edged.config.reference) is written from it, so the two cannot drift apart."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

BOOL = "true or false"


class ConfigError(ValueError):
    """A setting that cannot be used; the message names the key and the fix."""


@dataclass(frozen=True, slots=True)
class Key:
    """One setting: its type, the values it takes, and its meaning."""

    name: str
    type: str  # as the reference names it: "integer", "number", "boolean", "string", ...
    help: str
    wanted: str = ""  # a valid value, as a refusal's fix words it; for integers, from low and high
    low: int | None = None
    high: int | None = None
    default: str | None = None  # the default in words, where the built-in value alone would mislead

    @property
    def valid(self) -> str:
        if self.wanted or self.low is None:
            return self.wanted
        return f"an integer >= {self.low}" if self.high is None else f"an integer from {self.low} to {self.high}"


@dataclass(frozen=True, slots=True)
class Section:
    """A TOML table and its keys, with what the reference says before and after them."""

    name: str  # "server", or "classes.NAME" for the tables of one pattern
    keys: tuple[Key, ...]
    intro: str = ""
    notes: str = ""

    @property
    def names(self) -> set[str]:
        return {key.name for key in self.keys}

    def __getitem__(self, name: str) -> Key:
        return next(key for key in self.keys if key.name == name)


def subtable(raw: dict[str, Any], key: str) -> dict[str, Any]:
    table = raw.get(key, {})
    expect(isinstance(table, dict), key, table, f"a [{key}] table")
    return table


def no_unknown(table: dict[str, Any], known: set[str], prefix: str) -> None:
    for key in table:
        if key not in known:
            raise ConfigError(f"unknown key {prefix}{key}: known keys here are {', '.join(sorted(known))}")


# A ceiling for every integer key that names none: TOML takes integers past 64 bits, and a duration
# past what a clock or a sleep can hold failed only while serving (batch_wait_us at 2**63 killed a
# worker). 2**40 is 12 days in us, 35 years in ms, 1 TiB in bytes: past any setting's need.
MOST_INT = 2**40


def read_int(table: dict[str, Any], key: Key, default: int, prefix: str) -> int:
    """The integer at `key`, within the key's low and high (MOST_INT where it names none)."""
    value = table.get(key.name, default)
    low, high = key.low if key.low is not None else 0, key.high if key.high is not None else MOST_INT
    whole = isinstance(value, int) and not isinstance(value, bool)
    past = whole and key.high is None and value > high  # a key with a high of its own says it
    expect(
        whole and low <= value <= high,
        prefix + key.name,
        value,
        f"at most {high:,}: {key.valid}" if past else key.valid,
    )
    return value


def read_bool(table: dict[str, Any], key: Key, default: bool, prefix: str) -> bool:
    value = table.get(key.name, default)
    expect(isinstance(value, bool), prefix + key.name, value, key.valid)
    return value


def expect(ok: bool, key: str, value: Any, wanted: str) -> None:
    if not ok:
        raise ConfigError(f"{key} = {value!r} is not valid: set it to {wanted}")
