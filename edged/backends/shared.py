"""One copy of each model's weights per process: a registry of heavy things (a CPU
session, a GPU model's device initializers, a deserialized TensorRT engine) by the
file they came from and the settings they were made with, shared by every runner
that asks for the same, and freed when the last gives it back.

A copy lives while a runner (or the loader) holds it. Reloading a model whose file
did not change takes the copy the old lanes still hold, since the new lanes load
before the old retire, so a reload loads no weights; a file replaced is another key
(its inode, size and time), loaded beside the old one until the old lanes drain.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

T = TypeVar("T")
Key = tuple[object, ...]


@dataclass
class _Held(Generic[T]):
    lock: threading.Lock = field(default_factory=threading.Lock)  # held while the copy is made
    value: T | None = None
    users: int = 0


class Shared(Generic[T]):
    """The copies, by key, with how many hold each. Written by the lanes' loading threads,
    the loader and whoever closes a runner, under `_lock`; a copy is made under its own
    entry's lock, so that two models load at once but one model once. `free`, if given,
    releases a copy when its last holder gives it back (else dropping it does)."""

    def __init__(self, free: Callable[[T], None] | None = None) -> None:
        self._held: dict[Key, _Held[T]] = {}
        self._lock = threading.Lock()
        self._free = free

    def take(self, key: Key, make: Callable[[], T]) -> T:
        """The copy for `key`, made by `make` if nobody holds one; give it back once."""
        with self._lock:
            held = self._held.setdefault(key, _Held())
            held.users += 1
        with held.lock:
            if held.value is None:
                try:
                    held.value = make()
                except BaseException:
                    self.give_back(key)
                    raise
            return held.value

    def give_back(self, key: Key) -> None:
        """A holder is done with its copy; the last one to give it back frees it."""
        with self._lock:
            held = self._held[key]
            held.users -= 1
            if held.users:
                return
            del self._held[key]
        if self._free is not None and held.value is not None:
            self._free(held.value)

    def holds(self, key: Key) -> bool:
        """Whether a copy for `key` is held now (made, or being made)."""
        with self._lock:
            return key in self._held

    def replaced(self, key: Key) -> int:
        """How many copies of an earlier version of `key`'s file (file_key: the same path,
        another inode, size or time) are held now: a reload's old lanes hold them until they drain."""
        with self._lock:
            return sum(held[0] == key[0] and held[1:4] != key[1:4] for held in self._held)

    def __len__(self) -> int:
        return len(self._held)


@dataclass(frozen=True, slots=True)
class Weights:
    """One model's weights as the process holds them for its lanes: the memory plan's line
    for the model, counted once whatever the number of lanes and workers."""

    model: str
    copies: int  # 1, or more where a lane needs one of its own (a CPU lane with a pool of threads)
    new_copies: int  # not held already by the serving lanes (a reload that changed nothing: 0)
    file_bytes: int  # the model file: the plan's figure per copy
    added_bytes: int | None = None  # measured: what taking them added (RSS, or device memory)
    draining: int = 0  # copies of the file's earlier version still held, until the old lanes drain

    @property
    def planned_bytes(self) -> int:
        return self.new_copies * self.file_bytes

    def to_wire(self) -> dict[str, int | None]:
        return {
            "copies": self.copies,
            "new_copies": self.new_copies,
            "file_bytes": self.file_bytes,
            "planned_bytes": self.planned_bytes,
            "added_bytes": self.added_bytes,
            "draining_copies": self.draining,
        }


@dataclass(frozen=True, slots=True)
class WeightsHold:
    """Weights taken by the loader before any lane loads; `release` gives them back once
    the lanes hold them too."""

    weights: Weights
    release: Callable[[], None]


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    """The memory plan as loaded: each model's weights once, and what each lane added on
    the host beyond them (the growth of the RSS while it loaded and warmed)."""

    weights: dict[str, Weights] = field(default_factory=dict)
    lane_bytes: dict[str, int] = field(default_factory=dict)


def file_key(path: Path, *settings: object) -> Key:
    """A model file, as it is now (a file replaced in place is another key), and the
    settings its copy was made with."""
    stat = path.stat()
    return (str(path.resolve()), stat.st_ino, stat.st_size, stat.st_mtime_ns, *settings)
