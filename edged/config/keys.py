"""Every key of the config file, defined once: its type, valid values and meaning
(a class's keys: edged.config.class_keys).

Validation (file.py, classes.py, shm.py) checks each value against its Key here, and
docs/configuration.md and `edged config --explain` are written from the same Keys
(edged.config.reference). Defaults live in the dataclasses that hold the settings.
"""

from __future__ import annotations

from edged.config.class_keys import CLASS
from edged.config.settings import BOOL, Key, Section

SERVER = Section(
    "server",
    (
        Key(
            "endpoints",
            "list of strings",
            'ROUTER sockets to bind, one per entry: "ipc://PATH" for local clients (a path of at most 107 bytes; '
            "its folder is created; a socket file left by a dead daemon is replaced, one a live process serves "
            'is refused) or "tcp://HOST:PORT". Applied at start-up only: a change needs a restart.',
            wanted='a non-empty list such as ["ipc:///run/edged/edged.sock"]',
            default="ipc://$RUNTIME_DIRECTORY/edged.sock under systemd, else ipc://$XDG_RUNTIME_DIR/edged/edged.sock, "
            "else ipc:///tmp/edged-UID/edged.sock",
        ),
        Key(
            "model_repository",
            "path",
            "The model repository: one folder per model, each with its manifest.json and files. A relative path "
            "is taken from the config file's folder.",
            wanted="a path string",
            default="engines/ beside the edged package (a checkout), else ./engines",
        ),
        Key(
            "default_class",
            "string",
            "Class of a request that names none; one of the configured classes.",
            wanted="one of the classes",
        ),
        Key(
            "backend",
            "string",
            'Runtime that serves the models: "onnxruntime" (CPU), "onnxruntime-cuda" or "tensorrt" (GPU '
            "backends; see the README's GPU sections).",
            wanted='one of "onnxruntime", "onnxruntime-cuda" and "tensorrt" (edged.backends.BACKENDS)',
        ),
        Key(
            "fallback",
            "string",
            'With backend = "tensorrt": serve a model\'s ONNX on ONNX Runtime where no engine fits this GPU and '
            "runtime (the reason is logged).",
            wanted='"onnxruntime", with server.backend = "tensorrt" (or leave it out: no fallback)',
            default="none: no fallback",
        ),
        Key(
            "drain_timeout_ms",
            "integer",
            "After SIGTERM or SIGINT: how long admitted requests may still run before the rest are answered "
            "UNAVAILABLE.",
            low=1,
        ),
        Key(
            "stop_grace_ms",
            "integer",
            "After the drain: how long calls already inside the backend may still finish; a request still inside "
            "one then is answered INTERNAL, so nothing admitted goes unanswered. Keep systemd's TimeoutStopSec "
            "above drain_timeout_ms + stop_grace_ms.",
            low=1,
        ),
        Key("log_level", "string", "Lowest level logged.", wanted='one of "debug", "info", "warning", "error"'),
        Key(
            "models",
            "list of strings",
            "Names of the models to serve; empty: every model with a variant for backend. A non-fp32 variant is "
            'named "MODEL:PRECISION", e.g. "mlp-light:int8".',
            wanted="a list of model names (empty: serve every model in the repository)",
        ),
        Key(
            "on_model_failure",
            "string",
            'A model that fails to load or warm up: "stop" fails start-up with a sentence naming the model, the '
            'shapes tried and the manifest key to set; "skip" serves the other models and lists the failed one, '
            "with its reason, in `edged models` and `edged health`, answering its requests UNAVAILABLE with that "
            "reason. The default stops: a daemon that starts without a model its clients expect fails them later, "
            "one UNAVAILABLE at a time, where a failed start-up is seen at once.",
            wanted='"stop" (a model that fails to load or warm up stops start-up) or "skip" (serve the others)',
        ),
        Key(
            "gpu_headroom_mb",
            "integer",
            "GPU backends: MiB of device memory that must still be free once every lane has loaded and warmed "
            "(measured), for what grows later (an uncapped arena, a reload's lanes loading beside the serving "
            "ones); start-up or a reload is refused below it.",
            low=0,
        ),
        Key(
            "memory_limit_mb",
            "integer",
            "The daemon's RSS, in MiB, that its models' weights and lanes must stay under; 0: no limit. Each "
            "model's new weights are counted at their file's size before any load, and start-up (or a reload) is "
            "refused naming the model if they would pass it; then each lane is measured as it loads and warms, "
            "and one that takes the daemon past it is refused by name.",
            low=0,
        ),
        Key(
            "spin_max_us",
            "integer",
            "The longest a class's loop polls after answering, rather than sleep, so that a request sent back "
            "at once finds it awake. It polls only where its requests have lately come that fast (twice their "
            "average gap from its last answer, shown per class in stats as arrival_gap_us and spin_us), and only "
            "while no other loop is awake, no lane has work, none is being built or retiring and no new worker "
            "warms; an idle loop never does. 0: never; a box that must save power or share its cores may want "
            "that. Applied at start-up only.",
            low=0,
            high=10_000,
        ),
        Key(
            "max_message_bytes",
            "integer",
            "ZeroMQ's per-frame size limit (ZMQ_MAXMSGSIZE) on every socket: a peer that sends a larger frame is "
            "disconnected, with no reply (edged.client refuses an input over its own max_message_bytes, this "
            "default, before sending it). At least limits.max_header_bytes plus 64 (what CURVE may add to a frame), "
            "so that an oversized header is refused in words.",
            low=1,
        ),
        Key(
            "ipc_mode",
            "integer",
            "Permission bits of every ipc socket file, in TOML's octal notation (0o660, not 660). Connecting "
            "needs write permission: 0o660 admits the daemon's user and group. The owner's write bit (0o200) is "
            "required. Applied at start-up only.",
            wanted="permission bits in TOML's octal notation, such as 0o660",
            default="0o660",
        ),
        Key(
            "ipc_group",
            "string or integer",
            "Group (a name or a number) given to every ipc socket file; the daemon must belong to it. Applied at "
            "start-up only.",
            wanted="a group name or number",
            default="none: the daemon's own group",
        ),
        Key(
            "class_sockets",
            "boolean",
            "Beside each ipc endpoint DIR/NAME.sock, a socket per class, DIR/NAME-CLASS.sock, which takes that "
            "class alone and is read by that class's own loop (the shared sockets belong to the default class's "
            "loop); edged.client sends each class to its socket. Beside each tcp endpoint, one for each class with "
            'a tcp_port (classes.NAME.tcp_port). See docs/protocol.md, "A socket per class".',
            wanted="true (beside each ipc endpoint, a socket per class) or false (the shared sockets only)",
        ),
    ),
)

LIMITS = Section(
    "limits",
    (
        Key(
            "max_header_bytes",
            "integer",
            "Largest header frame of a request; at least 256, about what a header naming a model and one input "
            "takes with an id of 64 bytes.",
            low=256,
        ),
        Key("max_tensors", "integer", "Most input tensors in one request.", low=1),
        Key("max_tensor_elements", "integer", "Most elements in one input tensor.", low=1),
        Key(
            "max_pending_bytes",
            "integer",
            "Most bytes of input that admitted requests not yet answered may hold, in all; a request past it is "
            "shed OVERLOADED on arrival. Queue capacities count requests, this counts their memory. Applied at "
            "start-up.",
            low=1,
        ),
        Key(
            "max_pending_bytes_per_peer",
            "integer",
            "The same, for the requests of one client connection: a client that sends faster than it is served "
            "is shed, and takes no one else's room.",
            low=1,
        ),
    ),
    intro="The size limits (max_header_bytes, max_tensors, max_tensor_elements) are checked while decoding, "
    "before anything is allocated for a request; past them: INVALID_ARGUMENT. The two max_pending_bytes keys "
    "are checked when a request is admitted in its class; past them it is shed OVERLOADED.",
)

SECURITY = Section(
    "security",
    (
        Key(
            "server_secret_key_file",
            "path",
            "The daemon's NAME.key_secret file from `edged keygen` (the public key is derived from it); it may "
            "not be readable by every user. Goes with allowed_clients_dir.",
            wanted="the path of a key file (`edged keygen` writes keys)",
            default="none: tcp is plain",
        ),
        Key(
            "allowed_clients_dir",
            "path",
            "Folder of the public keys (*.key) of the clients served; a client with any other key is refused at "
            "the handshake. Goes with server_secret_key_file.",
            wanted="the path of a folder of client keys (`edged keygen` writes keys)",
            default="none",
        ),
        Key(
            "allow_plain_tcp",
            "boolean",
            "Serve a plain tcp:// endpoint on an address other than loopback; without it, and without CURVE, "
            "the daemon refuses to start.",
            wanted=BOOL,
        ),
    ),
    intro="CURVE encryption and authentication on the tcp:// endpoints (ipc stays plain). The two key settings "
    "go together; a relative path is taken from the config file's folder. Applied at start-up only: a change "
    "needs a restart, not SIGHUP.",
)

METRICS = Section(
    "metrics",
    (
        Key(
            "prometheus_port",
            "integer",
            "Serve Prometheus metrics at http://prometheus_host:PORT/metrics; 0: off. Needs "
            "`pip install 'edged[prometheus]'`.",
            low=0,
            high=65535,
        ),
        Key(
            "prometheus_host",
            "string",
            "Address the metrics endpoint listens on. The endpoint has no authentication: keep it on loopback "
            "unless the network is trusted.",
            wanted='an address such as "127.0.0.1"',
        ),
    ),
    notes="A scrape reads the stats op's figures on its own thread (nothing is added to the request path): "
    "`edged_requests_total{class,outcome}` (outcome: `completed`, `failed`, `expired`, `shed_queue_full`, "
    "`shed_deadline`, `shed_bytes`), `edged_requests_received_total`, `edged_requests_admitted_total`, "
    "`edged_backend_calls_total`, `edged_backend_rows_total` and `edged_queue_depth` by class, "
    "`edged_latency_seconds{class,stage,quantile}` and `edged_latency_max_seconds{class,stage}` (percentiles "
    "since start-up, stages `queue`, `compute`, `total`), `edged_invalid_requests_total`, "
    "`edged_unroutable_replies_total`, `edged_state{state}`, and the process's own `process_*` metrics.",
)

SHM = Section(
    "shm",
    (
        Key(
            "enabled",
            "boolean",
            "Take sealed memfds on a unix socket beside each ipc endpoint (NAME.shm.sock beside NAME.sock), and "
            "serve inputs and outputs in registered regions on ipc endpoints (never on tcp).",
            wanted=BOOL,
        ),
        Key(
            "trust_posix_names",
            "boolean",
            "Also map POSIX shared-memory objects a client names: such a client can shrink the object under the "
            "daemon, a SIGBUS that ends it, so only for clients trusted not to.",
            wanted=BOOL,
        ),
        Key(
            "prefix",
            "string",
            "With trust_posix_names: the only POSIX objects the daemon maps, names that start with it.",
            wanted="a non-empty name prefix of letters, digits, '.', '_' or '-' (no '/')",
        ),
        Key("max_region_mb", "integer", "The largest region it maps, in MiB.", low=1),
        Key("max_regions_per_peer", "integer", "Regions one connection may hold registered.", low=1),
        Key(
            "max_regions",
            "integer",
            "Regions the daemon holds registered in all, whoever registered them (each holds a descriptor and a "
            "mapping); past it a registration is refused UNAVAILABLE.",
            low=1,
        ),
        Key("max_mb_per_peer", "integer", "MiB of one connection's regions together.", low=1),
        Key(
            "idle_s",
            "integer",
            "A region unused this many seconds is forgotten, and unmapped once no request reads it "
            "(one is forgotten too when the connection that registered it closes).",
            low=1,
        ),
    ),
    intro='Tensors in shared memory for clients on this machine (docs/protocol.md, "Shared memory"; what a '
    "local client can then do, and the one risk: docs/operations.md). Off unless enabled. Read at start-up.",
)

SECTIONS = (SERVER, LIMITS, SECURITY, METRICS, SHM, CLASS)
