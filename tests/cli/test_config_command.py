"""`edged config`: a file checked as start-up checks it, without starting, and the
reference of every key, as a user runs them (a child process, its exit code, its output)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from support import REPO_ROOT, run_edged

from edged.config.keys import SECTIONS


def edged(*args: str, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess[str]:
    return run_edged(*args, cwd=cwd)


def test_check_of_the_example_config_says_ok() -> None:
    done = edged("config", "--check", "systemd/edged.toml")
    assert (done.returncode, done.stdout, done.stderr) == (0, "systemd/edged.toml: ok\n", "")


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (
            '[server]\ndefault_class = "bulk"\n[classes.bulk]\nnice = 20\n',
            "classes.bulk.nice = 20 is not valid: set it to an integer from -20 to 19",
        ),
        ("[server]\ndrain_timeout = 5\n", "unknown key server.drain_timeout: known keys here are "),
        ("[server\n", "is not valid TOML"),
    ],
)
def test_check_of_a_bad_file_exits_2_with_the_error_start_up_gives(text: str, error: str, short_tmp: Path) -> None:
    config = short_tmp / "bad.toml"
    config.write_text(text)
    checked = edged("config", "--check", str(config))
    assert checked.returncode == 2 and checked.stdout == ""
    assert checked.stderr.startswith("edged: configuration error: ") and error in checked.stderr, checked.stderr
    started = edged("serve", "--config", str(config), "--endpoint", f"ipc://{short_tmp}/d.sock")
    assert (started.returncode, started.stderr) == (2, checked.stderr)


def test_check_of_a_missing_file_names_it() -> None:
    done = edged("config", "--check", "/nonexistent/edged.toml")
    assert done.returncode == 2
    assert "config file /nonexistent/edged.toml does not exist" in done.stderr


def test_explain_prints_every_key_with_its_default_and_valid_values() -> None:
    done = edged("config", "--explain")
    assert done.returncode == 0, done.stderr
    for section in SECTIONS:
        assert f"[{section.name}]\n" in done.stdout
        for key in section.keys:
            # "name = value  (type; valid values)", or, a default in words, "name  (...)" and "default: ..."
            shown = f"\n  {key.name}  (" + f"{key.type}; {key.valid}"[:20] if key.default else f"\n  {key.name} = "
            assert shown in done.stdout, f"{section.name}.{key.name}"


def test_explain_of_one_key_prints_that_key() -> None:
    done = edged("config", "--explain", "classes.bulk.nice")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:2] == ["[classes.NAME]", "  nice = 0  (integer; an integer from -20 to 19)"]
    assert "niceness" in lines[2]
    assert len(lines) <= 5


def test_explain_of_an_unknown_key_exits_2_naming_the_tables() -> None:
    done = edged("config", "--explain", "server.nope")
    assert done.returncode == 2
    assert "unknown key server.nope" in done.stderr and "classes.NAME" in done.stderr
