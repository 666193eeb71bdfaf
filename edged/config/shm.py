"""The `[shm]` table: tensors in shared memory for local clients (edged.shm.registry).
Off unless enabled: a local client that may connect can then hand the daemon sealed
memfds to map, and, only where `trust_posix_names` says such clients are trusted, have
it map POSIX objects it names (docs/operations.md says what each can and cannot do)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edged.config.keys import SHM
from edged.config.settings import expect, no_unknown, read_bool, read_int
from edged.wire.shm import NAME


@dataclass(frozen=True, slots=True)
class ShmConfig:
    enabled: bool = False
    prefix: str = "edged-"  # the only regions the daemon opens: names that start with it
    max_region_mb: int = 256  # the largest region it maps
    max_regions_per_peer: int = 8
    # In all: each region holds a descriptor and a mapping, and clients may open many connections.
    max_regions: int = 512
    max_mb_per_peer: int = 1024  # over all of one client's regions
    idle_s: int = 300  # a region unused this long is unmapped (a client that vanished)
    # Map POSIX objects by name: a client can shrink one under the daemon (a SIGBUS), so only for trusted clients.
    trust_posix_names: bool = False

    @property
    def max_region_bytes(self) -> int:
        return self.max_region_mb << 20

    @property
    def max_bytes_per_peer(self) -> int:
        return self.max_mb_per_peer << 20


def read_shm(table: dict[str, Any]) -> ShmConfig:
    defaults = ShmConfig()
    no_unknown(table, SHM.names, "shm.")
    enabled = read_bool(table, SHM["enabled"], defaults.enabled, "shm.")
    trust = read_bool(table, SHM["trust_posix_names"], defaults.trust_posix_names, "shm.")
    prefix = table.get("prefix", defaults.prefix)
    expect(isinstance(prefix, str) and bool(NAME.fullmatch(prefix)), "shm.prefix", prefix, SHM["prefix"].valid)
    numbers = {
        key: read_int(table, SHM[key], getattr(defaults, key), "shm.")
        for key in ("max_region_mb", "max_regions_per_peer", "max_regions", "max_mb_per_peer", "idle_s")
    }
    return ShmConfig(enabled=enabled, prefix=prefix, trust_posix_names=trust, **numbers)
