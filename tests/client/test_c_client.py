"""The C client in clients/c, built with its Makefile, against a real daemon: a second
implementation of the wire protocol, so the contract does not rest on the Python codec."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from support import REPO_ROOT, Reference, RunningDaemon

SOURCE = REPO_ROOT / "clients" / "c"


@pytest.fixture(scope="module")
def c_client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The client built into a temp folder; skipped with the reason when it cannot be built here."""
    missing = [tool for tool in ("make", "cc") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"no {' or '.join(missing)} on this machine")
    out = tmp_path_factory.mktemp("c-client")
    build = subprocess.run(
        ["make", "-C", str(SOURCE), f"OUT={out}"], capture_output=True, text=True, timeout=120, check=False
    )
    if build.returncode != 0:
        if "zmq.h" in build.stderr or "msgpack.h" in build.stderr:
            pytest.skip(
                f"libzmq or msgpack-c headers missing (apt-get install libzmq3-dev libmsgpack-dev):\n{build.stderr}"
            )
        pytest.fail(f"the C client does not build:\n{build.stdout}{build.stderr}")
    return out / "edged_client"


def test_c_client_gets_the_same_numbers_as_onnx_runtime(
    c_client: Path, daemon: RunningDaemon, reference: Reference
) -> None:
    run = subprocess.run([str(c_client), daemon.ipc, "10000"], capture_output=True, text=True, timeout=30, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == "status OK"
    timing = dict(item.split("=") for item in lines[1].removeprefix("timing_us ").split())
    assert set(timing) == {"queue", "compute", "total"} and int(timing["total"]) >= int(timing["compute"]) > 0
    x = ((np.arange(64, dtype=np.float32) - 32) / 32).reshape(1, 64)  # what the C client sends
    expected = reference.run("mlp-light", {"x": x})
    assert lines[2] == f"output scores float32 [{','.join(map(str, expected.shape))}]"
    values = np.array([float(line.removeprefix("value ")) for line in lines[3:]], dtype=np.float32)
    np.testing.assert_allclose(values.reshape(expected.shape), expected, rtol=1e-4, atol=1e-4)


def test_c_client_reports_a_missing_daemon_instead_of_hanging(c_client: Path, short_tmp: Path) -> None:
    run = subprocess.run(
        [str(c_client), f"ipc://{short_tmp}/nobody.sock", "300"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert run.returncode == 2
    assert "no reply within 300 ms" in run.stderr
