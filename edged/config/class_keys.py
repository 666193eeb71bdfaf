"""The keys of a [classes.NAME] table, defined once (see edged.config.keys)."""

from __future__ import annotations

from edged.config.settings import BOOL, Key, Section

CLASS = Section(
    "classes.NAME",
    (
        Key(
            "order",
            "integer",
            "Where the class is listed (stats, health) and its lane started, 0 first; distinct for every class. "
            "It ranks the classes for precedence (yields, max_call_ms: a lower order is a higher class) and their "
            "loops' turns; otherwise each class has its own lane, and nice, cpu_affinity and stream_priority "
            "divide the machine.",
            low=0,
            default="its position in the file",
        ),
        Key(
            "queue_capacity",
            "integer",
            "Most requests waiting or running in the class; past it, arrivals are OVERLOADED at once. It bounds "
            "how long a burst keeps the lane busy.",
            low=1,
        ),
        Key(
            "deadline_ms",
            "number",
            "Time budget, from receipt, of a request that sends no deadline_ms.",
            wanted="a number of milliseconds above 0 and at most 3600000 (an hour)",
        ),
        Key(
            "workers",
            "integer",
            "Worker threads of the lane, each with its own model runners (on the CPU every runner of a model "
            "calls one shared session; with threads other than 1, one per lane).",
            low=1,
            high=256,  # a thread each: thousands would stop start-up with a message naming no key
        ),
        Key(
            "max_batch",
            "integer",
            "Most rows one backend call may carry (batchable models only): queued requests share a call while "
            "their rows add up to at most this; a request is never split. On the GPU backends every buffer is "
            "allocated at start-up for this many rows, so a request with more is refused INVALID_ARGUMENT; on "
            "the CPU it runs alone in its call.",
            low=1,
            high=65_536,  # GPU buffers are sized by it: 2**40 rows failed start-up allocating terabytes
        ),
        Key(
            "batch_wait_us",
            "integer",
            "How long a worker may wait for more requests to fill a batch; 0: only what is already queued. Less "
            "than deadline_ms, and never more than half of what the requests in hand have left beyond their price.",
            low=0,
        ),
        Key(
            "inline_max_us",
            "integer",
            "Run a request priced at most this, in microseconds, on the class's loop itself, at once, when its "
            "lane is idle: it saves a worker's two thread hand-offs. The loop reads no request meanwhile, so "
            "with requests waiting behind it (the highest class runs those in turn) at most the shortest "
            "deadline it read lately / queue_capacity. 0: never. Left out: derived as the daemon serves, at "
            "most 100 of that loop's measured hand-offs and at most 1/10 of the shortest deadline among the "
            "requests the loop read lately, each for 10 to 20 s (from start-up and each reload, as if it had "
            "read every deadline it may: the class's own; for server.default_class, whose loop reads the shared "
            "endpoints, every class's), "
            "and 0 for a class with batch_wait_us; `edged stats --json` shows the cap in force "
            "(inline_max_us), that deadline (loop_deadline_ms) and the hand-off (handoff_us). See "
            "docs/operations.md, "
            '"Threads, and where a request runs".',
            low=0,
            default="derived as it serves",
        ),
        Key(
            "tcp_port",
            "integer",
            "A tcp socket of the class alone beside each tcp endpoint: tcp://HOST:PORT gives tcp://HOST:tcp_port, "
            "read by the class's own loop, under the same CURVE keys, and listed in health's ingress. A tcp client "
            "sends the class there (edged.client reads the port from health), as an ipc client does to the ipc "
            "socket beside its endpoint; named on the shared endpoint, the class pays two hand-offs between threads. "
            'Left out: none. See docs/protocol.md, "A socket per class".',
            low=1,
            high=65535,
            default="none",
        ),
        Key(
            "threads",
            "integer",
            "ONNX Runtime intra-op threads per session; 0: ONNX Runtime's own default.",
            low=0,
            high=1024,  # past an int's range ONNX Runtime refused the session with no key named
        ),
        Key(
            "threads_spin",
            "boolean",
            "With threads other than 1: whether the lane's ONNX Runtime thread pool spins while a call computes "
            "(as fast as an in-process session of as many threads; stopped when the call ends) or sleeps between "
            "its parts. Spinning threads take cores from every other thread on them: on a busy box, from the "
            'very thread they wait for (docs/engines.md, "Threads").',
            wanted=BOOL,
            default="true where the class's cpu_affinity gives it at least threads cores no other class names; "
            "else false",
        ),
        Key(
            "cpu_affinity",
            "list of integers",
            "Cores the lane's workers run on, among those the process may use; empty: any. Where no class names "
            "any and the daemon may use 6 cores or more, the highest class gets a quarter of them (at least 2), "
            "shared with the daemon's own threads, and every other class the rest. Naming cores for any class "
            "turns that off.",
            wanted="a list of the cores this process may use (empty: any)",
        ),
        Key(
            "nice",
            "integer",
            "Linux niceness of the lane's worker threads (below 0 needs CAP_SYS_NICE). Above 0 on a busy box, "
            "a worker set aside while it holds the interpreter lock stalls the other classes (docs/benchmarks.md).",
            low=-20,
            high=19,
        ),
        Key(
            "stream_priority",
            "integer",
            "CUDA stream priority, lower is more urgent (GPU backends; unused on the CPU).",
            low=-10,
            high=10,
        ),
        Key(
            "sm_count",
            "integer",
            "GPU backends: run the lane's kernels in a CUDA green context of this many SMs (CUDA 12.4+; rounded "
            "up to the device's partition size); 0: all SMs. Ran on an H200 and an H100 (96 SMs each).",
            low=0,
        ),
        Key(
            "arena_cap_mb",
            "integer",
            "GPU backends: a cap, in MiB, on ONNX Runtime's memory arena for the lane, split evenly between its "
            "sessions (gpu_mem_limit); 0: uncapped. A cap, not a reservation: an arena grows as it needs, up to "
            "it. Unused on the CPU.",
            low=0,
        ),
        Key(
            "cuda_graph",
            "boolean",
            "GPU backends: capture one CUDA graph per batch size at start-up and replay it per call (shapes fixed "
            "but the batch). Each capture runs alone, so other runners' CUDA work waits for it (on a reload the "
            "serving lanes pause that long per size); the loops' inline runners never capture. Unused on the CPU. "
            "On an H200 and an H100 (mlp-light) it shortened realtime's calls (296 us against 424-440 on the "
            "H100) but not its p99 beside bulk beyond the runs' spread.",
            wanted=BOOL,
        ),
        Key(
            "stuck_after_ms",
            "integer",
            "The lane's watchdog: a backend call still open after this long has its requests answered INTERNAL "
            "and its worker replaced (health shows the lane recovering until the new worker serves; the call's "
            "late result is dropped, counted as late_dropped); 0: never. A call a loop runs inline is not answered "
            "so (its reply would leave through that loop): a loop stuck inside one stops systemd's watchdog "
            'instead (docs/operations.md, "Start, ready, watchdog").',
            low=0,
        ),
        Key(
            "yields",
            "boolean",
            "Start no backend call while a higher class (lower order) has work queued or running.",
            wanted=BOOL,
        ),
        Key(
            "max_call_ms",
            "number",
            "Size each backend call (its batch) to finish within this, by the lane's estimate, so a higher "
            "request waits behind at most one short call; 0: no cap. Left out: a quarter of the highest class's "
            "deadline_ms for a class that yields, else 0.",
            wanted="a number of milliseconds, 0 for no cap (leave it out: a quarter of the highest class's deadline)",
            default="a quarter of the highest class's deadline_ms if it yields, else 0",
        ),
    ),
    intro="With no [classes.*] table the daemon has the three built-in classes below. A file with any "
    "[classes.NAME] table defines the whole set: exactly the classes it names. A table named realtime, "
    "standard or bulk starts from that built-in class's values; any other name starts from the defaults in "
    "this table. Every class gets a lane of its own: queue, worker threads and sessions.",
)
