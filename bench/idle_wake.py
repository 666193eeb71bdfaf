"""What waking an idle core costs a round trip on this box: edged and the naive server,
with the box's cores left to idle between requests and with them kept awake.

    python bench/idle_wake.py [--rounds 6] [--requests 600] [--json FILE] [--baseline DIR]

mlp-light, closed loop, the default class on the shared endpoint (as bench/compare.py's
`edged` path sends it), beside the naive server (bench/paths.py) and a second edged whose
whole process is pinned to one core (`taskset`: every hand-off between its threads stays
on that core), and with --baseline DIR another checkout's daemon (edged-before), round
after round, in an order reversed each round. Each round runs twice: as the box is, then
with one busy loop per core at SCHED_IDLE, which takes only the time nothing else wants,
so that no core idles while every thread of the servers still runs first. Reported: each
way's round trip p50 (the median over the rounds) and each round's ratio to the naive
server's in the same round and way.

Why: on a VM whose guest halt polling is off, as on the box of docs/benchmarks.md, a
core that idles is woken by the hypervisor, and a ratio read off such a box can carry
that as well as the server's own work. Results: docs/benchmarks.md, "Idle cores".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import msgpack
from paths import RoundTrips, helper_server, machine, machine_line

from edged.loadgen.launch import DaemonProcess, checkout_program

EDGED = [sys.executable, "-m", "edged"]
# Lowered to SCHED_IDLE before it spins: never ahead of a thread of any server.
SPIN = "import os\nos.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\nwhile True:\n    pass\n"


@contextlib.contextmanager
def cores_awake(awake: bool) -> Iterator[None]:
    """One busy loop a usable core at SCHED_IDLE while inside, if `awake`."""
    cores = len(os.sched_getaffinity(0)) if awake else 0
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(cores)]
    try:
        time.sleep(0.3 if awake else 0.0)
        if any(spinner.poll() is not None for spinner in spinners):
            raise RuntimeError("a busy loop ended at once: the cores are not kept awake")
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def ok_round_trips(client: RoundTrips, requests: int) -> list[float]:
    """`requests` round trips' times (us); a reply not OK ends the run: a fast wrong answer is no figure."""
    timed = client.with_headers("mlp-light", requests, 50)
    statuses = {msgpack.unpackb(header)["status"] for _, header in timed}
    if statuses != {"OK"}:
        raise RuntimeError(f"replies not OK: {sorted(statuses)}")
    return [elapsed_us for elapsed_us, _ in timed]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--json", type=Path, help="write every round's figures here")
    parser.add_argument("--baseline", help="also run another checkout's daemon (edged-before), in the same rounds")
    args = parser.parse_args()
    where = machine()
    print(machine_line(where), flush=True)
    p50s: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="edged-idle-") as folder, contextlib.ExitStack() as stack:
        core = str(max(os.sched_getaffinity(0)))
        daemons = [
            stack.enter_context(DaemonProcess([f"ipc://{folder}/edged.sock"])),
            stack.enter_context(
                DaemonProcess([f"ipc://{folder}/edged-one-core.sock"], program=["taskset", "-c", core, *EDGED])
            ),
        ]
        if args.baseline:
            before = DaemonProcess([f"ipc://{folder}/edged-before.sock"], program=checkout_program(args.baseline))
            daemons.append(stack.enter_context(before))
        naive = helper_server("naive_server", f"ipc://{folder}/naive.sock")
        stack.callback(naive.kill)
        for daemon in daemons:
            daemon.wait_serving()
        names = ("edged", "edged-one-core", "naive", *(("edged-before",) if args.baseline else ()))
        clients = {name: RoundTrips(f"ipc://{folder}/{name}.sock", klass=None) for name in names}
        for client in clients.values():
            client("mlp-light", 300, 100)  # each warm, and the naive server surely up
        for turn in range(args.rounds):
            for awake in (False, True):
                with cores_awake(awake):
                    for name in sorted(clients, reverse=bool(turn % 2)):
                        way = f"{name}, cores {'kept awake' if awake else 'as the box is'}"
                        samples = ok_round_trips(clients[name], args.requests)
                        p50s.setdefault(way, []).append(statistics.median(samples))
        for client in clients.values():
            client.close()
    report = {}
    for way, values in p50s.items():
        naive_way = "naive" + way[way.index(",") :]
        ratios = [round(a / b, 2) for a, b in zip(values, p50s[naive_way])]
        report[way] = {"p50_us": round(statistics.median(values), 1), "rounds_p50_us": values, "vs_naive": ratios}
        print(f"{way:40} p50 {statistics.median(values):7.1f} us   each round against the naive server: {ratios}")
    print(f"load average at the end {os.getloadavg()}")
    if args.json:
        args.json.write_text(json.dumps({"machine": where, "requests": args.requests, "ways": report}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
