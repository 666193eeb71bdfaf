"""README.md and docs/*.md as the docs tests read them (tests/docs/): their fenced code
blocks, their prose, and the commands they show."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from support import REPO_ROOT

DOCS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
SHELLS = {"sh", "bash", "shell", "console"}
# The endpoint the docs' sessions and clients use; the test's daemon's replaces it.
DOCS_ENDPOINT = "ipc:///tmp/docs.sock"
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


def flagged(words: list[str]) -> set[str]:
    return {w.split("=")[0] for w in words if re.fullmatch(r"--?[a-z][\w-]*(=.*)?", w)}
