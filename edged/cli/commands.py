"""The `edged` command: serve, and talk to a daemon that serves (edged.cli.client_commands)."""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import signal
import sys
from pathlib import Path

from edged.cli.arguments import file_stem, positive_float, positive_floats, positive_int, stream
from edged.config import ConfigError, load_config


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command != "serve":  # the daemon steers its own signals
        # SIGTERM ends a command as Ctrl-C does, through its `with` blocks: a daemon that
        # `demo` or `bench` started stops, and its folder goes.
        signal.signal(signal.SIGTERM, _terminated)
    try:
        return args.run(args)
    except KeyboardInterrupt:
        print("edged: interrupted", file=sys.stderr)
        return 130
    except ConfigError as exc:
        print(f"edged: configuration error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        from edged.client import EdgedError

        if isinstance(exc, EdgedError):
            print(f"edged: {exc}", file=sys.stderr)
            return 1
        # A client command's bad endpoint (ZeroMQ refuses it) or missing file: one line, not a traceback.
        import zmq

        # ValueError: what the client refuses to send (an input of a dtype the wire has no name for, say).
        if args.command != "serve" and isinstance(exc, (zmq.ZMQError, OSError, ValueError)):
            print(f"edged: {exc}", file=sys.stderr)
            return 1
        raise


def _terminated(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


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
    demo.add_argument("--requests", type=positive_int, default=500, help="requests per model (default 500)")
    demo.set_defaults(run=_demo)

    keygen = commands.add_parser(
        "keygen", help="write a CURVE key pair: DIR/NAME.key (public) and DIR/NAME.key_secret (secret, mode 0600)"
    )
    keygen.add_argument("dir", type=Path, help="folder to write the two files into (created if missing)")
    keygen.add_argument("--name", default="edged", type=file_stem, help="file name stem (default: edged)")
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

    from edged.cli.client_commands import add_parsers as add_client_commands

    add_client_commands(commands)

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
        type=stream,
        metavar="CLASS:MODEL:RATE[:DEADLINE_MS[:ROWS]]",
        help="a stream of Poisson arrivals, repeatable (default: realtime:mlp-light:200 and bulk:cnn-heavy:200)",
    )
    bench.add_argument("--duration", type=positive_float, default=10.0, help="seconds per step (default 10)")
    bench.add_argument(
        "--sweep", type=positive_floats, default=[1.0], help="multipliers of every rate, one step each, e.g. 0.5,1,2,3"
    )
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


def _serve(args: argparse.Namespace) -> int:
    from edged.daemon.daemon import Daemon
    from edged.models.repository import RepositoryError
    from edged.wire.endpoints import EndpointError

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


def _bench(args: argparse.Namespace) -> int:
    from edged.cli.bench import run_bench

    return run_bench(args)


def _demo(args: argparse.Namespace) -> int:
    from edged.cli.demo import run_demo

    return run_demo(args.requests)


if __name__ == "__main__":
    sys.exit(main())
