"""The commands that ask a running daemon: `models`, `health` and `stats` (its control
ops, as tables or JSON) and `infer` (one model, its outputs and timing)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edged.cli.arguments import positive_float, positive_int
from edged.config import default_endpoint

if TYPE_CHECKING:
    from edged.client import Client


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `models`, `health`, `stats` and `infer` to the `edged` command's subcommands."""
    for name, helptext in (
        ("models", "a line per served model: its tensors and what a row costs on each class's lane (ms)"),
        ("health", "the daemon's state, and a line per class: its lane and its sockets"),
        ("stats", "a line per class: queued, completed, shed, expired, failed, latency p50/p99/p99.9 (ms)"),
    ):
        sub = commands.add_parser(name, help=helptext)
        _endpoint_option(sub)
        sub.add_argument("--json", action="store_true", help="print the daemon's reply as JSON (for scripts)")
        sub.set_defaults(run=_control, op=name)
        if name == "health":
            from edged.cli.probe import PROBES

            sub.add_argument(
                "--probe",
                choices=PROBES,
                help="exit 0 if the daemon is live (its loop answers), started (warm-up done) or ready "
                "(serving, every lane ok), else 1; prints one line",
            )

    infer = commands.add_parser("infer", help="run one model and print its outputs and timing")
    infer.add_argument("model")
    _endpoint_option(infer)
    infer.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="NAME=FILE.npy",
        help="an input from a .npy file, repeatable; inputs not given are random",
    )
    infer.add_argument("--batch", type=positive_int, default=1, help="batch size of random inputs (default 1)")
    infer.add_argument("--class", dest="klass", help="priority class (default: the daemon's default)")
    infer.add_argument("--deadline-ms", type=float, help="the request's time budget in the daemon")
    infer.add_argument(
        "--repeat", type=positive_int, default=1, help="send it this many times and print latency percentiles"
    )
    infer.set_defaults(run=_infer)


def _endpoint_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--endpoint",
        default=os.environ.get("EDGED_ENDPOINT") or default_endpoint(),
        help="the daemon's endpoint (default: $EDGED_ENDPOINT, else the default ipc socket)",
    )
    parser.add_argument("--timeout-ms", type=positive_float, default=5000.0, help="how long to wait for a reply")
    parser.add_argument("--server-key", type=Path, help="a CURVE tcp endpoint: the daemon's public key file")
    parser.add_argument("--client-key", type=Path, help="a CURVE tcp endpoint: this client's .key_secret file")


def _client(args: argparse.Namespace, class_ports: dict[str, int] | None = None) -> Client:
    from edged.client import Client
    from edged.client.keys import ClientKeys

    if (args.server_key is None) != (args.client_key is None):
        raise SystemExit("edged: --server-key and --client-key go together")
    try:
        curve = ClientKeys.from_files(args.server_key, args.client_key) if args.server_key else None
    except (OSError, ValueError) as exc:
        raise SystemExit(f"edged: {exc}") from None
    return Client(args.endpoint, timeout_ms=args.timeout_ms, curve=curve, class_ports=class_ports)


def _control(args: argparse.Namespace) -> int:
    from edged.cli.tables import health_table, models_table, stats_table

    with _client(args) as client:
        result = getattr(client, args.op)()
        if getattr(args, "probe", None):
            from edged.cli.probe import verdict

            passed, line = verdict(args.probe, result)
            print(line)
            return 0 if passed else 1
        if args.json:
            print(json.dumps(result, indent=2))
        elif args.op == "models":
            print(models_table(result, client.stats(), client.health()))
        else:
            print(stats_table(result) if args.op == "stats" else health_table(result))
    return 0


def _infer(args: argparse.Namespace) -> int:
    from edged.wire.endpoints import is_tcp, tcp_class_ports

    with _client(args) as client:
        model = _find_model(client.models(), args.model)
        # Over tcp, a class with a socket of its own (its tcp_port) is sent there, as the
        # library's client given `class_ports` sends it: so --repeat times that path.
        ports = tcp_class_ports(client.health()["ingress"]) if args.klass and is_tcp(args.endpoint) else {}
    inputs = _inputs(model, args.input, args.batch)
    latencies = []
    with _client(args, ports) as client:
        for _ in range(args.repeat):
            reply = client.infer_reply(args.model, inputs, klass=args.klass, deadline_ms=args.deadline_ms)
            latencies.append(reply.header["timing_us"]["total"])
    for name, array in reply.outputs.items():
        print(f"{name}: {array.dtype} {list(array.shape)}")
        print(np.array2string(array, precision=4, threshold=40, edgeitems=4))
    timing = reply.header["timing_us"]
    print(
        f"timing (us, inside the daemon): queue {timing['queue']}, compute {timing['compute']}, total {timing['total']}"
    )
    if args.repeat > 1:
        p50, p99 = np.percentile(latencies, [50, 99])
        print(f"{args.repeat} requests: total p50 {p50:.0f} us, p99 {p99:.0f} us")
    return 0


def _find_model(models: list[dict[str, Any]], name: str) -> dict[str, Any]:
    for model in models:
        if model["name"] == name:
            return model
    from edged.client import NotFound

    raise NotFound(f"NOT_FOUND: the daemon serves no model {name!r}; it serves {[m['name'] for m in models]}")


def _inputs(model: dict[str, Any], given: list[str], batch: int) -> dict[str, np.ndarray]:
    from edged.wire.codec import DTYPES

    names = [spec["name"] for spec in model["inputs"]]
    files = {}
    for item in given:
        name, sep, path = item.partition("=")
        if not sep:
            raise SystemExit(f"edged: --input takes NAME=FILE.npy, got {item!r}")
        if name not in names:
            raise SystemExit(f"edged: --input {name!r}: model {model['name']!r} has no such input; it has {names}")
        try:
            files[name] = np.load(path)  # object arrays refused: unpickling a file runs its code
        except (ValueError, OSError, EOFError) as exc:
            raise SystemExit(f"edged: --input {item}: not a .npy array numpy can read: {exc}") from None
    rng = np.random.default_rng(0)
    inputs = {}
    for spec in model["inputs"]:
        if spec["name"] in files:
            inputs[spec["name"]] = files[spec["name"]]
            continue
        shape = [batch if i == 0 and d == -1 else max(d, 1) for i, d in enumerate(spec["shape"])]
        try:
            inputs[spec["name"]] = rng.standard_normal(shape).astype(DTYPES[spec["dtype"]])
        except MemoryError:
            raise SystemExit(f"edged: --batch {batch}: {spec['name']} {shape} does not fit in memory") from None
    return inputs
