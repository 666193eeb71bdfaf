"""The `edged` command: serve, and talk to a daemon that serves."""

from __future__ import annotations

import argparse
import faulthandler
import json
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edged.config import ConfigError, default_endpoint, load_config

if TYPE_CHECKING:
    from edged.client import Client


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except ConfigError as exc:
        print(f"edged: configuration error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        from edged.client import EdgedError

        if isinstance(exc, EdgedError):
            print(f"edged: {exc}", file=sys.stderr)
            return 1
        raise


def build_parser() -> argparse.ArgumentParser:
    """Every subcommand and option (the deployment tests parse the manifests' probes with it)."""
    parser = argparse.ArgumentParser(prog="edged", description="A latency-first inference daemon.")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the daemon in the foreground")
    serve.add_argument("--config", type=Path, help="TOML config file (default: built-in defaults)")
    serve.add_argument(
        "--endpoint",
        action="append",
        metavar="URL",
        help="ipc:// or tcp:// endpoint to bind, repeatable; replaces server.endpoints",
    )
    serve.set_defaults(run=_serve)

    demo = commands.add_parser("demo", help="start a daemon on the demo models and show it answering")
    demo.add_argument("--requests", type=int, default=500, help="requests per model (default 500)")
    demo.set_defaults(run=_demo)

    keygen = commands.add_parser(
        "keygen", help="write a CURVE key pair: DIR/NAME.key (public) and DIR/NAME.key_secret (secret, mode 0600)"
    )
    keygen.add_argument("dir", type=Path, help="folder to write the two files into (created if missing)")
    keygen.add_argument("--name", default="edged", help="file name stem (default: edged)")
    keygen.set_defaults(run=_keygen)

    config = commands.add_parser("config", help="check a config file without starting, or explain every key")
    action = config.add_mutually_exclusive_group(required=True)
    action.add_argument(
        "--check",
        type=Path,
        metavar="FILE",
        help="check FILE as start-up does: exit 0 printing 'FILE: ok', or exit 2 with start-up's error",
    )
    action.add_argument(
        "--explain",
        nargs="?",
        const="",
        metavar="KEY",
        help="each key's type, default, valid values and meaning; or only a table's (server) or a key's "
        "(classes.bulk.nice)",
    )
    action.add_argument(
        "--markdown",
        action="store_true",
        help="the same reference in Markdown: docs/configuration.md (edged config --markdown > docs/configuration.md)",
    )
    config.set_defaults(run=_config)

    from edged.cli.importer import add_parser as add_import

    add_import(commands)

    from edged.toolchain.cli import add_parser as add_build

    add_build(commands)

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
    infer.add_argument("--batch", type=int, default=1, help="batch size of random inputs (default 1)")
    infer.add_argument("--class", dest="klass", help="priority class (default: the daemon's default)")
    infer.add_argument("--deadline-ms", type=float, help="the request's time budget in the daemon")
    infer.add_argument("--repeat", type=int, default=1, help="send it this many times and print latency percentiles")
    infer.set_defaults(run=_infer)

    bench = commands.add_parser("bench", help="open-loop load with a class mix: percentiles, goodput, shed")
    bench.add_argument(
        "--endpoint",
        action="append",
        help="a running daemon (default: start one for the run); repeat it for a fleet: calls then go "
        "through the fleet client (retries, hedging) and figures are given per daemon",
    )
    bench.add_argument("--hedge", action="store_true", help="with several endpoints: hedge calls (default delay: p95)")
    bench.add_argument("--hedge-after-ms", type=float, help="with --hedge: a fixed hedge delay")
    bench.add_argument("--config", type=Path, help="config of the daemon it starts")
    bench.add_argument(
        "--mix",
        action="append",
        metavar="CLASS:MODEL:RATE[:DEADLINE_MS[:ROWS]]",
        help="a stream of Poisson arrivals, repeatable (default: realtime:mlp-light:200 and bulk:cnn-heavy:200)",
    )
    bench.add_argument("--duration", type=float, default=10.0, help="seconds per step (default 10)")
    bench.add_argument("--sweep", default="1", help="multipliers of every rate, one step each, e.g. 0.5,1,2,3")
    bench.add_argument("--json", type=Path, help="write every step's figures here")
    bench.add_argument("--png", type=Path, help="plot latency percentiles against offered load here")
    bench.add_argument(
        "--isolation",
        action="store_true",
        help="realtime beside a bulk flood of the same heavy model, with each precedence rule off in turn "
        "(ignores --mix, --sweep, --endpoint and --config; --duration is per step)",
    )
    bench.set_defaults(run=_bench)
    return parser


def _endpoint_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--endpoint",
        default=os.environ.get("EDGED_ENDPOINT") or default_endpoint(),
        help="the daemon's endpoint (default: $EDGED_ENDPOINT, else the default ipc socket)",
    )
    parser.add_argument("--timeout-ms", type=float, default=5000.0, help="how long to wait for a reply")
    parser.add_argument("--server-key", type=Path, help="a CURVE tcp endpoint: the daemon's public key file")
    parser.add_argument("--client-key", type=Path, help="a CURVE tcp endpoint: this client's .key_secret file")


def _client(args: argparse.Namespace) -> Client:
    from edged.client import Client
    from edged.client.keys import ClientKeys

    if (args.server_key is None) != (args.client_key is None):
        raise SystemExit("edged: --server-key and --client-key go together")
    try:
        curve = ClientKeys.from_files(args.server_key, args.client_key) if args.server_key else None
    except (OSError, ValueError) as exc:
        raise SystemExit(f"edged: {exc}") from None
    return Client(args.endpoint, timeout_ms=args.timeout_ms, curve=curve)


def _serve(args: argparse.Namespace) -> int:
    from edged.daemon.daemon import Daemon
    from edged.models.repository import RepositoryError
    from edged.serve.transport.binding import EndpointError

    # A fatal signal (a SIGSEGV in a runtime, a SIGBUS) leaves every thread's traceback on stderr: the journal.
    faulthandler.enable()
    config = load_config(args.config)
    if args.endpoint:
        config = config.with_endpoints(args.endpoint)
    # journald stamps each line itself; a terminal gets the time from us.
    stamp = "" if os.environ.get("JOURNAL_STREAM") else "%(asctime)s "
    logging.basicConfig(level=config.log_level.upper(), format=stamp + "%(levelname)s %(name)s: %(message)s")
    try:
        # SIGHUP re-reads the same file; endpoints stay as bound (a change needs a restart).
        code = Daemon(config, reread_config=lambda: load_config(args.config)).run()
    except (EndpointError, RepositoryError) as exc:
        logging.getLogger("edged").error("%s", exc)
        return 1
    # A backend call that the stop cut short, or that the lane watchdog gave up on, is
    # still running native code on its thread. A normal exit would destroy the runtime's
    # thread pools under it (seen: "terminate called without an active exception",
    # SIGABRT, exit -6). Every reply is sent by now: leave without the C++ destructors.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _keygen(args: argparse.Namespace) -> int:
    from edged.client.keys import write_key_pair

    try:
        public, secret = write_key_pair(args.dir, args.name)
    except OSError as exc:
        print(f"edged: {exc}", file=sys.stderr)
        return 1
    print(f"public key: {public}\nsecret key: {secret}")
    return 0


def _config(args: argparse.Namespace) -> int:
    from edged.config.reference import explain, markdown

    if args.check is not None:
        load_config(args.check)  # a ConfigError is printed and exits 2 in main(), as at start-up
        print(f"{args.check}: ok")
    elif args.markdown:
        print(markdown(), end="")
    else:
        print(explain(args.explain), end="")
    return 0


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
    with _client(args) as client:
        model = _find_model(client.models(), args.model)
        inputs = _inputs(model, args.input, args.batch)
        latencies = []
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

    files = {}
    for item in given:
        name, sep, path = item.partition("=")
        if not sep:
            raise SystemExit(f"edged: --input takes NAME=FILE.npy, got {item!r}")
        files[name] = np.load(path)
    rng = np.random.default_rng(0)
    inputs = {}
    for spec in model["inputs"]:
        if spec["name"] in files:
            inputs[spec["name"]] = files[spec["name"]]
            continue
        shape = [batch if i == 0 and d == -1 else max(d, 1) for i, d in enumerate(spec["shape"])]
        inputs[spec["name"]] = rng.standard_normal(shape).astype(DTYPES[spec["dtype"]])
    return inputs


def _bench(args: argparse.Namespace) -> int:
    from edged.cli.bench import run_bench

    return run_bench(args)


def _demo(args: argparse.Namespace) -> int:
    from edged.cli.demo import run_demo

    return run_demo(args.requests)


if __name__ == "__main__":
    sys.exit(main())
