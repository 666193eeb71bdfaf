"""One ONNX Runtime CPU session per model file and session settings, shared by every
runner in the process that asks for the same: a model's weights, packed, held once.

A session per runner held a copy of the weights per worker per class, plus the inline
path's: four or more times the model (bench/weights_sharing.py: 786 MiB for four
runners of a 192 MiB model; one session called from four threads, 202). ONNX
Runtime's `run` may be called from several threads at once, and with one intra-op
thread a call computes on its caller's thread, so each lane's niceness and cores still
apply to its own calls. A session with a pool of its own is shared only within one
lane: its pool threads take the settings of the thread that made them.

A session lives while a runner holds it. Reloading a model whose file did not change
takes the session the old lanes still hold (the new lanes load before the old retire),
so a reload loads no weights; a file replaced is another key (its inode, size and
time), loaded beside the old one until the old lanes drain.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import onnxruntime as ort

Key = tuple[object, ...]


@dataclass
class _Held:
    lock: threading.Lock = field(default_factory=threading.Lock)  # held while the session is made
    session: ort.InferenceSession | None = None
    users: int = 0


class SharedSessions:
    """The sessions, by key, with how many runners hold each. Written by the lanes'
    loading threads and by whoever closes a runner, under `_lock`; a session is made
    under its own entry's lock, so that two models load at once but one model once."""

    def __init__(self) -> None:
        self._held: dict[Key, _Held] = {}
        self._lock = threading.Lock()

    def take(self, key: Key, make: Callable[[], ort.InferenceSession]) -> ort.InferenceSession:
        """The session for `key`, made by `make` if no runner holds one; give it back once."""
        with self._lock:
            held = self._held.setdefault(key, _Held())
            held.users += 1
        with held.lock:
            if held.session is None:
                try:
                    held.session = make()
                except BaseException:
                    self.give_back(key)
                    raise
            return held.session

    def give_back(self, key: Key) -> None:
        """A runner is done with its session; the last one to give it back frees it."""
        with self._lock:
            held = self._held[key]
            held.users -= 1
            if not held.users:
                del self._held[key]

    def __len__(self) -> int:
        return len(self._held)


def session_key(path: Path, *settings: object) -> Key:
    """A model file, as it is now (a file replaced in place is another key), and the
    settings its session was made with."""
    stat = path.stat()
    return (str(path.resolve()), stat.st_ino, stat.st_size, stat.st_mtime_ns, *settings)


SESSIONS = SharedSessions()  # the process's: reloads build new backends, and must find the old sessions
