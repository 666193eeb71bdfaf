"""Argument types the commands share: a value argparse refuses in one line, before any work."""

from __future__ import annotations

import argparse

from edged.loadgen.sweep import Stream
from edged.wire.endpoints import FILE_NAME


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not 1 or more")
    return value


def file_stem(text: str) -> str:
    """A file name of its own (keygen --name): no path, nothing hidden."""
    if not FILE_NAME.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a file name: use letters, digits, '.', '_' and '-', not starting with '.'"
        )
    return text


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not a number above 0")
    return value


def positive_floats(text: str) -> list[float]:
    """A comma-separated list of numbers above 0 (--sweep)."""
    return [positive_float(part) for part in text.split(",")]


def stream(text: str) -> Stream:
    """One --mix entry, CLASS:MODEL:RATE[:DEADLINE_MS[:ROWS]]."""
    try:
        parsed = Stream.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    deadline = parsed.deadline_ms
    if not 0 < parsed.rate < float("inf") or parsed.rows < 1 or not (deadline is None or 0 < deadline < float("inf")):
        raise argparse.ArgumentTypeError(
            f"{text!r}: its RATE must be a number above 0, its DEADLINE_MS too where given, and its ROWS 1 or more"
        )
    return parsed
