"""Fixtures: one daemon for the whole session (built-in defaults, on ipc and tcp), a
factory for tests that need a daemon of their own, and the in-process reference.

Starting a daemon costs about a second (three lanes load and warm both models), so
every test that leaves the daemon as it found it shares the session one.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zmq
from support import Reference, RunningDaemon, short_dir, start_daemon


@pytest.fixture(scope="session")
def _session_daemon() -> Iterator[RunningDaemon]:
    running = start_daemon(tcp=True)
    yield running
    running.close()


@pytest.fixture
def daemon(_session_daemon: RunningDaemon) -> RunningDaemon:
    """The shared daemon, checked alive first: one that died would otherwise turn
    every later test into a slow reply timeout, hiding which test killed it."""
    if not _session_daemon.alive():
        pytest.fail(f"the shared daemon has exited; its log:\n{_session_daemon.log()[-4000:]}")
    return _session_daemon


@pytest.fixture(params=["ipc", "tcp"])
def endpoint(request: pytest.FixtureRequest, daemon: RunningDaemon) -> str:
    """Each of the shared daemon's endpoints in turn."""
    return getattr(daemon, request.param)


@pytest.fixture
def own_daemon() -> Iterator[Callable[..., RunningDaemon]]:
    """Start daemons that this test alone uses (a custom config, or one it stops or harms)."""
    started: list[RunningDaemon] = []

    def start(config_text: str | None = None, **options: bool) -> RunningDaemon:
        running = start_daemon(config_text, **options)
        started.append(running)
        return running

    yield start
    for running in started:
        running.close()


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A folder for unix sockets, whose paths must stay under 107 bytes."""
    folder = short_dir()
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def reference() -> Reference:
    return Reference()


@pytest.fixture
def context() -> Iterator[zmq.Context]:
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)
