"""The `edged` client commands, run as a user runs them: a separate process, its exit
code, and what it prints."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from support import Reference, RunningDaemon, established, free_tcp_port, run_edged

from edged.client import Client

TIMING_LINE = re.compile(r"^timing \(us, inside the daemon\): queue \d+, compute \d+, total \d+$", re.M)


def edged(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_edged(*args, env=env)


def test_models_json_prints_the_served_models_as_the_daemon_sends_them(daemon: RunningDaemon) -> None:
    result = edged("models", "--json", "--endpoint", daemon.ipc)
    assert result.returncode == 0, result.stderr
    models = {model["name"]: model for model in json.loads(result.stdout)}
    assert set(models) == {"mlp-light", "cnn-heavy"}
    assert models["mlp-light"]["inputs"] == [{"name": "x", "dtype": "float32", "shape": [-1, 64]}]
    assert result.stdout == json.dumps(models_of(daemon), indent=2) + "\n"


def test_health_json_prints_serving(daemon: RunningDaemon) -> None:
    result = edged("health", "--json", "--endpoint", daemon.tcp)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["state"] == "serving"


def test_stats_json_prints_every_class(daemon: RunningDaemon) -> None:
    result = edged("stats", "--json", "--endpoint", daemon.ipc)
    assert result.returncode == 0, result.stderr
    assert set(json.loads(result.stdout)["classes"]) == {"realtime", "standard", "bulk"}


def columns(table: str) -> list[dict[str, str]]:
    """The rows of a table printed as `kubectl get` prints one: headers over columns
    two spaces apart (a header may hold one space: "P99 MS")."""
    lines = table.splitlines()
    starts = [0, *(m.end() for m in re.finditer(r"\S {2,}(?=\S)", lines[0]))]
    bounds = list(zip(starts, [*starts[1:], None]))
    cut = [[line[a:b].strip() for a, b in bounds] for line in lines]
    return [dict(zip(cut[0], row)) for row in cut[1:]]


def test_models_prints_a_line_per_model_with_its_tensors_and_price(daemon: RunningDaemon) -> None:
    result = edged("models", "--endpoint", daemon.ipc)
    assert result.returncode == 0, result.stderr
    rows = {row["NAME"]: row for row in columns(result.stdout)}
    assert set(rows) == {"mlp-light", "cnn-heavy"}
    light = rows["mlp-light"]
    assert (light["BACKEND"], light["PRECISION"]) == ("onnxruntime", "fp32")
    assert (light["INPUTS"], light["OUTPUTS"]) == ("x float32[-1,64]", "scores float32[-1,10]")
    with Client(daemon.ipc) as client:
        prices = client.stats()["classes"]
    for klass in ("realtime", "standard", "bulk"):
        # What one row costs on that class's lane, as admission prices it (it moves as it serves).
        shown, now = float(light[f"{klass.upper()} MS"]), prices[klass]["prices"]["mlp-light"]["first_row_ms"]
        assert 0 < shown < 10 * max(now, 0.001)


def test_stats_prints_a_line_per_class_with_the_counts_and_latency(daemon: RunningDaemon) -> None:
    with Client(daemon.ipc) as client:
        for _ in range(3):
            client.infer("mlp-light", {"x": np.zeros((1, 64), np.float32)}, klass="realtime")
        figures = client.stats()["classes"]
    result = edged("stats", "--endpoint", daemon.ipc)
    assert result.returncode == 0, result.stderr
    summary, table = result.stdout.split("\n", 1)
    assert re.fullmatch(r"serving: \d+\.\d MiB resident, \d+ invalid, \d+ unroutable", summary), summary
    rows = {row["CLASS"]: row for row in columns(table)}
    assert list(rows) == ["realtime", "standard", "bulk"]
    realtime = rows["realtime"]
    # Nothing else is sent to the shared daemon meanwhile: the counts are the daemon's.
    assert int(realtime["COMPLETED"]) == figures["realtime"]["completed"] >= 3
    assert int(realtime["SHED"]) == sum(figures["realtime"]["shed"].values())
    assert float(realtime["P99 MS"]) == round(figures["realtime"]["latency_us"]["total"]["p99"] / 1000, 2) > 0
    assert len(result.stdout.splitlines()) == 5  # short: a summary, the headers, a line per class


def test_health_prints_the_state_and_a_line_per_class(daemon: RunningDaemon) -> None:
    result = edged("health", "--endpoint", daemon.ipc)
    assert result.returncode == 0, result.stderr
    first, table = result.stdout.split("\n", 1)
    assert re.fullmatch(r"serving, ready, up \d+\.\d s", first), first
    rows = {row["CLASS"]: row for row in columns(table)}
    assert {name: row["LANE"] for name, row in rows.items()} == {"realtime": "ok", "standard": "ok", "bulk": "ok"}
    assert rows["bulk"]["INGRESS"] == daemon.ipc.replace("d.sock", "d-bulk.sock")


def test_endpoint_comes_from_the_environment(daemon: RunningDaemon) -> None:
    result = edged("health", "--json", env={"EDGED_ENDPOINT": daemon.ipc})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["state"] == "serving"


def test_infer_prints_outputs_and_timing(daemon: RunningDaemon) -> None:
    result = edged("infer", "mlp-light", "--endpoint", daemon.ipc)
    assert result.returncode == 0, result.stderr
    assert "scores: float32 [1, 10]" in result.stdout
    assert TIMING_LINE.search(result.stdout), result.stdout


def test_infer_with_an_input_file_and_repeats(daemon: RunningDaemon, reference: Reference, tmp_path: Path) -> None:
    x = np.random.default_rng(5).standard_normal((2, 64), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    result = edged(
        "infer", "mlp-light", "--endpoint", daemon.ipc, "--input", f"x={tmp_path / 'x.npy'}", "--repeat", "3"
    )
    assert result.returncode == 0, result.stderr
    assert "scores: float32 [2, 10]" in result.stdout
    assert TIMING_LINE.search(result.stdout)
    assert re.search(r"^3 requests: total p50 \d+ us, p99 \d+ us$", result.stdout, re.M), result.stdout
    # The printed numbers are the model's (array2string rounds them to 4 decimals).
    printed = result.stdout.split("scores: float32 [2, 10]\n", 1)[1].split("timing", 1)[0]
    values = np.array([float(v) for v in re.findall(r"-?\d+\.\d*(?:e[-+]\d+)?", printed)])
    np.testing.assert_allclose(values, reference.run("mlp-light", {"x": x}).ravel(), atol=1e-3)


def test_infer_over_tcp_sends_a_class_with_a_tcp_port_to_its_own_socket(
    own_daemon: Callable[..., RunningDaemon],
) -> None:
    """Given the shared tcp endpoint alone, `infer --class realtime` reads realtime's port
    from health and sends its requests there: its connection to that port is seen while it runs."""
    port = free_tcp_port()
    running = own_daemon(f"[classes.realtime]\ntcp_port = {port}\n[classes.standard]\n[classes.bulk]\n", tcp=True)
    assert running.tcp is not None
    args = ("infer", "mlp-light", "--endpoint", running.tcp, "--class", "realtime", "--repeat", "2000")
    done: list[subprocess.CompletedProcess[str]] = []
    command = threading.Thread(target=lambda: done.append(edged(*args)))
    command.start()
    seen = False
    while command.is_alive() and not seen:
        seen = established(port)
        time.sleep(0.005)
    command.join()
    assert done[0].returncode == 0, done[0].stderr
    assert "2000 requests: total p50" in done[0].stdout
    assert seen, "no connection to realtime's tcp port while the command ran"


def test_infer_of_an_unknown_model_exits_1_saying_so(daemon: RunningDaemon) -> None:
    result = edged("infer", "resnet", "--endpoint", daemon.ipc)
    assert result.returncode == 1
    assert "NOT_FOUND" in result.stderr and "resnet" in result.stderr


def test_infer_in_an_unknown_class_exits_1_with_the_daemons_message(daemon: RunningDaemon) -> None:
    result = edged("infer", "mlp-light", "--endpoint", daemon.ipc, "--class", "nope")
    assert result.returncode == 1
    assert "unknown class 'nope'" in result.stderr


def test_no_daemon_exits_1_saying_no_reply(short_tmp: Path) -> None:
    result = edged("health", "--endpoint", f"ipc://{short_tmp}/nobody.sock", "--timeout-ms", "300")
    assert result.returncode == 1
    assert "no reply" in result.stderr


def models_of(daemon: RunningDaemon) -> list[dict[str, object]]:
    with Client(daemon.ipc) as client:
        return client.models()


@pytest.mark.parametrize(
    ("args", "code", "phrase"),
    [
        (("health", "--endpoint", "tcp://127.0.0.1:abc"), 1, "edged: "),
        (("health", "--endpoint", "foo://x"), 1, "edged: "),
        (("infer", "mlp-light", "--repeat", "0"), 2, "is not 1 or more"),
        (("infer", "mlp-light", "--batch", "0"), 2, "is not 1 or more"),
        (("health", "--timeout-ms", "-5"), 2, "is not a number above 0"),
        (("bench", "--mix", "bogus"), 2, "CLASS:MODEL:RATE"),
        (("bench", "--mix", "realtime:mlp-light:abc"), 2, "could not convert"),
        (("bench", "--mix", "realtime:mlp-light:-5"), 2, "RATE must be a number above 0"),
        # An infinite rate never moved the next send on: the run never ended, its memory growing.
        (("bench", "--mix", "realtime:mlp-light:inf"), 2, "RATE must be a number above 0"),
        (("bench", "--mix", "realtime:mlp-light:10:nan"), 2, "its DEADLINE_MS too"),
        (("bench", "--sweep", "x"), 2, "is not a number"),
        # It wrote the key pair outside DIR, or as hidden files (.key), where the fuzz of its name led.
        (("keygen", "keys", "--name", "../../x"), 2, "is not a file name"),
        (("keygen", "keys", "--name", ""), 2, "is not a file name"),
        (("demo", "--requests", "0"), 2, "is not 1 or more"),
        (("bench", "--duration", "0"), 2, "is not a number above 0"),
        (("build", "quantize", "mlp-light", "--precision", "int8", "--samples", "0"), 2, "is not 1 or more"),
        (("build", "quantize", "mlp-light", "--precision", "int8", "--held-out", "-5"), 2, "is not 1 or more"),
        (("build", "engine", "mlp-light", "--precision", "fp16", "--max-batch", "0"), 2, "is not 1 or more"),
    ],
)
def test_a_bad_argument_gets_one_line_and_a_non_zero_exit_not_a_traceback(
    short_tmp: Path, args: tuple[str, ...], code: int, phrase: str
) -> None:
    """Tracebacks before (ZMQError, FileNotFoundError, UnboundLocalError, ValueError,
    ZeroDivisionError), or a run that did nothing and exited 0 (a negative rate)."""
    env = {"EDGED_ENDPOINT": f"ipc://{short_tmp}/nobody.sock"}
    result = edged(*args, env=env)
    assert result.returncode == code, result.stderr
    assert phrase in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_what_the_client_refuses_to_send_or_wait_for_gets_one_line(daemon: RunningDaemon, tmp_path: Path) -> None:
    """Tracebacks before: an input of a dtype the wire has no name for (float64) raised
    ValueError, a timeout past what zmq_poll takes an OverflowError, and a --mix model the
    daemon does not serve a KeyError."""
    np.save(tmp_path / "x.npy", np.zeros((1, 64), np.float64))
    wide = edged("infer", "mlp-light", "--endpoint", daemon.ipc, "--input", f"x={tmp_path / 'x.npy'}")
    assert wide.returncode == 1 and "float64" in wide.stderr and "Traceback" not in wide.stderr, wide.stderr
    patient = edged("infer", "mlp-light", "--endpoint", daemon.ipc, "--timeout-ms", "1e300")
    assert patient.returncode == 0, patient.stderr
    unknown = edged("bench", "--endpoint", daemon.ipc, "--mix", "realtime:nosuch:10", "--duration", "1")
    assert unknown.returncode == 1 and "Traceback" not in unknown.stderr, unknown.stderr
    assert "--mix names ['nosuch'], which the daemon does not serve" in unknown.stderr, unknown.stderr


def test_an_input_file_that_is_not_there_gets_one_line(daemon: RunningDaemon) -> None:
    result = edged("infer", "mlp-light", "--endpoint", daemon.ipc, "--input", "x=/nonexistent/x.npy")
    assert result.returncode == 1 and "No such file" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr, result.stderr


def test_an_input_that_is_no_array_or_no_input_of_the_model_gets_one_line(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    """Tracebacks before (a text file, a pickled object array, a batch past memory), and an
    input the model does not have was ignored: random inputs sent, exit 0."""
    text, objects = tmp_path / "text.npy", tmp_path / "objects.npy"
    text.write_text("not an array")
    np.save(objects, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    cases = {
        f"x={text}": "not a .npy array numpy can read",
        f"x={objects}": "not a .npy array numpy can read",
        f"y={objects}": "--input 'y': model 'mlp-light' has no such input; it has ['x']",
    }
    for given, phrase in cases.items():
        result = edged("infer", "mlp-light", "--endpoint", daemon.ipc, "--input", given)
        assert result.returncode == 1 and phrase in result.stderr and "Traceback" not in result.stderr, result.stderr
    huge = edged("infer", "mlp-light", "--endpoint", daemon.ipc, "--batch", str(10**15))
    assert huge.returncode == 1 and "does not fit in memory" in huge.stderr, huge.stderr
