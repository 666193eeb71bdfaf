"""The docs are checked: what README.md and docs/*.md show is what the code does.

- Every command they show is run or parsed. Quick ones run for real: each `--help`, the
  console sessions (`$ edged ...`, against a daemon this test starts, their output
  compared with numbers masked), and the Python clients of the README and of the
  protocol's worked example. The rest are parsed against what they name (KINDS below
  says how, and why not run): a renamed flag, a removed script or extra turns it red.
- Every relative link resolves: the file exists, and an #anchor matches a heading.
- Every promise in protocol.md's "What the daemon promises" and operations.md's "Stop
  and drain" names the test that holds it, and every `tests/FILE.py::test_name` named
  anywhere in the docs exists.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import REPO_ROOT, RunningDaemon, run_edged

from edged.cli.commands import build_parser
from edged.config.file import load_config

DOCS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
SHELLS = {"sh", "bash", "shell", "console"}
# The endpoint the docs' sessions and clients use; the test's daemon's replaces it.
DOCS_ENDPOINT = "ipc:///tmp/docs.sock"
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
TEST_REFERENCE = re.compile(r"(tests/[\w/]+\.py)::(\w+)")


@dataclass(frozen=True)
class Block:
    doc: Path
    heading: str
    lang: str
    text: str
    line: int

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(REPO_ROOT)}:{self.line}"


def blocks(doc: Path) -> list[Block]:
    """The fenced code blocks of a page, each with the heading it sits under."""
    found, heading, fence, lang, start, body = [], "", None, "", 0, []
    for number, line in enumerate(doc.read_text().splitlines(), 1):
        if fence is None:
            if line.startswith("```"):
                fence, lang, start, body = "```", line[3:].strip().split(" ")[0], number, []
            elif line.startswith("#"):
                heading = line.lstrip("#").strip()
        elif line.startswith(fence):
            found.append(Block(doc, heading, lang, "\n".join(body), start))
            fence = None
        else:
            body.append(line)
    return found


def prose(doc: Path) -> str:
    """A page without its fenced blocks: where its links and headings are."""
    return re.sub(r"^```.*?^```", "", doc.read_text(), flags=re.M | re.S)


# --- commands --------------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    argv: tuple[str, ...]
    where: str
    synopsis: bool  # a usage line with placeholders: checked by its flags only
    output: str | None = None  # a console session's expected output


def logical_lines(text: str) -> list[str]:
    """Shell lines, a backslash continuation or an open quote joined to the next line."""
    lines, pending = [], ""
    for line in text.splitlines():
        pending = f"{pending}\n{line}" if pending else line
        if pending.endswith("\\"):
            pending = pending[:-1]
            continue
        try:
            shlex.split(pending, comments=True)
        except ValueError:
            continue
        lines.append(pending)
        pending = ""
    assert not pending, f"an unclosed quote: {pending!r}"
    return lines


def is_synopsis(words: list[str]) -> bool:
    return any(
        "[" in w or "]" in w or "|" in w or w == "..." or re.fullmatch(r"[A-Z][A-Z0-9_.]*(=\S*)?", w) for w in words
    )


def split_commands(line: str, where: str, output: str | None = None) -> list[Command]:
    words = shlex.split(line, comments=True)
    commands, current = [], []
    for word in [*words, "&&"]:
        if word in ("&&", "||", ";", "|", "&"):
            if current:
                commands.append(Command(tuple(current), where, is_synopsis(current), output))
            current = []
        else:
            current.append(word.removesuffix("&").removesuffix(";"))
    return commands


def shown_commands() -> list[Command]:
    """Every command of README.md and docs/*.md: shell blocks, console sessions, and
    inline code that starts with `edged ` or runs a script of the repository."""
    found: list[Command] = []
    for doc in DOCS:
        for block in blocks(doc):
            is_session = any(line.startswith("$ ") for line in block.text.splitlines())
            if is_session:
                found += session_commands(block)
            elif block.lang in SHELLS:
                for line in logical_lines(block.text):
                    found += split_commands(line, block.where)
        for span in re.findall(r"`([^`\n]+)`", prose(doc)):
            if re.match(r"(\.venv/bin/)?(edged [a-z-]|python3? (bench|build_scripts)/)", span):
                for command in split_commands(span, f"{doc.relative_to(REPO_ROOT)} (inline)"):
                    found.append(Command(command.argv, command.where, True))
    return found


def session_commands(block: Block) -> list[Command]:
    """A console session: `$ COMMAND` lines, each followed by the output it prints."""
    found, command, output = [], None, []
    for line in [*block.text.splitlines(), "$ "]:
        if line.startswith("$ "):
            if command is not None:
                text = "\n".join(output)
                found += split_commands(command, block.where, text if text != "[...]" else None)
            command, output = line[2:].strip() or None, []
        else:
            output.append(line)
    return found


def program(argv: tuple[str, ...]) -> tuple[str, list[str]]:
    """The program, with a virtual environment's bin/ and KEY=VALUE assignments taken off."""
    words = list(argv)
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
        words.pop(0)
    name = words[0].rsplit("/bin/", 1)[-1] if "/bin/" in words[0] else words[0]
    return name, words[1:]


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


def flagged(words: list[str]) -> set[str]:
    return {w.split("=")[0] for w in words if re.fullmatch(r"--?[a-z][\w-]*(=.*)?", w)}


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


# --- links ------------------------------------------------------------------------------


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text.replace("`", ""))
    return text.replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for line in prose(doc).splitlines():
        if match := re.match(r"#{1,6} (.+)", line):
            base = slug(match.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(REPO_ROOT)))
def test_every_relative_link_resolves_to_a_file_and_a_heading(doc: Path) -> None:
    problems = []
    for target in re.findall(r"\]\(([^)\s]+)\)", prose(doc)):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            problems.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            problems.append(f"{target}: no heading #{anchor} in {file.name}")
    assert not problems, "\n".join(problems)


# --- promises ---------------------------------------------------------------------------


def section(doc: Path, title: str) -> str:
    text = prose(doc)
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def promises(text: str) -> list[str]:
    """The items of a section: each bullet or numbered step, and each paragraph outside a list."""
    items, current = [], []
    for line in text.splitlines()[2:]:
        starts_item = re.match(r"(- |\d+\. )", line)
        if (starts_item or not line.strip()) and current:
            items.append(" ".join(current))
            current = []
        if line.strip():
            current.append(line.strip())
    if current:
        items.append(" ".join(current))
    return [item for item in items if not item.startswith("#")]


@pytest.mark.parametrize(
    ("doc", "title"), [("docs/protocol.md", "What the daemon promises"), ("docs/operations.md", "Stop and drain")]
)
def test_every_promise_names_the_test_that_holds_it(doc: str, title: str) -> None:
    unheld = [item for item in promises(section(REPO_ROOT / doc, title)) if not TEST_REFERENCE.search(item)]
    assert not unheld, f"{doc}, {title!r}: promises that name no test (tests/FILE.py::test_name):\n" + "\n".join(unheld)


def test_every_test_the_docs_name_exists() -> None:
    problems = []
    for doc in DOCS:
        for path, name in TEST_REFERENCE.findall(doc.read_text()):
            file = REPO_ROOT / path
            if not file.is_file():
                problems.append(f"{doc.name}: no file {path}")
                continue
            defined = {
                node.name
                for node in ast.walk(ast.parse(file.read_text()))
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            }
            if name not in defined:
                problems.append(f"{doc.name}: {path} has no {name}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("unit", ["edged.service", "edged@.service"])
def test_the_units_stop_timeout_outlasts_the_drain_and_the_stop_grace(unit: str) -> None:
    """operations.md, "Stop and drain": systemd waits longer than the daemon may take to
    stop, with the built-in settings and with the example configuration's."""
    text = (REPO_ROOT / "systemd" / unit).read_text()
    timeout_s = int(re.search(r"^TimeoutStopSec=(\d+)s$", text, flags=re.M).group(1))
    for config in (load_config(None), load_config(REPO_ROOT / "systemd" / "edged.toml")):
        assert timeout_s * 1000 > config.drain_timeout_ms + config.stop_grace_ms
