"""The docs' links and promises: every relative link in README.md and docs/*.md resolves
(the file exists, and an #anchor matches a heading); every promise in protocol.md's "What
the daemon promises" and operations.md's "Stop and drain" names the test that holds it,
and every `tests/FILE.py::test_name` the docs name exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from support import REPO_ROOT
from support.docs import DOCS, TEST_REFERENCE, prose

from edged.config.file import load_config


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
