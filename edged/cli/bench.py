"""`edged bench`, the command: which benchmark the arguments ask for, run and reported.

The load generators live in edged.loadgen.sweep (one daemon, open loop), edged.loadgen.isolation
and edged.loadgen.fleet; this module only chooses, prints and writes files.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from edged.client.members import named
from edged.config import load_config
from edged.loadgen.fleet import format_fleet, run_fleet
from edged.loadgen.isolation import format_isolation, plot_isolation, run_isolation
from edged.loadgen.launch import DaemonProcess
from edged.loadgen.sweep import Stream, format_table, plot, progress_to_stderr, run_sweep

NO_MATPLOTLIB = (
    "edged bench --png needs matplotlib, which is not installed: pip install 'edged[bench]' "
    "(from a checkout: pip install -e '.[bench]')"
)


def run_bench(args: argparse.Namespace) -> int:
    """`edged bench`: a sweep against one daemon (started here unless --endpoint names one),
    the isolation scenario, or a fleet of several endpoints (or of a DNS name's addresses)."""
    # Checked before the run, not after it has been spent.
    if args.png is not None and not _matplotlib():
        print(NO_MATPLOTLIB, file=sys.stderr)
        return 2
    for option, path in (("--json", args.json), ("--png", args.png)):
        if path is not None and (unwritable := _unwritable(path)):
            print(f"edged: {option} {path}: {unwritable}", file=sys.stderr)
            return 2
    if args.config is not None and not args.endpoint:
        load_config(args.config)  # its error now, with the key and the fix, not the daemon's exit code
    if args.isolation:
        return _bench_isolation(args)
    streams = args.mix or [Stream.parse("realtime:mlp-light:200"), Stream.parse("bulk:cnn-heavy:200")]
    if args.endpoint and (len(args.endpoint) > 1 or named(args.endpoint[0])):
        return _bench_fleet(args, streams)  # several daemons, or a DNS name that stands for several
    factors = args.sweep
    with tempfile.TemporaryDirectory(prefix="edged-bench-") as folder:
        if args.endpoint:
            steps = run_sweep(args.endpoint[0], streams, factors, args.duration, progress_to_stderr)
        else:
            log = Path(folder) / "daemon.log"
            with DaemonProcess([f"ipc://{folder}/edged.sock"], config=args.config, log_path=log) as daemon:
                try:
                    daemon.wait_serving()
                except RuntimeError as exc:
                    said = log.read_text(errors="replace").strip().splitlines() or ["it said nothing"]
                    why = next((line for line in reversed(said) if " ERROR " in line), said[-1])
                    print(f"edged: {exc}: {why}", file=sys.stderr)
                    return 1
                steps = run_sweep(daemon.endpoints[0], streams, factors, args.duration, progress_to_stderr)
    for step in steps:
        print(f"\nstep x{step['factor']:g}: offered {step['offered_rps']:.0f} req/s for {args.duration:g} s")
        print(format_table(step["classes"]))
    if args.json:
        args.json.write_text(json.dumps({"duration_s": args.duration, "steps": steps}, indent=2) + "\n")
    if args.png:
        plot(steps, str(args.png))
    return 0


def _unwritable(path: Path) -> str | None:
    """Why `path` cannot be written, or None."""
    if path.is_dir():
        return "is a folder: name a file"
    if not path.parent.is_dir():
        return f"its folder {path.parent} does not exist"
    if not os.access(path if path.exists() else path.parent, os.W_OK):
        return "cannot be written (permission denied)"
    return None


def _matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _bench_fleet(args: argparse.Namespace, streams: list[Stream]) -> int:
    result = run_fleet(args.endpoint, streams, args.duration, args.hedge, args.hedge_after_ms)
    print(format_fleet(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


def _bench_isolation(args: argparse.Namespace) -> int:
    results = run_isolation(args.duration, progress_to_stderr)
    print(format_isolation(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    if args.png:
        plot_isolation(results, str(args.png))
    return 0
