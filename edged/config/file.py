"""Every setting of the daemon: one TOML file, built-in defaults, checked at start-up.

An error names the key, what it holds, and the fix; an unknown key is an error too,
so a typo never silently leaves a default in force.
"""

from __future__ import annotations

import grp
import os
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any

from edged.config.classes import ClassConfig, default_classes, parse_classes
from edged.config.keys import LIMITS, METRICS, SECURITY, SERVER
from edged.config.settings import ConfigError, expect, no_unknown, read_bool, read_int, subtable
from edged.config.shm import ShmConfig, read_shm
from edged.wire.codec import Limits
from edged.wire.endpoints import class_endpoint, is_tcp, shm_socket_path
from edged.wire.messages import FRAME_OVERHEAD, MAX_MESSAGE_BYTES

PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # edged/, beside the repository in a checkout


@dataclass(frozen=True, slots=True)
class SecurityConfig:
    """CURVE on tcp endpoints: the server's key pair and the client keys it serves."""

    server_secret_key_file: Path | None = None  # a .key_secret file; the public key is derived
    allowed_clients_dir: Path | None = None  # the public keys (*.key) of the clients served
    allow_plain_tcp: bool = False  # serve tcp beyond loopback without CURVE

    @property
    def curve(self) -> bool:
        return self.server_secret_key_file is not None


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    prometheus_port: int = 0  # 0: no Prometheus endpoint
    prometheus_host: str = "127.0.0.1"


@dataclass(frozen=True, slots=True)
class Config:
    endpoints: tuple[str, ...]
    model_repository: Path
    default_class: str = "standard"
    backend: str = "onnxruntime"
    fallback: str | None = None  # backend "tensorrt": serve the ONNX on the CPU where no engine fits
    drain_timeout_ms: int = 5000
    stop_grace_ms: int = 20_000  # after the drain: how long calls inside the backend may still finish
    log_level: str = "info"
    models: tuple[str, ...] = ()  # names to serve; empty: every model in the repository
    on_model_failure: str = "stop"  # "stop": start-up fails; "skip": serve the other models
    # GPU backends: device memory that must stay free once every lane has loaded and warmed.
    gpu_headroom_mb: int = 256
    # The daemon's RSS that its weights and lanes must stay under (0: no limit; see edged.backends.host_memory).
    memory_limit_mb: int = 0
    # The longest a loop polls after its turn rather than sleep (edged.serve.transport.spin); 0: never.
    spin_max_us: int = 250
    limits: Limits = field(default_factory=Limits)
    max_message_bytes: int = MAX_MESSAGE_BYTES
    ipc_mode: int = 0o660  # of every ipc socket file: owner and group may connect
    ipc_group: int | None = None  # gid given to ipc socket files; None: the process's group
    # Beside each ipc endpoint, a socket per class, read before the shared one (docs/protocol.md)
    class_sockets: bool = True
    classes: tuple[ClassConfig, ...] = field(default_factory=default_classes)
    security: SecurityConfig = SecurityConfig()
    metrics: MetricsConfig = MetricsConfig()
    shm: ShmConfig = field(default_factory=ShmConfig)

    def class_named(self, name: str) -> ClassConfig:
        return next(c for c in self.classes if c.name == name)

    def with_endpoints(self, endpoints: list[str]) -> Config:
        _check_endpoints(endpoints, "--endpoint", [c.name for c in self.classes] if self.class_sockets else [])
        return replace(self, endpoints=tuple(endpoints))


def default_endpoint() -> str:
    """An ipc socket in the runtime directory: systemd's, the user's, or /tmp."""
    systemd_dir, user_dir = os.environ.get("RUNTIME_DIRECTORY"), os.environ.get("XDG_RUNTIME_DIR")
    if systemd_dir:
        folder = Path(systemd_dir.split(":")[0])
    elif user_dir:
        folder = Path(user_dir) / "edged"
    else:
        folder = Path(f"/tmp/edged-{os.getuid()}")
    return f"ipc://{folder / 'edged.sock'}"


def default_repository() -> Path:
    """The repository beside the package (a checkout), else ./engines."""
    beside = PACKAGE_ROOT.parent / "engines"
    return beside if beside.is_dir() else Path("engines").resolve()


def load_config(path: Path | None = None) -> Config:
    """Read and check the TOML file at `path`; no file gives the built-in defaults."""
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            raw = tomllib.loads(Path(path).read_text(encoding="utf-8-sig"))  # a byte-order mark, as editors write
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist: give an existing file to --config") from None
        except IsADirectoryError:
            raise ConfigError(f"config file {path} is a folder: give the TOML file to --config") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"config file {path} is not UTF-8, as TOML must be: {exc}") from None
        except OSError as exc:
            raise ConfigError(f"config file {path} cannot be read: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    return parse_config(raw, base_dir=Path(path).resolve().parent if path else Path.cwd())


def parse_config(raw: dict[str, Any], base_dir: Path) -> Config:
    """Build a Config from a parsed TOML document, checking every key."""
    no_unknown(raw, {"server", "limits", "classes", "security", "metrics", "shm"}, "")
    server = subtable(raw, "server")
    no_unknown(server, SERVER.names, "server.")
    endpoints = server.get("endpoints", [default_endpoint()])
    repository = server.get("model_repository")
    if repository is None:
        repo_path = default_repository()
    else:
        ok = isinstance(repository, str) and "\0" not in repository  # a NUL no path can hold
        expect(ok, "server.model_repository", repository, SERVER["model_repository"].valid)
        repo_path = (base_dir / repository).resolve()
    log_level = server.get("log_level", "info")
    expect(log_level in ("debug", "info", "warning", "error"), "server.log_level", log_level, SERVER["log_level"].valid)
    models = server.get("models", [])
    ok = isinstance(models, list) and all(isinstance(m, str) for m in models)
    expect(ok, "server.models", models, SERVER["models"].valid)
    backend = server.get("backend", "onnxruntime")
    from edged.backends import BACKENDS  # here: the backends' module reads the config's classes

    expect(isinstance(backend, str) and backend in BACKENDS, "server.backend", backend, SERVER["backend"].valid)
    fallback = server.get("fallback")
    ok = fallback is None or (fallback == "onnxruntime" and backend == "tensorrt")
    expect(ok, "server.fallback", fallback, SERVER["fallback"].valid)

    on_model_failure = server.get("on_model_failure", "stop")
    expect(
        on_model_failure in ("stop", "skip"),
        "server.on_model_failure",
        on_model_failure,
        SERVER["on_model_failure"].valid,
    )

    class_sockets = read_bool(server, SERVER["class_sockets"], True, "server.")
    classes = parse_classes(raw.get("classes", {}))
    default_class = server.get("default_class", "standard")
    names = [c.name for c in classes]
    expect(default_class in names, "server.default_class", default_class, f"one of the classes: {names}")
    _check_endpoints(endpoints, "server.endpoints", names if class_sockets else [])
    for c in classes:
        if c.tcp_port is not None and not class_sockets:
            raise ConfigError(
                f"classes.{c.name}.tcp_port asks for a socket of the class, and server.class_sockets = false: "
                "drop one of the two"
            )
    limits = _limits(subtable(raw, "limits"))
    max_message_bytes = read_int(server, SERVER["max_message_bytes"], MAX_MESSAGE_BYTES, "server.")
    least = limits.max_header_bytes + FRAME_OVERHEAD
    if max_message_bytes < least:
        # ZeroMQ would drop the connection of a header between the two, where the daemon refuses it in words.
        raise ConfigError(
            f"server.max_message_bytes = {max_message_bytes} is under limits.max_header_bytes = "
            f"{limits.max_header_bytes} and the {FRAME_OVERHEAD} bytes CURVE may add to a frame: raise it to "
            f"{least} or more"
        )
    return Config(
        endpoints=tuple(endpoints),
        model_repository=repo_path,
        default_class=default_class,
        backend=backend,
        fallback=fallback,
        drain_timeout_ms=read_int(server, SERVER["drain_timeout_ms"], 5000, "server."),
        stop_grace_ms=read_int(server, SERVER["stop_grace_ms"], 20_000, "server."),
        log_level=log_level,
        models=tuple(models),
        on_model_failure=on_model_failure,
        gpu_headroom_mb=read_int(server, SERVER["gpu_headroom_mb"], 256, "server."),
        memory_limit_mb=read_int(server, SERVER["memory_limit_mb"], 0, "server."),
        spin_max_us=read_int(server, SERVER["spin_max_us"], 250, "server."),
        limits=limits,
        max_message_bytes=max_message_bytes,
        ipc_mode=_ipc_mode(server.get("ipc_mode", 0o660)),
        ipc_group=_ipc_group(server.get("ipc_group")),
        class_sockets=class_sockets,
        classes=classes,
        security=_security(subtable(raw, "security"), base_dir),
        metrics=_metrics(subtable(raw, "metrics")),
        shm=read_shm(subtable(raw, "shm")),
    )


def _ipc_mode(value: Any) -> int:
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 0o777
    expect(ok, "server.ipc_mode", oct(value) if isinstance(value, int) else value, SERVER["ipc_mode"].valid)
    if not value & 0o200:
        # Its own user cannot connect: neither `edged` commands run as that user nor, after a
        # crash, the next start's check of the socket left behind (it refuses to start).
        raise ConfigError(
            f"server.ipc_mode = {value:#o} leaves the daemon's own user without write permission on its "
            "sockets: include 0o200 (0o660 by default)"
        )
    return value


def _ipc_group(value: Any) -> int | None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 2**32 - 2):
        return value
    expect(isinstance(value, str), "server.ipc_group", value, SERVER["ipc_group"].valid)
    try:
        return grp.getgrnam(value).gr_gid
    except KeyError:
        raise ConfigError(
            f"server.ipc_group = {value!r} is not a group on this machine: name an existing group"
        ) from None


def _security(table: dict[str, Any], base_dir: Path) -> SecurityConfig:
    no_unknown(table, SECURITY.names, "security.")
    key_file = _existing(table, "server_secret_key_file", base_dir, Path.is_file)
    clients_dir = _existing(table, "allowed_clients_dir", base_dir, Path.is_dir)
    # Encryption without a list of clients would serve anyone who has the server's public key.
    if (key_file is None) != (clients_dir is None):
        raise ConfigError(
            "security.server_secret_key_file and security.allowed_clients_dir go together: set both to use CURVE"
        )
    allow_plain = read_bool(table, SECURITY["allow_plain_tcp"], False, "security.")
    return SecurityConfig(key_file, clients_dir, allow_plain)


def _existing(table: dict[str, Any], key: str, base_dir: Path, exists: Callable[[Path], bool]) -> Path | None:
    value = table.get(key)
    if value is None:
        return None
    ok = isinstance(value, str) and exists(base_dir / value)
    expect(ok, "security." + key, value, SECURITY[key].valid)
    return (base_dir / value).resolve()


def _metrics(table: dict[str, Any]) -> MetricsConfig:
    no_unknown(table, METRICS.names, "metrics.")
    host = table.get("prometheus_host", "127.0.0.1")
    expect(isinstance(host, str) and host != "", "metrics.prometheus_host", host, METRICS["prometheus_host"].valid)
    port = read_int(table, METRICS["prometheus_port"], 0, "metrics.")
    return MetricsConfig(prometheus_port=port, prometheus_host=host)


def _limits(table: dict[str, Any]) -> Limits:
    defaults = Limits()
    no_unknown(table, LIMITS.names, "limits.")
    return Limits(**{key.name: read_int(table, key, getattr(defaults, key.name), "limits.") for key in LIMITS.keys})


def _check_endpoints(endpoints: Any, key: str, classes: list[str]) -> None:
    """Each endpoint a URL edged binds, with its socket files' paths short enough, the
    sockets of `classes` beside an ipc one (NAME-CLASS.sock) included."""
    expect(isinstance(endpoints, list) and endpoints, key, endpoints, SERVER["endpoints"].valid)
    for endpoint in endpoints:
        expect(
            isinstance(endpoint, str) and endpoint.startswith(("ipc://", "tcp://")) and "\0" not in endpoint,
            key,
            endpoint,
            'an "ipc://PATH" or "tcp://HOST:PORT" URL',
        )
        port = endpoint.rpartition(":")[2]
        if is_tcp(endpoint) and not (port.isdigit() and 1 <= int(port) <= 65535):
            # ZeroMQ takes a port past 65535 and binds another; 0 or * one it picks, which no client is told.
            raise ConfigError(f"{key}: {endpoint!r} names no port from 1 to 65535: give one, as tcp://127.0.0.1:5555")
        if endpoint.startswith("ipc://") and not PurePosixPath(endpoint[len("ipc://") :]).name:
            raise ConfigError(f"{key}: {endpoint!r} names no socket file: give one, as ipc:///run/edged/edged.sock")
        _check_socket_paths(endpoint, classes, key)


def _check_socket_paths(endpoint: str, classes: list[str], key: str) -> None:
    """An ipc endpoint's socket files, its own, the memfd socket (NAME.shm.sock) and each of
    `classes`' (NAME-CLASS.sock), in bytes, within the 107 a unix socket's path may hold."""
    if not endpoint.startswith("ipc://"):
        return
    paths = [endpoint, f"ipc://{shm_socket_path(endpoint)}", *(class_endpoint(endpoint, c) or "" for c in classes)]
    longest = max(paths, key=lambda path: len(path.encode()))
    if len(longest.encode()) - len("ipc://") > 107:
        raise ConfigError(
            f"{key}: ipc path {endpoint!r} is too long: {longest[len('ipc://') :]!r}, a socket file beside it, "
            "passes the 107 bytes a unix socket allows; use a shorter path"
        )
