"""`edged demo`: start a daemon on the demo models and show it answering."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from edged.client import Client, EdgedError
from edged.loadgen.launch import DaemonProcess

# The demo's requests are realtime's, with a deadline a busy box can keep: the class's
# own 20 ms is a control loop's, and a newcomer's laptop, mid-build, would see its
# first requests refused (an honest refusal, but not what the demo is for).
DEADLINE_MS = 1000.0


def run_demo(requests: int) -> int:
    with tempfile.TemporaryDirectory(prefix="edged-demo-") as folder:
        endpoint = f"ipc://{folder}/edged.sock"
        log_path = Path(folder) / "daemon.log"
        print(f"starting: edged serve --endpoint {endpoint}")
        with DaemonProcess([endpoint], log_path=log_path) as daemon:
            daemon.wait_serving()
            print("daemon log:", *("  " + line for line in log_path.read_text().splitlines()), sep="\n")
            with Client(endpoint) as client:
                print(f"\nhealth: {client.health()}")
                rng = np.random.default_rng(0)
                for model in client.models():
                    _show_model(client, model, requests, rng)
            code = daemon.stop()
        print(f"\ndaemon stopped with exit code {code}")
        return code


def _show_model(client: Client, model: dict, requests: int, rng: np.random.Generator) -> None:
    spec = model["inputs"][0]
    shape = [1 if d == -1 else d for d in spec["shape"]]
    x = rng.standard_normal(shape).astype(np.float32)
    print(
        f"\nmodel {model['name']} ({model['backend']}, {model['precision']}): "
        f"{spec['name']}{spec['shape']} -> {[o['name'] + str(o['shape']) for o in model['outputs']]}"
    )
    try:
        reply = client.infer_reply(model["name"], {spec["name"]: x}, klass="realtime", deadline_ms=DEADLINE_MS)
    except EdgedError as exc:  # the daemon answered, with a refusal: say which, and go on
        print(f"  refused: {exc}")
        return
    for name, array in reply.outputs.items():
        print(f"  {name} = {np.array2string(array[0], precision=3, max_line_width=100)}")
    inside, round_trip, refused = [], [], 0
    for _ in range(requests):
        start = time.perf_counter_ns()
        try:
            reply = client.infer_reply(model["name"], {spec["name"]: x}, klass="realtime", deadline_ms=DEADLINE_MS)
        except EdgedError:
            refused += 1
            continue
        round_trip.append((time.perf_counter_ns() - start) / 1000)
        inside.append(reply.header["timing_us"]["total"])
    if not round_trip:
        print(f"  {requests} realtime requests, one at a time: all refused (the box is too busy)")
        return
    p50, p99 = np.percentile(round_trip, [50, 99])
    print(
        f"  {requests} realtime requests, one at a time: round trip p50 {p50:.0f} us, p99 {p99:.0f} us "
        f"(inside the daemon p50 {np.percentile(inside, 50):.0f} us)" + (f", {refused} refused" if refused else "")
    )
