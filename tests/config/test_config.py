"""Configuration: built-in defaults, and a refusal naming the key for every bad value.

The daemon's config promise is that a typo never silently leaves a default in force,
so each refusal is checked for the key it names, the way a person would search for it.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from pathlib import Path

import pytest
from support import REPO_ROOT

from edged.config import (
    Config,
    ConfigError,
    default_classes,
    default_endpoint,
    default_repository,
    load_config,
    parse_config,
)
from edged.config.classes import ClassConfig
from edged.config.keys import SERVER
from edged.wire.codec import Limits


def parse(text: str, base_dir: Path = Path("/srv")) -> Config:
    return parse_config(tomllib.loads(text), base_dir=base_dir)


def test_no_settings_give_the_documented_defaults() -> None:
    config = parse("")
    assert config.endpoints == (default_endpoint(),)
    assert config.model_repository == default_repository()
    assert config.default_class == "standard"
    assert config.backend == "onnxruntime"
    assert config.drain_timeout_ms == 5000
    assert config.log_level == "info"
    assert config.models == ()
    assert config.limits == Limits()
    assert config.max_message_bytes == 64 * 1024 * 1024
    assert config.classes == default_classes()


def test_default_classes_put_realtime_first_with_the_tightest_deadline() -> None:
    classes = parse("").classes
    assert [c.name for c in classes] == ["realtime", "standard", "bulk"]
    assert [c.order for c in classes] == [0, 1, 2]
    deadlines = [c.deadline_ms for c in classes]
    assert deadlines == sorted(deadlines) and deadlines[0] < deadlines[-1]


def test_the_demo_repository_is_found_beside_the_package() -> None:
    assert (default_repository() / "mlp-light" / "manifest.json").is_file()


def test_every_setting_is_read() -> None:
    config = parse(
        """
        [server]
        endpoints = ["ipc:///run/edged/a.sock", "tcp://127.0.0.1:7000"]
        model_repository = "models"
        default_class = "fast"
        backend = "onnxruntime"
        drain_timeout_ms = 100
        log_level = "debug"
        models = ["mlp-light"]
        max_message_bytes = 1024

        [limits]
        max_header_bytes = 512
        max_tensors = 2
        max_tensor_elements = 1000

        [classes.fast]
        order = 0
        queue_capacity = 3
        deadline_ms = 2.5
        workers = 2
        max_batch = 4
        batch_wait_us = 10
        threads = 2
        threads_spin = false
        cpu_affinity = [0]
        nice = 5
        stream_priority = -2
        arena_cap_mb = 64
        """
    )
    assert config.endpoints == ("ipc:///run/edged/a.sock", "tcp://127.0.0.1:7000")
    assert config.model_repository == Path("/srv/models")
    assert config.default_class == "fast"
    assert (config.drain_timeout_ms, config.log_level, config.models) == (100, "debug", ("mlp-light",))
    assert config.max_message_bytes == 1024
    assert config.limits == Limits(max_header_bytes=512, max_tensors=2, max_tensor_elements=1000)
    (fast,) = config.classes
    assert (fast.name, fast.order, fast.queue_capacity, fast.deadline_ms) == ("fast", 0, 3, 2.5)
    assert (fast.workers, fast.max_batch, fast.batch_wait_us, fast.threads, fast.threads_spin) == (2, 4, 10, 2, False)
    assert (fast.cpu_affinity, fast.nice, fast.stream_priority, fast.arena_cap_mb) == ((0,), 5, -2, 64)


def test_a_file_that_names_classes_defines_the_full_set() -> None:
    config = parse('[server]\ndefault_class = "realtime"\n[classes.realtime]\ndeadline_ms = 5\n')
    (realtime,) = config.classes
    default_realtime = default_classes()[0]
    # Settings not named keep that class's built-in values.
    assert realtime.deadline_ms == 5.0
    assert realtime.queue_capacity == default_realtime.queue_capacity
    assert realtime.max_batch == default_realtime.max_batch


def test_classes_are_served_in_order_and_new_ones_take_their_position() -> None:
    config = parse('[server]\ndefault_class = "b"\n[classes.a]\norder = 5\n[classes.b]\n')
    assert [(c.name, c.order) for c in config.classes] == [("b", 1), ("a", 5)]


def test_a_class_set_without_the_default_class_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"server\.default_class"):
        parse("[classes.gold]\n")


def klass(name: str, line: str) -> str:
    """A one-class file whose only fault is `line`: that class is also the default."""
    return f'[server]\ndefault_class = "{name}"\n[classes.{name}]\n{line}\n'


# (TOML, the key the message must name)
INVALID = {
    "endpoints empty": ("[server]\nendpoints = []", "server.endpoints"),
    "endpoints a string": ('[server]\nendpoints = "ipc:///tmp/a"', "server.endpoints"),
    "endpoint scheme": ('[server]\nendpoints = ["http://127.0.0.1:80"]', "server.endpoints"),
    "endpoint not a string": ("[server]\nendpoints = [5]", "server.endpoints"),
    "ipc path too long": (f'[server]\nendpoints = ["ipc:///tmp/{"a" * 110}"]', "server.endpoints"),
    # 107 bytes, but its memfd socket beside it (a.shm.sock) is longer: it failed to bind at start.
    "ipc path too long with its memfd socket": (
        f'[server]\nendpoints = ["ipc:///tmp/{"a" * 97}.sock"]',
        "server.endpoints",
    ),
    # 107 bytes with its memfd socket, but NAME-standard.sock beside it, the default class's, is longer.
    "ipc path too long with a class's socket": (
        f'[server]\nendpoints = ["ipc:///tmp/{"a" * 89}.sock"]',
        "server.endpoints",
    ),
    # A long suffix: the memfd socket's path is shorter than the endpoint's own (111 bytes).
    "ipc path too long itself": (f'[server]\nendpoints = ["ipc:///tmp/s.{"a" * 104}"]', "server.endpoints"),
    # 60 characters, 110 bytes.
    "ipc path too long in bytes": (f'[server]\nendpoints = ["ipc:///tmp/{"é" * 50}.sock"]', "server.endpoints"),
    # A NUL no path can hold: a traceback at start-up (embedded null byte), and in `config --check`.
    "endpoint with a NUL": ('[server]\nendpoints = ["ipc:///tmp/a\\u0000b.sock"]', "server.endpoints"),
    "repository with a NUL": ('[server]\nmodel_repository = "/tmp/\\u0000x"', "server.model_repository"),
    # Past the largest gid: an OverflowError at start-up.
    "ipc group past the largest gid": ("[server]\nipc_group = 18446744073709551621", "server.ipc_group"),
    "repository not a string": ("[server]\nmodel_repository = 5", "server.model_repository"),
    "default class unknown": ('[server]\ndefault_class = "gold"', "server.default_class"),
    "backend not a string": ("[server]\nbackend = 1", "server.backend"),
    "on_model_failure unknown": ('[server]\non_model_failure = "ignore"', "server.on_model_failure"),
    "drain timeout zero": ("[server]\ndrain_timeout_ms = 0", "server.drain_timeout_ms"),
    "drain timeout string": ('[server]\ndrain_timeout_ms = "5"', "server.drain_timeout_ms"),
    "drain timeout bool": ("[server]\ndrain_timeout_ms = true", "server.drain_timeout_ms"),
    "log level": ('[server]\nlog_level = "loud"', "server.log_level"),
    "models a string": ('[server]\nmodels = "mlp-light"', "server.models"),
    "models not strings": ("[server]\nmodels = [1]", "server.models"),
    "max message bytes": ("[server]\nmax_message_bytes = -1", "server.max_message_bytes"),
    "server not a table": ("server = 5", "server"),
    "limits not a table": ("limits = 5", "limits"),
    "max header bytes": ("[limits]\nmax_header_bytes = 0", "limits.max_header_bytes"),
    # Under what a header naming a model and an input takes: every request refused.
    "max header bytes tiny": ("[limits]\nmax_header_bytes = 1", "limits.max_header_bytes"),
    # A header between the two would drop its connection, unanswered.
    "max message bytes under the header's": (
        "[server]\nmax_message_bytes = 1000\n[limits]\nmax_header_bytes = 4096",
        "server.max_message_bytes = 1000 is under limits.max_header_bytes = 4096",
    ),
    "max tensors float": ("[limits]\nmax_tensors = 1.5", "limits.max_tensors"),
    "max tensor elements": ("[limits]\nmax_tensor_elements = -3", "limits.max_tensor_elements"),
    "classes not a table": ("classes = 5", "classes"),
    "class not a table": ('[server]\ndefault_class = "realtime"\n[classes]\nrealtime = 5', "classes.realtime"),
    "order negative": (klass("realtime", "order = -1"), "classes.realtime.order"),
    "orders clash": (
        '[server]\ndefault_class = "a"\n[classes.a]\norder = 1\n[classes.b]\norder = 1',
        "classes.*.order",
    ),
    "queue capacity zero": (klass("realtime", "queue_capacity = 0"), "classes.realtime.queue_capacity"),
    "workers zero": (klass("realtime", "workers = 0"), "classes.realtime.workers"),
    "max batch zero": (klass("realtime", "max_batch = 0"), "classes.realtime.max_batch"),
    # Accepted, they failed start-up with a message naming no key (a review's fuzz).
    "max batch of terabytes": (klass("realtime", "max_batch = 1099511627776"), "classes.realtime.max_batch"),
    "workers by the hundred thousand": (klass("realtime", "workers = 100000"), "classes.realtime.workers"),
    "threads past an int": (klass("realtime", "threads = 3000000000"), "classes.realtime.threads"),
    "batch wait negative": (klass("realtime", "batch_wait_us = -1"), "classes.realtime.batch_wait_us"),
    # A worker waits that long with a job in hand: past the class's deadline, its lane hung (2**40 us).
    "batch wait past the deadline": (
        klass("bulk", "deadline_ms = 100.0\nbatch_wait_us = 100000"),
        "classes.bulk.batch_wait_us",
    ),
    "threads negative": (klass("realtime", "threads = -1"), "classes.realtime.threads"),
    "arena cap negative": (klass("realtime", "arena_cap_mb = -1"), "classes.realtime.arena_cap_mb"),
    # Renamed: it caps an arena that grows lazily and reserves nothing.
    "reserved memory, the old name": (klass("realtime", "reserved_memory_mb = 64"), "classes.realtime.arena_cap_mb"),
    "gpu headroom negative": ("[server]\ngpu_headroom_mb = -1", "server.gpu_headroom_mb"),
    "nice too high": (klass("bulk", "nice = 20"), "classes.bulk.nice"),
    "nice too low": (klass("bulk", "nice = -21"), "classes.bulk.nice"),
    "stream priority": (klass("realtime", "stream_priority = 11"), "classes.realtime.stream_priority"),
    "deadline zero": (klass("realtime", "deadline_ms = 0"), "classes.realtime.deadline_ms"),
    "deadline negative": (klass("realtime", "deadline_ms = -1.0"), "classes.realtime.deadline_ms"),
    "deadline bool": (klass("realtime", "deadline_ms = true"), "classes.realtime.deadline_ms"),
    "deadline string": (klass("realtime", 'deadline_ms = "fast"'), "classes.realtime.deadline_ms"),
    "deadline nan": (klass("realtime", "deadline_ms = nan"), "classes.realtime.deadline_ms"),
    # An infinite default budget cannot become the integer nanoseconds a request's deadline is kept in.
    "deadline infinite": (klass("realtime", "deadline_ms = inf"), "classes.realtime.deadline_ms"),
    "affinity not a list": (klass("realtime", 'cpu_affinity = "0"'), "classes.realtime.cpu_affinity"),
    "affinity past the last core": (
        klass("realtime", f"cpu_affinity = [{os.cpu_count() or 1}]"),
        "classes.realtime.cpu_affinity",
    ),
    "affinity negative": (klass("realtime", "cpu_affinity = [-1]"), "classes.realtime.cpu_affinity"),
    "yields a string": (klass("bulk", 'yields = "yes"'), "classes.bulk.yields"),
    "threads_spin a string": (klass("bulk", 'threads_spin = "no"'), "classes.bulk.threads_spin"),
    "preemptible removed": (klass("bulk", "preemptible = true"), "classes.bulk.preemptible was removed"),
    "cap negative": (klass("bulk", "max_call_ms = -1"), "classes.bulk.max_call_ms"),
    "cap a string": (klass("bulk", 'max_call_ms = "5"'), "classes.bulk.max_call_ms"),
    "spin removed": (klass("realtime", "spin_us = 0"), "classes.realtime.spin_us was removed"),
    "stand-in removed": (klass("realtime", "stand_in = false"), "classes.realtime.stand_in was removed"),
    "inline a float": (klass("realtime", "inline_max_us = 2.5"), "classes.realtime.inline_max_us"),
    "sm count negative": (klass("bulk", "sm_count = -8"), "classes.bulk.sm_count"),
}


def test_a_yielding_class_is_capped_at_a_quarter_of_the_top_deadline_unless_set() -> None:
    text = "[classes.realtime]\ndeadline_ms = 40.0\n[classes.standard]\nyields = true\n[classes.bulk]\n"
    capped = {c.name: c.max_call_ms for c in parse(text).classes}
    assert capped == {"realtime": 0.0, "standard": 10.0, "bulk": 10.0}
    explicit = {c.name: c.max_call_ms for c in parse(text + "max_call_ms = 0\n").classes}
    assert explicit["bulk"] == 0.0  # no cap, as set


@pytest.mark.parametrize("case", list(INVALID))
def test_invalid_setting_is_refused_naming_its_key(case: str) -> None:
    text, key = INVALID[case]
    with pytest.raises(ConfigError) as caught:
        parse(text)
    assert key in str(caught.value)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[sever]\n", "sever"),
        ('[server]\nendpoint = ["ipc:///tmp/a"]', "server.endpoint"),
        ("[limits]\nmax_header = 1", "limits.max_header"),
        (klass("realtime", "deadline = 5"), "classes.realtime.deadline"),
        ("queue_capacity = 5", "queue_capacity"),
    ],
)
def test_unknown_key_is_refused_by_name(text: str, key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(text)
    assert str(caught.value).startswith(f"unknown key {key}:")


def test_command_line_endpoints_are_checked_too() -> None:
    config = parse("")
    assert config.with_endpoints(["tcp://127.0.0.1:1"]).endpoints == ("tcp://127.0.0.1:1",)
    with pytest.raises(ConfigError, match="--endpoint"):
        config.with_endpoints(["udp://127.0.0.1:1"])


def test_load_config_without_a_file_gives_the_defaults() -> None:
    assert load_config(None) == parse_config({}, base_dir=Path.cwd())


def test_load_config_resolves_the_repository_beside_the_file(tmp_path: Path) -> None:
    path = tmp_path / "conf" / "edged.toml"
    path.parent.mkdir()
    path.write_text('[server]\nmodel_repository = "../models"\n')
    assert load_config(path).model_repository == tmp_path / "models"


def test_load_config_names_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "absent.toml")


def test_load_config_takes_a_file_that_starts_with_a_byte_order_mark(tmp_path: Path) -> None:
    """As some editors write UTF-8: refused before as not valid TOML at line 1, column 1."""
    path = tmp_path / "edged.toml"
    path.write_bytes('\ufeff[server]\nlog_level = "debug"\n'.encode())
    assert load_config(path).log_level == "debug"


def test_an_ipc_mode_refused_is_shown_in_octal() -> None:
    """As it is written: 0o1777 was shown as 1023."""
    with pytest.raises(ConfigError, match=r"server\.ipc_mode = '0o1777' is not valid"):
        parse("[server]\nipc_mode = 0o1777")


def test_load_config_names_invalid_toml(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[server\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(path)


def test_default_endpoint_prefers_systemds_runtime_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNTIME_DIRECTORY", "/run/edged:/run/other")
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1000")
    assert default_endpoint() == "ipc:///run/edged/edged.sock"
    monkeypatch.delenv("RUNTIME_DIRECTORY")
    assert default_endpoint() == "ipc:///run/user/1000/edged/edged.sock"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert default_endpoint() == f"ipc:///tmp/edged-{os.getuid()}/edged.sock"


def test_the_example_config_names_every_key_at_its_default() -> None:
    """systemd/edged.toml promises every key at its built-in default (but the two paths):
    a key added to the daemon and not to the example, or a default that drifted, fails here."""
    example = REPO_ROOT / "systemd" / "edged.toml"
    loaded = load_config(example)
    defaults = parse_config({}, example.parent)
    assert loaded.classes == defaults.classes
    assert loaded.limits == defaults.limits
    assert dataclasses.replace(loaded, endpoints=defaults.endpoints, model_repository=defaults.model_repository) == (
        defaults
    )
    raw = tomllib.loads(example.read_text())
    # inline_max_us's default follows the deadlines, threads_spin's the cores: the tables
    # explain them in comments, and written out they would not follow a change beside them.
    # tcp_port's default is no value, which TOML cannot write.
    keys = {f.name for f in dataclasses.fields(ClassConfig)} - {"name", "inline_max_us", "threads_spin", "tcp_port"}
    for name, table in raw["classes"].items():
        assert set(table) == keys, f"classes.{name} lacks {sorted(keys - set(table))}, or has more"


def test_on_six_cores_or_more_realtime_and_the_loop_get_cores_of_their_own() -> None:
    from edged.config.classes import resolve_cores

    defaults = parse("").classes
    assert all(c.cpu_affinity == () for c in resolve_cores(defaults, [0, 1, 2, 3, 4]))  # too few to split
    split = {c.name: c.cpu_affinity for c in resolve_cores(defaults, list(range(16)))}
    assert split == {"realtime": (0, 1, 2, 3), "standard": tuple(range(4, 16)), "bulk": tuple(range(4, 16))}
    assert resolve_cores(defaults, list(range(6)))[0].cpu_affinity == (0, 1)
    named = parse(klass("realtime", "cpu_affinity = [0]")).classes
    assert resolve_cores(named, list(range(16))) == named  # a class that names its cores takes over


def test_a_pool_spins_by_default_only_on_cores_of_its_own() -> None:
    from edged.config.classes import resolve_spin

    def spins(*affinities: tuple[int, ...]) -> list[bool | None]:
        names = ("realtime", "standard", "bulk")
        classes = [
            ClassConfig(n, order=i, threads=2, cpu_affinity=a) for i, (n, a) in enumerate(zip(names, affinities))
        ]
        return [c.threads_spin for c in resolve_spin(tuple(classes))]

    assert spins((), (), ()) == [False, False, False]  # every lane runs anywhere
    assert spins((0, 1), (2, 3), ()) == [False, False, False]  # bulk runs anywhere: on theirs too
    assert spins((0, 1), (2, 3), (2, 3)) == [True, False, False]  # standard and bulk share theirs
    assert spins((0, 1), (2, 3), (4,)) == [True, True, False]  # one core for two threads
    # Every default class may run on any core of this box, or bulk shares with standard.
    three = "[classes.realtime]\n[classes.standard]\n[classes.bulk]\nthreads = 2\n"
    assert parse(three).classes[2].threads_spin is False
    assert parse(three + "threads_spin = true\n").classes[2].threads_spin is True


def test_the_inline_cap_is_as_set_or_left_to_the_daemon() -> None:
    assert {c.inline_max_us for c in parse("").classes} == {None}  # derived as it serves (tests/serve/lanes)
    assert parse(klass("realtime", "inline_max_us = 70")).classes[0].inline_max_us == 70
    assert parse(klass("realtime", "inline_max_us = 0")).classes[0].inline_max_us == 0


@pytest.mark.parametrize(
    ("text", "refusal"),
    [
        (
            "[classes.realtime]\ntcp_port = 6001\n[classes.bulk]\ntcp_port = 6001\n",
            "classes.*.tcp_port = [6001, 6001] is not valid: set it to a distinct port",
        ),
        (
            '[server]\nclass_sockets = false\ndefault_class = "realtime"\n[classes.realtime]\ntcp_port = 6001\n',
            "classes.realtime.tcp_port asks for a socket of the class, and server.class_sockets = false",
        ),
    ],
    ids=["a port twice", "class sockets off"],
)
def test_a_class_tcp_port_is_refused_where_it_cannot_be_bound(text: str, refusal: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(refusal)):
        parse(text)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[classes.bulk]\nbatch_wait_us = 9223372036854775807\n", r"classes\.bulk\.batch_wait_us"),
        ("[server]\ndrain_timeout_ms = 9223372036854775807\n", r"server\.drain_timeout_ms"),
        ("[server]\nmax_message_bytes = 99999999999999999999999\n", r"server\.max_message_bytes"),
    ],
)
def test_an_integer_past_any_need_is_refused_at_start_up_naming_its_key(text: str, key: str) -> None:
    """TOML takes integers past 64 bits: accepted, batch_wait_us at 2**63 killed bulk's worker at
    its first request, and the others failed at a stop or a bind."""
    with pytest.raises(ConfigError, match=key + r" = \d+ is not valid: set it to at most 1,099,511,627,776"):
        parse(text)


@pytest.mark.parametrize(
    ("text", "phrase"),
    [
        ('[server]\nendpoints = ["tcp://127.0.0.1:99999"]\n', "names no port from 1 to 65535"),
        ('[server]\nendpoints = ["tcp://127.0.0.1:0"]\n', "names no port from 1 to 65535"),
        ('[server]\nendpoints = ["tcp://127.0.0.1"]\n', "names no port from 1 to 65535"),
        ('[server]\ndefault_class = "a/b"\n[classes."a/b"]\n', "class names of letters, digits"),
        ('[server]\ndefault_class = ""\n[classes.""]\n', "class names of letters, digits"),
        ("[classes.realtime]\ncpu_affinity = [true]\n", r"classes\.realtime\.cpu_affinity"),
    ],
)
def test_what_would_bind_elsewhere_or_name_no_file_is_refused(text: str, phrase: str) -> None:
    """Accepted before: port 99999 bound another port while the log named 99999, port 0 one no
    client is told, a class "a/b" or "" no socket file can carry, a core given as true."""
    with pytest.raises(ConfigError, match=phrase):
        parse(text)


def test_a_backend_no_one_registered_is_refused_by_the_check_naming_the_choices() -> None:
    """Before: `config --check` passed it, and serve said no model had such a variant."""
    with pytest.raises(
        ConfigError, match=r"server\.backend = 'onnxrutime' is not valid: set it to one of \"onnxruntime\""
    ):
        parse('[server]\nbackend = "onnxrutime"\n')


def test_the_backend_names_the_reference_gives_are_the_registered_ones() -> None:
    from edged.backends import BACKENDS

    assert re.findall(r'"([\w-]+)"', SERVER["backend"].valid) == list(BACKENDS)
