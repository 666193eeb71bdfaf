"""The configuration reference, written from the keys' own definitions (edged.config.keys)
and the dataclasses' defaults: docs/configuration.md (`edged config --markdown`) and the
terminal's `edged config --explain`. Nothing here depends on the machine or the
environment, so the file is the same wherever it is generated."""

from __future__ import annotations

import json
import textwrap
from dataclasses import fields
from pathlib import Path
from typing import Any

from edged.config.classes import REMOVED, ClassConfig, built_in
from edged.config.file import Config, MetricsConfig, SecurityConfig
from edged.config.keys import SECTIONS
from edged.config.settings import ConfigError, Key, Section
from edged.config.shm import ShmConfig
from edged.wire.codec import Limits

REGENERATE = "edged config --markdown > docs/configuration.md"

# What each table's keys default to: the dataclass that holds them, at its defaults
# (a class of any name other than the built-in ones starts from ClassConfig's).
DEFAULTS: dict[str, Any] = {
    "server": Config(endpoints=(), model_repository=Path()),
    "limits": Limits(),
    "security": SecurityConfig(),
    "metrics": MetricsConfig(),
    "shm": ShmConfig(),
    "classes.NAME": ClassConfig("NAME", order=0),
}

INTRO = """\
One TOML file, given with `edged serve --config FILE` (and re-read on SIGHUP). Every key
is optional; an unknown key, or a value of the wrong type or range, stops start-up with a
message naming the key and the fix; an integer whose key names no upper bound is at most
2**40 (1,099,511,627,776). `edged config --check FILE` checks a file the same
way without starting (the file alone: the model repository and its models are checked at
start). A commented example with every key at its default is
`systemd/edged.toml`; `edged config --explain [KEY]` prints this reference in a terminal."""


def toml_value(value: Any) -> str:
    """A value as it would be written in the file."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, Path)):
        return json.dumps(str(value))
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return repr(value)


def _in_words(value: Any) -> str:
    """A size in bytes that is a whole number of MiB or GiB, said so."""
    if not isinstance(value, int) or value < 1 << 20 or value % (1 << 20):
        return ""
    return f" ({value >> 30} GiB)" if value % (1 << 30) == 0 else f" ({value >> 20} MiB)"


def default_text(section: Section, key: Key, code: str = "") -> str:
    """The key's default: its value as TOML (between `code` marks), or the Key's words."""
    if key.default is not None:
        return key.default
    value = getattr(DEFAULTS[section.name], key.name)
    if value is None:
        raise ValueError(f"{section.name}.{key.name} defaults to None: give its Key a default in words")
    words = _in_words(value) if key.name.endswith("bytes") else ""
    return code + toml_value(value) + code + words


def built_in_classes() -> tuple[list[str], list[list[str]]]:
    """The keys in which the built-in classes differ from the generic defaults, and their values."""
    generic = DEFAULTS["classes.NAME"]
    classes = built_in()
    names = [f.name for f in fields(ClassConfig) if f.name not in ("name", "order", "cpu_affinity")]
    differ = ["order", *(n for n in names if any(getattr(c, n) != getattr(generic, n) for c in classes))]
    shown = [[getattr(c, n) for n in differ] for c in classes]
    return differ, [
        [c.name, *("derived" if v is None else toml_value(v) for v in row)] for c, row in zip(classes, shown)
    ]


def _removed() -> str:
    return (
        "Keys of earlier versions, refused by name with what replaced them: "
        + "; ".join(f"`{key}` ({why})" for key, why in REMOVED.items())
        + "."
    )


def markdown() -> str:
    """docs/configuration.md: every table, and each key's type, default, valid values and meaning."""
    out = [
        "# Configuration reference",
        "",
        f"<!-- Generated from edged/config/keys.py and class_keys.py: edit the keys there, then `{REGENERATE}`. -->",
        "",
        INTRO.replace("\n", " "),
    ]
    for section in SECTIONS:
        out += ["", f"## `[{section.name}]`", ""]
        if section.intro:
            out += [section.intro, ""]
        out += ["| key | type | default | valid values | meaning |", "|---|---|---|---|---|"]
        for key in section.keys:
            cells = [f"`{key.name}`", key.type, default_text(section, key, "`"), key.valid, key.help]
            out.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
        if section.notes:
            out += ["", section.notes]
        if section.name == "classes.NAME":
            differ, rows = built_in_classes()
            out += ["", "The built-in classes differ from these defaults in these keys:", ""]
            out += ["| class | " + " | ".join(differ) + " |", "|---" * (len(differ) + 1) + "|"]
            out += ["| " + " | ".join(f"`{cell}`" for cell in row) + " |" for row in rows]
            out += ["", _removed()]
    return "\n".join(out) + "\n"


def _selected(query: str | None) -> list[tuple[Section, list[Key]]]:
    if not query:
        return [(section, list(section.keys)) for section in SECTIONS]
    parts = query.split(".")
    for section in SECTIONS:
        if parts[0] != section.name.split(".")[0]:
            continue
        # A class's keys are the same whatever its name: classes.bulk.nice is classes.NAME.nice.
        rest = parts[2:] if section.name == "classes.NAME" else parts[1:]
        keys = [key for key in section.keys if not rest or rest == [key.name]]
        if keys:
            return [(section, keys)]
    known = ", ".join(section.name for section in SECTIONS)
    raise ConfigError(f"unknown key {query}: the tables are {known}, e.g. server.log_level or classes.bulk.nice")


def _wrap(text: str, indent: int, width: int, more: int = 0) -> list[str]:
    """Plain text (no Markdown code marks) wrapped at `width`, later lines `more` deeper."""
    return textwrap.wrap(
        text.replace("`", ""), width, initial_indent=" " * indent, subsequent_indent=" " * (indent + more)
    )


def explain(query: str | None = None, width: int = 88) -> str:
    """The reference for a terminal: every key (or those of one table or key), a header
    line with its type, default and valid values, then its meaning."""
    out: list[str] = []
    for section, keys in _selected(query):
        whole = len(keys) > 1
        out.append(f"[{section.name}]")
        if section.intro and whole:
            out += [*_wrap(section.intro, 2, width), ""]
        for key in keys:
            about = f"({key.type}; {key.valid})" if key.valid else f"({key.type})"
            # A value reads as TOML (name = value); a default in words gets a line of its own.
            if key.default:
                out += [*_wrap(f"{key.name}  {about}", 2, width, 4), *_wrap(f"default: {key.default}", 6, width)]
            else:
                out += _wrap(f"{key.name} = {default_text(section, key)}  {about}", 2, width, 4)
            out += _wrap(key.help, 6, width)
        if section.notes and whole:
            out += ["", *_wrap(section.notes, 2, width)]
        if section.name == "classes.NAME" and whole:
            differ, rows = built_in_classes()
            out += ["", "  The built-in classes differ from these defaults in:"]
            for name, *values in rows:
                out += _wrap(f"{name}: " + ", ".join(f"{k} = {v}" for k, v in zip(differ, values)), 4, width, 2)
            out += ["", *_wrap(_removed(), 2, width)]
        out.append("")
    return "\n".join(out)
