"""The trimmer's check runs on the steering thread, whose failure stops the daemon."""

from __future__ import annotations

import errno

import pytest

from edged.daemon import trimmer
from edged.daemon.trimmer import Trimmer


def test_a_check_that_cannot_read_the_rss_is_skipped_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    """Out of descriptors a moment (a flood of connections), /proc/self/statm cannot be opened:
    before, the OSError ended the steering thread, and with it the daemon."""
    trims = Trimmer()

    def no_descriptors() -> int:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(trimmer, "rss_bytes", no_descriptors)
    try:
        trims.check()
    finally:
        trims.close()
