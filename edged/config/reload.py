"""What a reload may change. The running daemon applies some keys only at start: its sockets,
loops, limits and logging are made then. A reload that changes one is refused, naming it,
and the running configuration serves on."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from operator import attrgetter
from typing import Any

from edged.config.file import Config
from edged.config.settings import ConfigError

START_ONLY: dict[str, Callable[[Config], Any]] = {
    "the classes (their names and order)": lambda c: [(k.name, k.order) for k in c.classes],
    "classes.*.tcp_port": lambda c: {k.name: k.tcp_port for k in c.classes if k.tcp_port is not None},
    "the first class's cpu_affinity (the process's)": lambda c: c.classes[0].cpu_affinity,
    "server.default_class": attrgetter("default_class"),
    "server.class_sockets": attrgetter("class_sockets"),
    "server.max_message_bytes": attrgetter("max_message_bytes"),
    "server.spin_max_us": attrgetter("spin_max_us"),
    "server.ipc_mode": attrgetter("ipc_mode"),
    "server.ipc_group": attrgetter("ipc_group"),
    "server.log_level": attrgetter("log_level"),
    "[limits]": attrgetter("limits"),
    "[security]": attrgetter("security"),
    "[metrics]": attrgetter("metrics"),
    "[shm]": attrgetter("shm"),
}


def reloaded(running: Config, reread: Config) -> Config:
    """`reread` with the running endpoints (bound once, perhaps given on the command line);
    ConfigError naming what it changes of START_ONLY."""
    reread = replace(reread, endpoints=running.endpoints)
    if changed := [key for key, of in START_ONLY.items() if of(running) != of(reread)]:
        raise ConfigError(f"{', '.join(changed)} changed: applied only at start, so restart the daemon for that")
    return reread
