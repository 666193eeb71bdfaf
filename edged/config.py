"""Every setting of the daemon: one TOML file, built-in defaults, checked at start-up.

An error names the key, what it holds, and the fix; an unknown key is an error too,
so a typo never silently leaves a default in force.
"""

from __future__ import annotations

import grp
import os
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from edged.protocol import Limits

PACKAGE_ROOT = Path(__file__).resolve().parent


class ConfigError(ValueError):
    """A setting that cannot be used; the message names the key and the fix."""


@dataclass(frozen=True, slots=True)
class ClassConfig:
    """One priority class and the lane reserved for it."""

    name: str
    order: int  # 0 is served first; lower order wins every tie
    queue_capacity: int = 64
    deadline_ms: float = 100.0  # default budget of a request that names none
    workers: int = 1
    max_batch: int = 1  # the most requests one backend call may carry
    batch_wait_us: int = 0  # how long a worker may wait to fill a batch; 0 for latency classes
    # Run a job estimated this cheap on the socket loop when the lane is idle (0: never).
    # It delays every class's next request by about as long: meant for the most urgent class.
    inline_max_us: int = 0
    threads: int = 1  # ONNX Runtime intra-op threads of this lane's sessions
    cpu_affinity: tuple[int, ...] = ()  # cores the lane's threads run on; empty: any
    nice: int = 0  # Linux thread niceness of the lane's workers: bulk yields the CPU to realtime
    stream_priority: int = 0  # CUDA stream priority for GPU backends (lower is more urgent)
    reserved_memory_mb: int = 0  # GPU memory reserved for the lane; 0: what the model needs
    cuda_graph: bool = False  # GPU backends: replay a captured CUDA graph per batch size (fixed shapes only)
    stuck_after_ms: int = 10_000  # a backend call open this long is answered INTERNAL and its worker replaced; 0: never


DEFAULT_CLASSES = (
    ClassConfig(
        "realtime",
        order=0,
        queue_capacity=32,
        deadline_ms=20.0,
        max_batch=4,
        inline_max_us=300,
        stream_priority=-1,
        stuck_after_ms=1_000,
    ),
    ClassConfig("standard", order=1, queue_capacity=128, deadline_ms=200.0, max_batch=8, stuck_after_ms=5_000),
    ClassConfig(
        "bulk",
        order=2,
        queue_capacity=512,
        deadline_ms=5000.0,
        max_batch=16,
        batch_wait_us=500,
        nice=10,
        stuck_after_ms=30_000,
    ),
)


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
    log_level: str = "info"
    models: tuple[str, ...] = ()  # names to serve; empty: every model in the repository
    limits: Limits = field(default_factory=Limits)
    max_message_bytes: int = 64 * 1024 * 1024
    ipc_mode: int = 0o660  # of every ipc socket file: owner and group may connect
    ipc_group: int | None = None  # gid given to ipc socket files; None: the process's group
    classes: tuple[ClassConfig, ...] = DEFAULT_CLASSES
    security: SecurityConfig = SecurityConfig()
    metrics: MetricsConfig = MetricsConfig()

    def class_named(self, name: str) -> ClassConfig:
        return next(c for c in self.classes if c.name == name)

    def with_endpoints(self, endpoints: list[str]) -> Config:
        _check_endpoints(endpoints, "--endpoint")
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
            raw = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist: give an existing file to --config") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    return parse_config(raw, base_dir=Path(path).resolve().parent if path else Path.cwd())


def parse_config(raw: dict[str, Any], base_dir: Path) -> Config:
    """Build a Config from a parsed TOML document, checking every key."""
    _no_unknown(raw, {"server", "limits", "classes", "security", "metrics"}, "")
    server = _table(raw, "server")
    _no_unknown(
        server,
        {
            "endpoints",
            "model_repository",
            "default_class",
            "backend",
            "fallback",
            "drain_timeout_ms",
            "log_level",
            "models",
            "max_message_bytes",
            "ipc_mode",
            "ipc_group",
        },
        "server.",
    )
    endpoints = server.get("endpoints", [default_endpoint()])
    _check_endpoints(endpoints, "server.endpoints")
    repository = server.get("model_repository")
    if repository is None:
        repo_path = default_repository()
    else:
        _expect(isinstance(repository, str), "server.model_repository", repository, "a path string")
        repo_path = (base_dir / repository).resolve()
    log_level = server.get("log_level", "info")
    _expect(
        log_level in ("debug", "info", "warning", "error"),
        "server.log_level",
        log_level,
        'one of "debug", "info", "warning", "error"',
    )
    models = server.get("models", [])
    _expect(
        isinstance(models, list) and all(isinstance(m, str) for m in models),
        "server.models",
        models,
        "a list of model names (empty: serve every model in the repository)",
    )
    backend = server.get("backend", "onnxruntime")
    _expect(isinstance(backend, str), "server.backend", backend, 'a backend name such as "onnxruntime"')
    fallback = server.get("fallback")
    _expect(
        fallback is None or (fallback == "onnxruntime" and backend == "tensorrt"),
        "server.fallback",
        fallback,
        '"onnxruntime", with server.backend = "tensorrt" (or leave it out: no fallback)',
    )

    classes = _classes(raw.get("classes", {}))
    default_class = server.get("default_class", "standard")
    names = [c.name for c in classes]
    _expect(default_class in names, "server.default_class", default_class, f"one of the classes: {names}")
    return Config(
        endpoints=tuple(endpoints),
        model_repository=repo_path,
        default_class=default_class,
        backend=backend,
        fallback=fallback,
        drain_timeout_ms=_positive_int(server, "drain_timeout_ms", 5000, "server."),
        log_level=log_level,
        models=tuple(models),
        limits=_limits(_table(raw, "limits")),
        max_message_bytes=_positive_int(server, "max_message_bytes", 64 * 1024 * 1024, "server."),
        ipc_mode=_ipc_mode(server.get("ipc_mode", 0o660)),
        ipc_group=_ipc_group(server.get("ipc_group")),
        classes=classes,
        security=_security(_table(raw, "security"), base_dir),
        metrics=_metrics(_table(raw, "metrics")),
    )


def _ipc_mode(value: Any) -> int:
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 0o777
    _expect(ok, "server.ipc_mode", value, "permission bits in TOML's octal notation, such as 0o660")
    return value


def _ipc_group(value: Any) -> int | None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return value
    _expect(isinstance(value, str), "server.ipc_group", value, "a group name or number")
    try:
        return grp.getgrnam(value).gr_gid
    except KeyError:
        raise ConfigError(
            f"server.ipc_group = {value!r} is not a group on this machine: name an existing group"
        ) from None


def _security(table: dict[str, Any], base_dir: Path) -> SecurityConfig:
    _no_unknown(table, {f.name for f in fields(SecurityConfig)}, "security.")
    key_file = _existing(table, "server_secret_key_file", base_dir, Path.is_file, "a key file")
    clients_dir = _existing(table, "allowed_clients_dir", base_dir, Path.is_dir, "a folder of client keys")
    # Encryption without a list of clients would serve anyone who has the server's public key.
    if (key_file is None) != (clients_dir is None):
        raise ConfigError(
            "security.server_secret_key_file and security.allowed_clients_dir go together: set both to use CURVE"
        )
    allow_plain = table.get("allow_plain_tcp", False)
    _expect(isinstance(allow_plain, bool), "security.allow_plain_tcp", allow_plain, "true or false")
    return SecurityConfig(key_file, clients_dir, allow_plain)


def _existing(
    table: dict[str, Any], key: str, base_dir: Path, exists: Callable[[Path], bool], what: str
) -> Path | None:
    value = table.get(key)
    if value is None:
        return None
    ok = isinstance(value, str) and exists(base_dir / value)
    _expect(ok, "security." + key, value, f"the path of {what} (`edged keygen` writes keys)")
    return (base_dir / value).resolve()


def _metrics(table: dict[str, Any]) -> MetricsConfig:
    _no_unknown(table, {f.name for f in fields(MetricsConfig)}, "metrics.")
    host = table.get("prometheus_host", "127.0.0.1")
    _expect(isinstance(host, str) and host != "", "metrics.prometheus_host", host, 'an address such as "127.0.0.1"')
    port = _int(table, "prometheus_port", 0, "metrics.", 0, 65535)
    return MetricsConfig(prometheus_port=port, prometheus_host=host)


def _limits(table: dict[str, Any]) -> Limits:
    defaults = Limits()
    known = {f.name for f in fields(Limits)}
    _no_unknown(table, known, "limits.")
    return Limits(**{name: _positive_int(table, name, getattr(defaults, name), "limits.") for name in known})


def _classes(table: Any) -> tuple[ClassConfig, ...]:
    _expect(isinstance(table, dict), "classes", table, "a table of [classes.NAME] tables")
    defaults = {c.name: c for c in DEFAULT_CLASSES}
    classes = []
    # A file that names classes defines the full set; a file that names none keeps the defaults.
    for name, settings in table.items() if table else ((n, {}) for n in defaults):
        prefix = f"classes.{name}."
        _expect(isinstance(settings, dict), f"classes.{name}", settings, "a table")
        base = defaults.get(name, ClassConfig(name, order=len(classes)))
        known = {f.name for f in fields(ClassConfig)} - {"name"}
        _no_unknown(settings, known, prefix)
        values: dict[str, Any] = {}
        for key in ("order", "workers", "max_batch", "queue_capacity"):
            minimum = 0 if key == "order" else 1
            values[key] = _int(settings, key, getattr(base, key), prefix, minimum)
        for key in ("batch_wait_us", "inline_max_us", "threads", "reserved_memory_mb", "stuck_after_ms"):
            values[key] = _int(settings, key, getattr(base, key), prefix, 0)
        values["nice"] = _int(settings, "nice", base.nice, prefix, -20, 19)
        values["stream_priority"] = _int(settings, "stream_priority", base.stream_priority, prefix, -10, 10)
        cuda_graph = settings.get("cuda_graph", base.cuda_graph)
        _expect(isinstance(cuda_graph, bool), prefix + "cuda_graph", cuda_graph, "true or false")
        values["cuda_graph"] = cuda_graph
        deadline = settings.get("deadline_ms", base.deadline_ms)
        _expect(
            isinstance(deadline, (int, float)) and not isinstance(deadline, bool) and 0 < deadline <= 3_600_000,
            prefix + "deadline_ms",
            deadline,
            "a number of milliseconds above 0 and at most 3600000 (an hour)",
        )
        values["deadline_ms"] = float(deadline)
        affinity = settings.get("cpu_affinity", list(base.cpu_affinity))
        usable = sorted(os.sched_getaffinity(0))
        _expect(
            isinstance(affinity, list) and all(isinstance(c, int) and c in usable for c in affinity),
            prefix + "cpu_affinity",
            affinity,
            f"a list of the cores this process may use, {usable} (empty: any)",
        )
        values["cpu_affinity"] = tuple(affinity)
        classes.append(replace(base, **values))
    orders = [c.order for c in classes]
    _expect(len(set(orders)) == len(orders), "classes.*.order", orders, "a distinct order for each class")
    return tuple(sorted(classes, key=lambda c: c.order))


def _check_endpoints(endpoints: Any, key: str) -> None:
    _expect(
        isinstance(endpoints, list) and endpoints,
        key,
        endpoints,
        'a non-empty list such as ["ipc:///run/edged/edged.sock"]',
    )
    for endpoint in endpoints:
        _expect(
            isinstance(endpoint, str) and endpoint.startswith(("ipc://", "tcp://")),
            key,
            endpoint,
            'an "ipc://PATH" or "tcp://HOST:PORT" URL',
        )
        if endpoint.startswith("ipc://") and len(endpoint) - len("ipc://") > 107:
            raise ConfigError(
                f"{key}: ipc path {endpoint!r} is longer than the 107 bytes a unix socket allows; use a shorter path"
            )


def _table(raw: dict[str, Any], key: str) -> dict[str, Any]:
    table = raw.get(key, {})
    _expect(isinstance(table, dict), key, table, f"a [{key}] table")
    return table


def _no_unknown(table: dict[str, Any], known: set[str], prefix: str) -> None:
    for key in table:
        if key not in known:
            raise ConfigError(f"unknown key {prefix}{key}: known keys here are {', '.join(sorted(known))}")


def _int(table: dict[str, Any], key: str, default: int, prefix: str, low: int, high: int | None = None) -> int:
    value = table.get(key, default)
    bounds = f"an integer >= {low}" if high is None else f"an integer from {low} to {high}"
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= low and (high is None or value <= high)
    _expect(ok, prefix + key, value, bounds)
    return value


def _positive_int(table: dict[str, Any], key: str, default: int, prefix: str) -> int:
    return _int(table, key, default, prefix, 1)


def _expect(ok: bool, key: str, value: Any, wanted: str) -> None:
    if not ok:
        raise ConfigError(f"{key} = {value!r} is not valid: set it to {wanted}")
