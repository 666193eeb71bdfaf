"""A model folder the daemon cannot read fails, loudly, and never vanishes: at start-up,
on SIGHUP, and with the whole repository unreadable.

Root reads anything: a daemon run as root here runs under `setpriv` with the file
permission overrides (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH) dropped, as a daemon under
a service user has none. Real permissions on real folders."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import ENGINES, RunningDaemon, random_input, short_dir, start_daemon, wait_for

from edged.client import Client, Unavailable

NO_OVERRIDE = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]


def program() -> list[str]:
    """How to start the daemon so that it obeys file permissions."""
    if os.geteuid() != 0:
        return [sys.executable, "-m", "edged"]
    if shutil.which("setpriv") is None:
        pytest.skip("running as root, and setpriv (util-linux) is not installed to drop root's file overrides")
    probe = subprocess.run([*NO_OVERRIDE, "true"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"setpriv cannot drop root's file overrides here: {probe.stderr.strip()}")
    return [*NO_OVERRIDE, sys.executable, "-m", "edged"]


@pytest.fixture
def repository() -> Iterator[Path]:
    root = short_dir()
    for model in ("mlp-light", "cnn-heavy"):
        shutil.copytree(ENGINES / model, root / model)
    yield root
    for folder in (root, *root.iterdir()):
        folder.chmod(0o755)
    shutil.rmtree(root, ignore_errors=True)


def serve(repository: Path, extra: str = "") -> RunningDaemon:
    return start_daemon(f'[server]\nmodel_repository = "{repository}"\n{extra}', program=program())


def reload(running: RunningDaemon, line: str) -> None:
    os.kill(running.pid, signal.SIGHUP)
    wait_for(lambda: line in running.log() or not running.alive(), 60, f"{line!r} in the log")


def test_a_reload_with_an_unreadable_model_folder_is_refused_naming_it(repository: Path) -> None:
    running = serve(repository)
    try:
        (repository / "mlp-light").chmod(0)
        reload(running, "reload refused")
        log = running.log()
        assert f"model folder {repository / 'mlp-light'} cannot be read (Permission denied)" in log, log[-2000:]
        with Client(running.ipc) as client:  # the previous configuration serves on
            assert client.infer("mlp-light", random_input("mlp-light", 1, 0))["scores"].shape == (1, 10)
            assert client.health()["ready"]
    finally:
        running.close()


def test_with_skip_an_unreadable_model_is_served_as_failed(repository: Path) -> None:
    running = serve(repository, 'on_model_failure = "skip"\n')
    try:
        (repository / "mlp-light").chmod(0)
        reload(running, "reloaded: now serving")
        with Client(running.ipc) as client:
            health = client.health()
            assert "Permission denied" in health["failed_models"]["mlp-light"], health
            # The contract's UNAVAILABLE, "the model is not loaded": retry later, or elsewhere.
            with pytest.raises(Unavailable, match="model 'mlp-light' is not loaded \\("):
                client.infer("mlp-light", random_input("mlp-light", 1, 0))
            assert client.infer("cnn-heavy", random_input("cnn-heavy", 1, 0))["logits"].shape == (1, 10)
        assert "not serving mlp-light: model folder" in running.log()
    finally:
        running.close()


def test_an_unreadable_repository_is_refused_as_unreadable(repository: Path) -> None:
    running = serve(repository)
    try:
        repository.chmod(0)
        reload(running, "reload refused")
        assert f"model repository {repository} cannot be read (Permission denied)" in running.log()
    finally:
        running.close()


def test_a_reload_refuses_a_model_file_it_cannot_read_even_where_it_would_reuse_the_weights(
    repository: Path,
) -> None:
    """Unchanged, model.onnx's weights would be reused without a read: the reload must
    still refuse what a restart would fail on."""
    running = serve(repository)
    try:
        onnx = repository / "mlp-light" / "model.onnx"
        onnx.chmod(0)
        os.kill(running.pid, signal.SIGHUP)
        # Refused; or, red before issue 37, "reloaded: now serving" with the file unread.
        outcomes = ("reload refused", "reloaded: now serving")
        wait_for(lambda: any(line in running.log() for line in outcomes), 60, f"one of {outcomes} in the log")
        log = running.log()
        assert "reload refused" in log, log[-2000:]
        assert f"model 'mlp-light': {onnx} cannot be read (Permission denied)" in log, log[-2000:]
        with Client(running.ipc) as client:  # the previous configuration serves on
            assert client.infer("mlp-light", random_input("mlp-light", 1, 0))["scores"].shape == (1, 10)
    finally:
        running.close()


def test_with_skip_a_model_file_it_cannot_read_is_served_as_failed(repository: Path) -> None:
    running = serve(repository, 'on_model_failure = "skip"\n')
    try:
        (repository / "mlp-light" / "model.onnx").chmod(0)
        reload(running, "reloaded: now serving")
        with Client(running.ipc) as client:
            failed = client.health()["failed_models"]
            assert "model.onnx cannot be read (Permission denied)" in failed.get("mlp-light", ""), failed
            # The contract's UNAVAILABLE, "the model is not loaded": retry later, or elsewhere.
            with pytest.raises(Unavailable, match="model 'mlp-light' is not loaded \\("):
                client.infer("mlp-light", random_input("mlp-light", 1, 0))
            assert client.infer("cnn-heavy", random_input("cnn-heavy", 1, 0))["logits"].shape == (1, 10)
    finally:
        running.close()
