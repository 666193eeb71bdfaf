"""The memory plan, on a real daemon serving a large model: its weights held once for
every lane and said so (stats, models), reloads that change nothing load no weights,
a replaced file is loaded beside the old, and server.memory_limit_mb refuses a plan
that does not fit, naming the model (edged.backends.host_memory)."""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from support import RunningDaemon, short_dir, start_daemon, wait_for

from edged.backends.gpu_memory import MIB
from edged.backends.host_memory import MemoryLimitError, check_lane, check_weights
from edged.backends.shared import Weights
from edged.client import Client
from edged.config.classes import default_classes
from edged.loadgen.large_model import write_matmuls
from edged.models.onnx_import import write_folder

SIDE = 2048  # three 2048x2048 float32 MatMuls: 48 MiB of weights
MODEL_BYTES = 3 * SIDE * SIDE * 4
PLAIN_KEYS = {"name", "backend", "precision", "inputs", "outputs"}


@pytest.fixture
def repository() -> Iterator[Path]:
    root = short_dir()
    source = root / "matmuls.onnx"
    write_matmuls(source, SIDE, seed=1)
    write_folder(source, onnx.load(str(source)), root / "repo", "big", [], {}, False)
    yield root / "repo"
    shutil.rmtree(root, ignore_errors=True)


def serve(repository: Path, extra: str = "", wait: bool = True) -> RunningDaemon:
    return start_daemon(f'[server]\nmodel_repository = "{repository}"\n{extra}', wait=wait)


def reload(running: RunningDaemon) -> None:
    count = running.log().count("reloaded")
    os.kill(running.pid, signal.SIGHUP)
    wait_for(lambda: running.log().count("reloaded") > count, 60, "the reload")


def plan_of(client: Client) -> tuple[dict[str, object], dict[str, object]]:
    """The model's weights as `models` shows them, and the stats op's memory figures."""
    weights = next(m for m in client.models(memory=True) if m["name"] == "big")["weights"]
    return weights, client.stats()


def test_every_lane_shares_one_copy_of_the_weights_and_a_reload_loads_none(repository: Path) -> None:
    running = serve(repository)
    try:
        with Client(running.ipc) as client:
            x = np.ones((1, SIDE), np.float32)
            first = client.infer("big", {"x": x}, klass="realtime")["y"]
            weights, stats = plan_of(client)
            assert weights["copies"] == 1 and weights["new_copies"] == 1, weights
            # Unasked, a model's entry is the five keys docs/protocol.md promises.
            assert set(next(m for m in client.models() if m["name"] == "big")) == PLAIN_KEYS
            assert weights["file_bytes"] >= MODEL_BYTES
            # Measured while the loader took them alone: one model's worth.
            assert 0.8 * MODEL_BYTES < weights["added_bytes"] < 1.5 * MODEL_BYTES, weights
            assert stats["memory"]["weights"]["big"] == weights
            # Each lane adds its arena and buffers, not a copy of the weights of its own.
            for name, figures in stats["classes"].items():
                assert figures["memory_bytes"] < 0.5 * MODEL_BYTES, (name, figures["memory_bytes"])
            rss = stats["memory"]["rss_bytes"]

            reload(running)
            weights, stats = plan_of(client)
            assert weights["copies"] == 1 and weights["new_copies"] == 0, weights
            assert stats["memory"]["rss_bytes"] < rss + 0.5 * MODEL_BYTES
            np.testing.assert_array_equal(client.infer("big", {"x": x}, klass="bulk")["y"], first)

            # A file replaced is new weights: loaded beside the old until the old lanes drain.
            replacement = repository.parent / "other.onnx"
            write_matmuls(replacement, SIDE, seed=2)
            os.replace(replacement, repository / "big" / "model.onnx")
            reload(running)
            weights, _ = plan_of(client)
            # Planned while the old lanes still held the old file's session.
            assert weights["new_copies"] == 1 and weights["draining_copies"] == 1, weights
            assert not np.array_equal(client.infer("big", {"x": x}, klass="realtime")["y"], first)
    finally:
        running.close()


def test_start_up_refuses_weights_past_the_memory_limit_naming_the_model(repository: Path) -> None:
    running = serve(repository, "memory_limit_mb = 64\n", wait=False)
    try:
        assert running.process.process.wait(timeout=60) == 1
        log = running.log()
        assert "start-up failed: model big would not fit: its weights (1 x 48.0 MiB)" in log, log
        assert "server.memory_limit_mb = 64" in log
    finally:
        running.close()


def test_the_plan_counts_only_new_copies_and_names_the_model_and_lane_past_the_limit() -> None:
    classes = default_classes()
    reused = Weights("kept", copies=1, new_copies=0, file_bytes=900 * MIB)
    fresh = Weights("big", copies=2, new_copies=2, file_bytes=100 * MIB)
    check_weights([reused, fresh], classes, rss_now=100 * MIB, limit_bytes=300 * MIB)
    with pytest.raises(MemoryLimitError, match=r"model big would not fit: its weights \(2 x 100.0 MiB\) for lanes "):
        check_weights([reused, fresh], classes, rss_now=101 * MIB, limit_bytes=300 * MIB)
    check_lane("bulk", ["big"], rss_now=300 * MIB, limit_bytes=300 * MIB)
    with pytest.raises(MemoryLimitError, match=r"lane bulk took the daemon to 301.0 MiB while it loaded big"):
        check_lane("bulk", ["big"], rss_now=301 * MIB, limit_bytes=300 * MIB)
