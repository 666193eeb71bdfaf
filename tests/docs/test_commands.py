"""Every command README.md and docs/*.md show is run or parsed.

Quick ones run for real: each `--help`, the console sessions (`$ edged ...` against the
docs' endpoint, here a daemon this test starts; their output compared with numbers
masked), and the Python clients of the README and of the protocol's worked example. The
rest are parsed against what they name (KINDS says how, and why they are not run): a
renamed flag, a removed script or extra turns this red.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from support import REPO_ROOT, RunningDaemon, run_edged
from support.docs import DOCS, DOCS_ENDPOINT, Block, Command, blocks, flagged, program, shown_commands

from edged.cli.commands import build_parser

# Python blocks run for real: whole programs, not fragments (a fragment, such as a shared
# memory call on a model the demo repository lacks, is shown, not run).
RUNNABLE_PYTHON = {
    ("README.md", "A client in ten lines"),
    ("protocol.md", "A worked example: pyzmq and msgpack only"),
}
# Parsed, not run, and why: each kind of command and what the test checks of it.
KINDS = {
    "edged": "parsed by edged's own argument parser (a synopsis, with FILE or [--flag], by its flags); "
    "serving, benchmarks, builds and keys are long or write outside the test",
    "python script": "the script exists and its arguments parse against its own argparse parser "
    "(benchmarks run for minutes)",
    "python -c": "compiled (it needs a daemon and models of a deployment)",
    "transcript": "a console session recorded on files the repository does not hold (public models): "
    "its commands parsed as `edged` ones",
    "pip install": "each extra named exists in pyproject.toml (an install takes minutes and the network)",
    "pytest": "the paths it names exist (the suite is .ci/run's)",
    "shell script": "exists, and `bash -n` parses it (it needs a GPU)",
    "system": "systemctl, install, cp, docker, kubectl...: the repository files and units they name "
    "exist (they change the machine)",
}
SYSTEM = {
    "useradd",
    "usermod",
    "install",
    "cp",
    "mkdir",
    "systemctl",
    "journalctl",
    "docker",
    "kubectl",
    "sleep",
    "ruff",
    "systemd-analyze",
}
REPO_PATH = re.compile(r"^(?:systemd|deploy|docs|engines|bench|build_scripts|tests|clients)/")
COMMANDS = shown_commands()


def test_the_docs_show_commands_of_every_kind_this_test_knows() -> None:
    names = {program(c.argv)[0] for c in COMMANDS}
    assert {"edged", "python3", "pip", "pytest", "systemctl"} <= names, names


# --- edged -------------------------------------------------------------------------


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def flags_of(parser: argparse.ArgumentParser) -> set[str]:
    return {flag for action in parser._actions for flag in action.option_strings}


def check_edged_synopsis(args: list[str]) -> list[str]:
    """A usage line: its subcommands exist, and every --flag it names is one of theirs."""
    parser, problems = build_parser(), []
    words = [w.strip("[]") for w in args]
    subcommands = subparsers(parser)
    while words and subcommands and not words[0].startswith("-"):
        names = words.pop(0).split("|")
        chosen = [subcommands.get(name) for name in names]
        if None in chosen:
            return [f"no subcommand {names} (have {sorted(subcommands)})"]
        parser = chosen[0]
        for other in chosen[1:]:
            problems += [f"{f} is not an option of {other.prog}" for f in flagged(words) - flags_of(other)]
        subcommands = subparsers(parser)
    problems += [f"{flag} is not an option of {parser.prog}" for flag in flagged(words) - flags_of(parser)]
    return problems


def parse_edged(args: list[str]) -> str | None:
    """What edged's parser says of a command line, or None where it takes it."""
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args(args)
    except SystemExit as exc:
        return None if exc.code == 0 else errors.getvalue().strip()
    return None


def test_every_edged_command_shown_parses_against_edged_s_parser() -> None:
    problems = []
    for command in COMMANDS:
        name, args = program(command.argv)
        if name != "edged":
            continue
        if command.synopsis:
            problems += [f"{command.where}: {' '.join(command.argv)}: {p}" for p in check_edged_synopsis(args)]
        elif (error := parse_edged(args)) is not None:
            problems.append(f"{command.where}: {' '.join(command.argv)}: {error}")
    assert not problems, "\n".join(problems)


def test_edged_help_runs_for_real_and_names_every_subcommand() -> None:
    done = run_edged("--help")
    assert done.returncode == 0, done.stderr
    for name in subparsers(build_parser()):
        assert name in done.stdout


def test_every_help_shown_runs_for_real() -> None:
    shown = [c for c in COMMANDS if program(c.argv)[0] == "edged" and c.argv[-1] == "--help"]
    assert shown, "the docs show `edged --help`"
    for command in shown:
        done = run_edged(*program(command.argv)[1])
        assert done.returncode == 0, f"{command.where}: {done.stderr}"


# --- console sessions and Python clients, against a daemon ---------------------------


def masked(text: str) -> str:
    """Output with its numbers masked and its spacing dropped: what a rerun must match."""
    return re.sub(r"\s+", "", re.sub(r"-?\d+(\.\d+)?(e[-+]?\d+)?", "#", text))


def live(command: Command) -> bool:
    """A session's command that asks the docs' daemon, which this test starts (`serve`
    is that daemon). A session that names no such endpoint is a transcript recorded on
    files the repository does not hold (public models): parsed, not run."""
    name, args = program(command.argv)
    return command.output is not None and name == "edged" and args[:1] != ["serve"] and DOCS_ENDPOINT in args


def test_console_sessions_run_for_real_against_a_daemon_and_print_what_the_docs_show(
    daemon: RunningDaemon,
) -> None:
    sessions = [c for c in COMMANDS if live(c)]
    assert sessions, "the docs show a console session with `edged infer`"
    for command in sessions:
        args = [daemon.ipc if a == DOCS_ENDPOINT else a for a in program(command.argv)[1]]
        done = run_edged(*args)
        assert command.output is not None
        expected_code = 1 if command.output.startswith("edged: ") else 0
        printed = done.stdout + done.stderr
        assert done.returncode == expected_code, f"{command.where}: {' '.join(command.argv)}\n{printed}"
        assert masked(printed) == masked(command.output), (
            f"{command.where}: {' '.join(command.argv)} printed\n{printed}\nwhere the docs show\n{command.output}"
        )


def runnable_python() -> list[Block]:
    return [b for doc in DOCS for b in blocks(doc) if b.lang == "python" and (doc.name, b.heading) in RUNNABLE_PYTHON]


def test_every_runnable_python_block_is_found() -> None:
    assert {(b.doc.name, b.heading) for b in runnable_python()} == RUNNABLE_PYTHON


@pytest.mark.parametrize("block", runnable_python(), ids=lambda b: b.where)
def test_the_python_clients_shown_run_for_real_and_print_what_their_comments_say(
    block: Block, daemon: RunningDaemon
) -> None:
    code = block.text.replace(DOCS_ENDPOINT, daemon.ipc)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, f"{block.where}:\n{done.stdout}\n{done.stderr}"
    # `print(...)  # WHAT` promises that WHAT is printed.
    for promised in re.findall(r"print\(.*\)[ \t]+#[ \t]*(.+)$", block.text, flags=re.M):
        assert promised.strip() in done.stdout, f"{block.where}: {promised!r} not in\n{done.stdout}"


# --- the other commands: parsed -------------------------------------------------------

# Runs each script as `python SCRIPT ARGS` would, up to its parser: its parse_known_args
# parses (mode "parse") or only lists its flags (mode "flags"), then stops the script.
PARSE_SCRIPT = r"""
import argparse, json, runpy, sys

class Parsed(Exception):
    pass

real = argparse.ArgumentParser.parse_known_args
mode = "parse"
flags = {}
inside = False  # a subcommand's parser is called from within the script's own

def parse_known_args(self, args=None, namespace=None):
    global inside
    if inside:
        return real(self, args, namespace)
    inside = True
    try:
        if mode == "flags":
            flags[sys.argv[0]] = sorted(f for action in self._actions for f in action.option_strings)
        else:
            real(self, args, namespace)
    finally:
        inside = False
    raise Parsed

argparse.ArgumentParser.parse_known_args = parse_known_args
problems = []
for path, args, mode in json.loads(sys.argv[1]):
    sys.argv = [path, *args]
    sys.path.insert(0, path.rsplit("/", 1)[0])  # as `python SCRIPT` puts its folder first
    try:
        runpy.run_path(path, run_name="__main__")
        problems.append(f"{path}: never parsed its arguments")
    except Parsed:
        pass
    except SystemExit as exc:
        if exc.code not in (0, None):
            problems.append(f"{path} {' '.join(args)}: exit {exc.code}")
    finally:
        sys.path.pop(0)
print(json.dumps({"problems": problems, "flags": flags}))
"""


def run_in_own_group(argv: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    """Run a child in a process group of its own, which a timeout ends whole: a script
    that ran past its parser would have started servers of its own."""
    child = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT, start_new_session=True
    )
    try:
        stdout, stderr = child.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        stdout, stderr = child.communicate()
        pytest.fail(f"parsing the scripts took over {timeout_s} s: one ran past its parser?\n{stderr[-3000:]}")
    return subprocess.CompletedProcess(argv, child.returncode, stdout, stderr)


def script_path(command: Command, name: str) -> Path | None:
    doc_dir = REPO_ROOT / command.where.split(":")[0].split(" ")[0]
    for base in (REPO_ROOT, doc_dir.parent):
        if (base / name).is_file():
            return base / name
    return None


def test_every_script_shown_exists_and_its_arguments_parse_against_its_own_parser() -> None:
    runs: list[tuple[str, list[str], str]] = []
    synopses: list[tuple[Command, Path, set[str]]] = []
    problems = []
    for command in COMMANDS:
        name, args = program(command.argv)
        if not re.fullmatch(r"python3?", name) or not args or args[0].startswith("-"):
            continue
        path = script_path(command, args[0])
        if path is None:
            problems.append(f"{command.where}: {args[0]} does not exist")
        elif "argparse" not in path.read_text():
            if args[1:]:
                problems.append(f"{command.where}: {args[0]} takes no arguments, the docs give {args[1:]}")
        elif command.synopsis:  # a usage line: the flags it names are the script's
            runs.append((str(path), [], "flags"))
            synopses.append((command, path, flagged([w.strip("[]") for w in args[1:]])))
        else:
            runs.append((str(path), args[1:], "parse"))
    done = run_in_own_group([sys.executable, "-c", PARSE_SCRIPT, json.dumps(runs)], timeout_s=240)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    problems += result["problems"]
    for command, path, named in synopses:
        known = set(result["flags"].get(str(path), ()))
        problems += [f"{command.where}: {path.name} has no {flag}" for flag in sorted(named - known)]
    assert runs, "the docs show benchmark commands"
    assert not problems, "\n".join(problems) + "\n" + done.stderr[-2000:]


def test_every_python_dash_c_shown_compiles() -> None:
    for command in COMMANDS:
        name, args = program(command.argv)
        if re.fullmatch(r"python3?", name) and args[:1] == ["-c"]:
            compile(args[1], command.where, "exec")


EXTRAS = set(tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])


def test_every_pip_install_names_extras_that_exist() -> None:
    problems = []
    for command in COMMANDS:
        name, args = program(command.argv)
        if name in ("pip", "pip3") and args[:1] == ["install"]:
            for spec in args[1:]:
                extras = re.search(r"^(?:\.|edged|/path/to/edged)\[([\w,]+)\]$", spec)
                for extra in extras.group(1).split(",") if extras else ():
                    if extra not in EXTRAS:
                        problems.append(f"{command.where}: no extra {extra!r} (have {sorted(EXTRAS)})")
    assert not problems, "\n".join(problems)


def test_every_other_command_names_only_files_and_units_that_exist() -> None:
    problems, unknown = [], set()
    for command in COMMANDS:
        name, args = program(command.argv)
        if name in ("edged", "pip", "pip3") or re.fullmatch(r"python3?", name):
            continue
        if name == "pytest":
            problems += [f"{command.where}: no {a}" for a in args if not a.startswith("-") and not exists(a)]
        elif name.endswith(".sh"):
            path = REPO_ROOT / command.argv[0]
            if not path.is_file() or subprocess.run(["bash", "-n", str(path)], check=False).returncode:
                problems.append(f"{command.where}: {command.argv[0]} is not a shell script that parses")
        elif name == "systemctl":
            for unit in (a for a in args[1:] if not a.startswith("-")):
                if not (REPO_ROOT / "systemd" / f"{re.sub(r'@.+$', '@', unit)}.service").is_file():
                    problems.append(f"{command.where}: no unit systemd/{unit}.service")
        elif name in SYSTEM:
            for arg in args:
                for part in re.split(r"=", arg):
                    if REPO_PATH.match(part) and not exists(part):
                        problems.append(f"{command.where}: {name} names {part}, which does not exist")
        else:
            unknown.add(f"{command.where}: {' '.join(command.argv)}")
    assert not problems, "\n".join(problems)
    assert not unknown, "commands this test does not know how to check (add them to KINDS):\n" + "\n".join(
        sorted(unknown)
    )


def exists(path: str) -> bool:
    """A repository path as the docs write it, braces ({a,b}) and globs (*) allowed."""
    braces = re.search(r"\{([^}]*)\}", path)
    if braces:
        return all(exists(path.replace(braces.group(0), choice)) for choice in braces.group(1).split(","))
    return any(REPO_ROOT.glob(path.rstrip("/"))) if "*" in path else (REPO_ROOT / path.rstrip("/")).exists()
