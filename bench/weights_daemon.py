"""The daemon's memory serving large models, against the same sessions in-process
(issue 23's targets): copies of a large model, and reloads that change nothing.

    python bench/weights_daemon.py [--copies 1,4,16] [--side 4096] [--reloads 80] [--baseline DIR]

The model: three float32 MatMuls of side x side (--side 4096: 192 MiB of weights).
- copies: N models of that size under different names, each imported as a file of its
  own (what `edged import` makes), served by a fresh daemon with the default classes.
  Its RSS once serving, against a fresh process that opens one CPU session per model
  and runs it once (the floor: what the weights cost without edged). Each side's own
  start (Python, ONNX Runtime, the demo-free daemon) is measured without any model and
  reported beside it.
- reloads: one such model and the demo mlp-light, light requests flowing, SIGHUP
  --reloads times with nothing changed; RSS after the first, and every 20.
With --baseline DIR (a worktree of an earlier commit), the copies are also served by
that checkout's daemon, one after the other.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import onnx

from edged.client import Client, EdgedError
from edged.loadgen.large_model import write_matmuls
from edged.loadgen.launch import DaemonProcess, checkout_program, resident_kib
from edged.models.onnx_import import write_folder

REPO_ROOT = Path(__file__).resolve().parents[1]
IN_PROCESS = """
import sys, numpy as np
from pathlib import Path
from edged.backends.onnxruntime_cpu import cpu_session
from edged.backends.host_memory import trim
paths = sys.argv[1:]
side = None
sessions = []
for path in paths:
    session = cpu_session(Path(path), "fp32")
    side = session.get_inputs()[0].shape[1]
    session.run(["y"], {"x": np.ones((1, side), np.float32)})
    sessions.append(session)
print(trim())  # the allocator's free pages given back, as the daemon's loader does
"""


def mib(kib: float) -> str:
    return f"{kib / 1024:.0f}"


def repository(root: Path, source: Path, copies: int, demo: bool) -> Path:
    repo = root / f"repo-{copies}"
    proto = onnx.load(str(source))
    for i in range(copies):
        write_folder(source, proto, repo, f"big-{i}", [], {}, False)
    if demo:
        shutil.copytree(REPO_ROOT / "engines" / "mlp-light", repo / "mlp-light")
    return repo


def in_process_kib(paths: list[Path]) -> float:
    """RSS of a fresh process holding one warm session per path (none: its start alone)."""
    out = subprocess.run(
        [sys.executable, "-c", IN_PROCESS, *map(str, paths)], capture_output=True, text=True, check=True
    )
    return int(out.stdout.strip()) / 1024


def daemon_kib(folder: Path, repo: Path, program: list[str] | None) -> tuple[float, dict[str, object]]:
    """RSS of a fresh daemon serving `repo`, once serving and after one call per model."""
    config = folder / "edged.toml"
    config.write_text(f'[server]\nmodel_repository = "{repo}"\n')
    endpoint = f"ipc://{folder}/w.sock"
    with DaemonProcess([endpoint], config=config, log_path=folder / "daemon.log", program=program) as daemon:
        daemon.wait_serving(timeout_s=600)
        with Client(endpoint) as client:
            models = [m["name"] for m in client.models()]
            for model in models:
                if model.startswith("big"):
                    side = next(m for m in client.models() if m["name"] == model)["inputs"][0]["shape"][1]
                    client.infer(model, {"x": np.ones((1, side), np.float32)}, klass="standard")
            stats = client.stats()
        return resident_kib(daemon.process.pid), stats.get("memory", {})


def copies_table(root: Path, source: Path, counts: list[int], programs: dict[str, list[str] | None]) -> list[dict]:
    rows = []
    empty = root / "repo-empty"
    empty.mkdir()
    shutil.copytree(REPO_ROOT / "engines" / "mlp-light", empty / "mlp-light")
    process_start = in_process_kib([])
    starts = {side: daemon_kib(root, empty, program)[0] for side, program in programs.items()}
    for count in counts:
        repo = repository(root, source, count, demo=False)
        paths = sorted(repo.glob("big-*/model.onnx"))
        floor = in_process_kib(paths)
        row = {"copies": count, "in_process_kib": floor, "in_process_start_kib": process_start}
        for side, program in programs.items():
            rss, memory = daemon_kib(root, repo, program)
            row[side] = {"rss_kib": rss, "start_kib": starts[side], "memory": memory}
        rows.append(row)
        shutil.rmtree(repo)
        print(json.dumps(row), flush=True)
    return rows


def reloads(root: Path, source: Path, count: int) -> dict[str, object]:
    """RSS after the first reload and after every 20, with light requests flowing."""
    repo = repository(root, source, 1, demo=True)
    config = root / "edged.toml"
    config.write_text(f'[server]\nmodel_repository = "{repo}"\n')
    endpoint = f"ipc://{root}/r.sock"
    log_path = root / "reloads.log"
    stop = threading.Event()
    outcomes = {"ok": 0, "error": 0}

    def light() -> None:
        with Client(endpoint) as client:
            x = np.zeros((1, 64), np.float32)
            while not stop.is_set():
                try:
                    client.infer("mlp-light", {"x": x}, klass="realtime")
                    outcomes["ok"] += 1
                except EdgedError:
                    outcomes["error"] += 1
                time.sleep(0.005)

    figures: dict[str, float] = {}
    with DaemonProcess([endpoint], config=config, log_path=log_path) as daemon:
        daemon.wait_serving(timeout_s=600)
        figures["before"] = resident_kib(daemon.process.pid)
        streamer = threading.Thread(target=light)
        streamer.start()
        try:
            for n in range(1, count + 1):
                done = log_path.read_text().count("reloaded")
                os.kill(daemon.process.pid, signal.SIGHUP)
                while log_path.read_text().count("reloaded") == done:
                    time.sleep(0.02)
                time.sleep(0.2)  # the old lanes drain
                if n in (1, count) or n % 20 == 0:
                    figures[str(n)] = resident_kib(daemon.process.pid)
                    print(f"after {n} reloads: {mib(figures[str(n)])} MiB", flush=True)
        finally:
            stop.set()
            streamer.join()
    return {"rss_kib": figures, "light": outcomes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--copies", default="1,4,16")
    parser.add_argument("--side", type=int, default=4096)
    parser.add_argument("--reloads", type=int, default=80)
    parser.add_argument("--baseline", help="also serve the copies with another checkout's daemon")
    parser.add_argument("--json", help="write every figure here")
    args = parser.parse_args()
    programs: dict[str, list[str] | None] = {"edged": None}
    if args.baseline:
        programs["baseline"] = checkout_program(args.baseline)
    root = Path(tempfile.mkdtemp(prefix="wd-", dir="/tmp"))
    try:
        source = root / "matmuls.onnx"
        write_matmuls(source, args.side, seed=1)
        model_mib = source.stat().st_size / 2**20
        counts = [int(c) for c in args.copies.split(",") if c]
        rows = copies_table(root, source, counts, programs) if counts else []
        reload_figures = reloads(root, source, args.reloads) if args.reloads else {}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"\nmodel: {model_mib:.0f} MiB; RSS in MiB (each side's start without the model in brackets)")
    print("| copies | in-process | " + " | ".join(f"{side} daemon | x in-process" for side in programs) + " |")
    for row in rows:
        cells = [f"{row['copies']}", f"{mib(row['in_process_kib'])} ({mib(row['in_process_start_kib'])})"]
        for side in programs:
            figures = row[side]
            cells += [
                f"{mib(figures['rss_kib'])} ({mib(figures['start_kib'])})",
                f"{figures['rss_kib'] / row['in_process_kib']:.2f}",
            ]
        print("| " + " | ".join(cells) + " |")
    if reload_figures:
        rss = reload_figures["rss_kib"]
        print(
            f"\nreloads: RSS {', '.join(f'{k} {mib(v)}' for k, v in rss.items())} MiB; "
            f"last / after the first: {rss[str(args.reloads)] / rss['1']:.3f}; light requests {reload_figures['light']}"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"model_mib": model_mib, "copies": rows, "reloads": reload_figures}, indent=1)
        )


if __name__ == "__main__":
    main()
