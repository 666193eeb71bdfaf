"""The configuration reference: one definition per key (edged.config.keys), from which the
refusals, docs/configuration.md, `edged config --explain` and the example file's keys all
follow. A key added, renamed or re-documented in one place and not the others fails here."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from support import REPO_ROOT

from edged.config import Config, ConfigError, MetricsConfig, SecurityConfig, parse_config
from edged.config.classes import ClassConfig
from edged.config.keys import SECTIONS
from edged.config.reference import REGENERATE, markdown
from edged.config.settings import Key
from edged.config.shm import ShmConfig
from edged.wire.codec import Limits

DOC = REPO_ROOT / "docs" / "configuration.md"
EXAMPLE = REPO_ROOT / "systemd" / "edged.toml"
TABLES = {"limits", "classes", "security", "metrics", "shm"}  # Config's fields that are tables of their own
HOLDERS = {
    "server": {f.name for f in dataclasses.fields(Config)} - TABLES,
    "limits": {f.name for f in dataclasses.fields(Limits)},
    "security": {f.name for f in dataclasses.fields(SecurityConfig)},
    "metrics": {f.name for f in dataclasses.fields(MetricsConfig)},
    "shm": {f.name for f in dataclasses.fields(ShmConfig)},
    "classes.NAME": {f.name for f in dataclasses.fields(ClassConfig)} - {"name"},
}


def test_docs_configuration_is_the_reference_generated_now() -> None:
    assert DOC.read_text() == markdown(), f"docs/configuration.md is stale: regenerate it with `{REGENERATE}`"


def test_every_setting_has_exactly_one_key_definition() -> None:
    assert {section.name: section.names for section in SECTIONS} == HOLDERS
    for section in SECTIONS:
        assert len(section.keys) == len(section.names), f"a key of [{section.name}] is defined twice"
        for key in section.keys:
            assert key.help.strip() and key.type and key.valid, f"{section.name}.{key.name} lacks its help"


def where(section: str, key: str) -> tuple[str, str]:
    """A TOML line setting `key` to a value wrong for every type (an inline table), and the
    name its refusal must give: a one-class file for a class's keys."""
    if section == "classes.NAME":
        return f'[server]\ndefault_class = "c"\n[classes.c]\n{key} = {{ wrong = true }}\n', f"classes.c.{key}"
    return f"[{section}]\n{key} = {{ wrong = true }}\n", f"{section}.{key}"


# Their fix names what this machine or this file allows, beyond the Key's words.
FIX_FROM_THE_FILE = {"server.default_class", "classes.NAME.cpu_affinity"}


@pytest.mark.parametrize(
    ("section", "key"),
    [(section.name, key) for section in SECTIONS for key in section.keys],
    ids=[f"{section.name}.{key.name}" for section in SECTIONS for key in section.keys],
)
def test_each_refusal_gives_the_fix_the_reference_gives(section: str, key: Key, tmp_path: Path) -> None:
    text, name = where(section, key.name)
    with pytest.raises(ConfigError) as caught:
        parse_config(tomllib.loads(text), tmp_path)
    message = str(caught.value)
    assert message.startswith(f"{name} = "), message
    if f"{section}.{key.name}" not in FIX_FROM_THE_FILE:
        assert message.endswith(f"set it to {key.valid}"), message


def commented(text: str, key: str) -> bool:
    return re.search(rf"^#\s*{re.escape(key)}\b", text, re.M) is not None


def test_the_example_config_names_every_key() -> None:
    """systemd/edged.toml shows every key, set or (where its default is no value) in a comment."""
    text = EXAMPLE.read_text()
    raw = tomllib.loads(text)
    # Each [table]'s text, so that a key commented out is found in its own table.
    parts = re.split(r"^\[([\w.]+)\]\s*$", text, flags=re.M)
    texts = dict(zip(parts[1::2], parts[2::2]))
    missing = []
    for section in SECTIONS:
        if section.name == "classes.NAME":
            tables = {f"classes.{name}": table for name, table in raw["classes"].items()}
        else:
            tables = {section.name: raw.get(section.name, {})}
        for table_name, table in tables.items():
            missing += [
                f"{table_name}.{key}"
                for key in sorted(section.names)
                if key not in table and not commented(texts.get(table_name, ""), key)
            ]
    assert not missing, f"systemd/edged.toml does not name {missing}"


def test_the_reference_is_the_same_wherever_it_is_generated(tmp_path: Path) -> None:
    """Nothing of the machine or the environment leaks in (the default endpoint, the
    repository, the cores a class gets): `edged config --markdown` elsewhere gives the file."""
    env = {**os.environ, "RUNTIME_DIRECTORY": "/run/elsewhere", "XDG_RUNTIME_DIR": "/run/user/4242"}
    done = subprocess.run(
        ["taskset", "-c", "0", sys.executable, "-m", "edged", "config", "--markdown"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))},
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == DOC.read_text()
