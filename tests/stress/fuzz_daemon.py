"""Fuzz a live daemon over real sockets and check the one-reply promise holds.

    python tests/stress/fuzz_daemon.py --seconds 300            # starts a daemon of its own
    python tests/stress/fuzz_daemon.py --seconds 60 --endpoint ipc:///run/edged/edged.sock --pid 1234

Several DEALER sockets send, with a window of requests in flight each, a mix of valid
requests, mutations of valid headers (keys dropped, replaced or added; specs, shapes,
dtypes and versions bent), random payload lengths, truncated msgpack, random bytes,
headers over the size limit and wrong frame counts. Checked at the end:
  - every message whose id is readable got exactly one reply, carrying that id;
  - every socket got exactly as many replies as it sent messages (the ids of garbage
    cannot be read, so those are counted per socket);
  - a frame over max_message_bytes (sent now and then on a throwaway socket, when the
    daemon's limit is given) gets no reply, as docs/protocol.md says, and harms nobody;
  - no reply is INTERNAL (fuzzed input is the client's fault, never the daemon's);
  - a good request succeeds after the run;
  - resident memory after a warm-up and at the end differ by less than a bound.
Exit status 1 and the problems on stderr when any check fails; the report as JSON on stdout.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import zmq

from edged.client import Client
from edged.loadgen.launch import DaemonProcess, resident_kib
from edged.wire.codec import DTYPES

VALID_SPEC = {"name": "x", "dtype": "float32", "shape": [1, 64]}
HEADER_LIMIT = 64 * 1024  # the daemon's default limits.max_header_bytes
CLASSES = ("realtime", "standard", "bulk")
# A daemon of its own for the CLI: a small frame limit makes the over-the-limit case cheap to send.
OWN_CONFIG = "[server]\nmax_message_bytes = 1048576\n"
OWN_FRAME_LIMIT = 1048576
# A send or receive blocked this long raises zmq.Again: the daemon is stuck, not slow, and
# the run fails rather than hangs.
STUCK_MS = 60_000


@dataclass
class FuzzReport:
    seconds: float
    sent: int = 0
    replies: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    kinds: dict[str, int] = field(default_factory=dict)
    readable_without_one_reply: int = 0  # readable ids with no reply, or more than one
    sockets_miscounted: int = 0  # sockets whose reply count is not their message count
    unreadable_replies: int = 0  # replies whose header is not a msgpack map with a status
    oversized_sent: int = 0
    oversized_answered: int = 0
    rss_warm_kib: int = 0
    rss_end_kib: int = 0
    served_after: bool = False

    def problems(self, rss_bound_mib: float) -> list[str]:
        found = []
        if self.readable_without_one_reply:
            found.append(f"{self.readable_without_one_reply} readable ids did not get exactly one reply")
        if self.sockets_miscounted:
            found.append(f"{self.sockets_miscounted} sockets got a reply count other than their message count")
        if self.unreadable_replies:
            found.append(f"{self.unreadable_replies} replies had no readable header")
        if self.oversized_answered:
            found.append(f"{self.oversized_answered} frames over max_message_bytes got a reply")
        if self.statuses.get("INTERNAL"):
            found.append(f"{self.statuses['INTERNAL']} INTERNAL replies: the daemon failed on fuzzed input")
        if not self.served_after:
            found.append("a good request failed after the run")
        grown_mib = (self.rss_end_kib - self.rss_warm_kib) / 1024
        if grown_mib > rss_bound_mib:
            found.append(f"resident memory grew by {grown_mib:.1f} MiB after the warm-up (bound {rss_bound_mib})")
        return found


# --- what to send ----------------------------------------------------------------


def random_value(rng: random.Random, depth: int = 0) -> Any:
    """Any msgpack value, nested a little: what a hostile client can put in a header slot."""
    kind = rng.randrange(10 if depth < 2 else 7)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.choice([0, -1, 1, 2**31, 2**63 - 1, 2**64 - 1, -(2**63), rng.randrange(-(2**40), 2**40)])
    if kind == 3:
        return rng.choice([0.0, -0.0, 1e308, -1e308, float("nan"), float("inf"), float("-inf"), rng.random()])
    if kind == 4:
        return "".join(chr(rng.choice([rng.randrange(32, 127), rng.randrange(0x80, 0x3000)])) for _ in range(8))
    if kind == 5:
        return rng.randbytes(rng.randrange(0, 80))
    if kind == 6:
        return msgpack.ExtType(rng.randrange(0, 128), rng.randbytes(rng.randrange(0, 8)))
    if kind == 7:
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(0, 4))]
    return {random_key(rng): random_value(rng, depth + 1) for _ in range(rng.randrange(0, 4))}


def random_key(rng: random.Random) -> Any:
    """A map key that is never "id": the fuzzer must know which ids the daemon can read."""
    key = rng.choice(["v", "op", "model", "class", "deadline_ms", "inputs", "outputs", "x", 7, b"id", None, 1.5])
    return key if key != "id" else "id_"


def valid_header(rng: random.Random, request_id: str) -> tuple[dict[str, Any], list[bytes]]:
    if rng.random() < 0.15:
        return {"v": 1, "id": request_id, "op": rng.choice(["health", "models", "stats"])}, []
    rows = rng.randrange(1, 5)
    header = {
        "v": 1,
        "id": request_id,
        "op": "infer",
        "model": "mlp-light",
        "class": rng.choice(CLASSES),
        "inputs": [{**VALID_SPEC, "shape": [rows, 64]}],
    }
    return header, [np.float32(rng.random()).tobytes() * (rows * 64)]


def mutate(rng: random.Random, header: dict[str, Any]) -> None:
    """Bend one thing in a valid header, never its id."""
    spec = header["inputs"][0] if isinstance(header.get("inputs"), list) and header["inputs"] else None
    action = rng.randrange(9)
    keys = [key for key in header if key != "id"]
    if action == 0 and keys:
        del header[rng.choice(keys)]
    elif action == 1 and keys:
        header[rng.choice(keys)] = random_value(rng)
    elif action == 2:
        header[random_key(rng)] = random_value(rng)
    elif action == 3 and isinstance(spec, dict):
        spec[rng.choice(["name", "dtype", "shape", "extra"])] = random_value(rng)
    elif action == 4 and isinstance(spec, dict):
        spec["shape"] = rng.choice([[], [0, 64], [-1, 64], [2**40, 2**40], [1, 64, 1], [2**62], [1] * 40])
    elif action == 5 and isinstance(spec, dict):
        spec["dtype"] = rng.choice(list(DTYPES))
    elif action == 6:
        header["v"] = rng.choice([0, 2, "1", 1.0, None, True])
    elif action == 7:
        header["deadline_ms"] = rng.choice([0, -1, 1e-9, 0.001, 1e308, float("nan"), "soon", 5.0])
    elif isinstance(header.get("inputs"), list):
        # From the first spec alone: repeated mutations must not push the header past the size limit.
        header["inputs"] = header["inputs"][:1] * rng.choice([0, 2, 17])


def payload_variants(rng: random.Random, payloads: list[bytes]) -> list[bytes]:
    """Right, short, long, empty, missing, extra or big payload frames."""
    choice = rng.randrange(7)
    if choice == 0 or not payloads:
        return payloads
    if choice == 1:
        return [payloads[0][: rng.randrange(len(payloads[0]))]]
    if choice == 2:
        return [payloads[0] + rng.randbytes(rng.randrange(1, 64))]
    if choice == 3:
        return []
    if choice == 4:
        return payloads * rng.randrange(2, 20)
    if choice == 5:
        return [rng.randbytes(rng.randrange(0, 2048))]
    return [bytes(rng.choice([64 * 1024, 256 * 1024]))]  # big, but under any sane frame limit


def make_message(rng: random.Random, request_id: str) -> tuple[str, list[bytes], bool]:
    """(kind, frames, whether the daemon can read its id) for one fuzzed message."""
    header, payloads = valid_header(rng, request_id)
    kind = rng.choice(["valid", "mutated", "mutated", "mutated", "bad id", "garbage", "truncated", "huge header"])
    if kind == "valid":
        return kind, [msgpack.packb(header), *payloads], True
    if kind == "mutated":
        for _ in range(rng.randrange(1, 4)):
            mutate(rng, header)
        return kind, [msgpack.packb(header), *payload_variants(rng, payloads)], True
    if kind == "bad id":
        if rng.random() < 0.3:
            del header["id"]
        else:
            header["id"] = rng.choice([1.5, None, True, [1], {"a": 1}, "i" * 65, b"b" * 65, random_value(rng)])
            if isinstance(header["id"], (int, str, bytes)) and not isinstance(header["id"], bool):
                header["id"] = 0.5  # a random value that happens to be a valid id would be readable
        return kind, [msgpack.packb(header), *payloads], False
    if kind == "garbage":
        # Never an empty first frame: the daemon would take it as a REQ delimiter (still one reply,
        # but behind an empty frame, and with nothing after it, the garbage frame count changes).
        frames = [rng.randbytes(rng.randrange(1, 200)) for _ in range(rng.randrange(1, 5))]
        frames[0] = bytes([rng.choice([0xC1, 0x92, 0xA3, 0xDE, 0x00])]) + frames[0]  # never a map that decodes
        return kind, frames, False
    if kind == "truncated":
        packed = msgpack.packb(header)
        return kind, [packed[: rng.randrange(1, len(packed))], *payloads], False
    header["pad"] = "x" * (HEADER_LIMIT + rng.randrange(1, 4096))
    return kind, [msgpack.packb(header), *payloads], True  # its id, near the start, is read


# --- the run -------------------------------------------------------------------


@dataclass
class _Peer:
    sock: zmq.Socket
    sent: int = 0
    received: int = 0
    in_flight: int = 0


def fuzz(
    endpoint: str,
    pid: int,
    seconds: float,
    *,
    seed: int = 0,
    sockets: int = 4,
    window: int = 16,
    frame_limit: int | None = None,
    warmup_s: float | None = None,
    drain_s: float = 15.0,
) -> FuzzReport:
    """Fuzz the daemon at `endpoint` (process `pid`) for `seconds`. `frame_limit`: its
    max_message_bytes, when known, to send frames over it now and then."""
    rng = random.Random(seed)
    report = FuzzReport(seconds=seconds)
    context = zmq.Context()
    peers = []
    for _ in range(sockets):
        sock = context.socket(zmq.DEALER)
        sock.linger = 0
        sock.sndtimeo = sock.rcvtimeo = STUCK_MS
        sock.connect(endpoint)
        peers.append(_Peer(sock))
    poller = zmq.Poller()
    for peer in peers:
        poller.register(peer.sock, zmq.POLLIN)
    readable: Counter[str] = Counter()  # id -> replies carrying it
    kinds: Counter[str] = Counter()
    statuses: Counter[str] = Counter()
    start = time.monotonic()
    warm_at = start + (warmup_s if warmup_s is not None else min(seconds * 0.3, 30.0))
    next_oversize = start + seconds / 2
    end = start + seconds
    serial = 0
    try:
        while True:
            now = time.monotonic()
            if report.rss_warm_kib == 0 and now >= warm_at:
                report.rss_warm_kib = resident_kib(pid)
            if now < end:
                for index, peer in enumerate(peers):
                    while peer.in_flight < window:
                        serial += 1
                        request_id = f"s{index}-{serial}"
                        kind, frames, id_readable = make_message(rng, request_id)
                        if id_readable:
                            readable[request_id] = 0
                        kinds[kind] += 1
                        peer.sock.send_multipart(frames, copy=False)
                        peer.sent += 1
                        peer.in_flight += 1
                if frame_limit is not None and now >= next_oversize:
                    report.oversized_answered += _send_oversized(context, endpoint, frame_limit)
                    report.oversized_sent += 1
                    next_oversize += max(seconds / 4, 5.0)
            elif all(peer.in_flight == 0 for peer in peers) or now > end + drain_s:
                break
            for sock, _ in poller.poll(20):
                peer = next(p for p in peers if p.sock is sock)
                while sock.get(zmq.EVENTS) & zmq.POLLIN:
                    _count_reply(sock.recv_multipart(), peer, readable, statuses, report)
    finally:
        context.destroy(linger=0)
    report.sent = sum(peer.sent for peer in peers)
    report.replies = sum(peer.received for peer in peers)
    report.sockets_miscounted = sum(peer.sent != peer.received for peer in peers)
    report.readable_without_one_reply = sum(count != 1 for count in readable.values())
    report.statuses = dict(statuses)
    report.kinds = dict(kinds)
    report.served_after = _serves(endpoint)
    report.rss_end_kib = resident_kib(pid)
    return report


def _count_reply(
    frames: list[bytes], peer: _Peer, readable: Counter[str], statuses: Counter[str], report: FuzzReport
) -> None:
    peer.received += 1
    peer.in_flight -= 1
    try:
        header = msgpack.unpackb(frames[0], raw=False)
        status = header["status"]
    except Exception:  # a reply the fuzzer cannot read is itself a finding
        report.unreadable_replies += 1
        return
    statuses[status] += 1
    if header.get("id") in readable:
        readable[header["id"]] += 1


def _send_oversized(context: zmq.Context, endpoint: str, frame_limit: int) -> int:
    """One frame over the limit on a socket of its own (ZeroMQ drops that connection);
    returns how many replies came (the promise: none)."""
    sock = context.socket(zmq.DEALER)
    sock.linger = 0
    sock.sndtimeo = sock.rcvtimeo = STUCK_MS
    sock.connect(endpoint)
    try:
        sock.send_multipart([msgpack.packb({"v": 1, "id": "oversized", "op": "health"}), bytes(frame_limit + 1)])
        return 1 if sock.poll(300) else 0
    finally:
        sock.close(linger=0)


def _serves(endpoint: str) -> bool:
    x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(1, 64)
    try:
        with Client(endpoint, timeout_ms=10_000) as client:
            return client.infer("mlp-light", {"x": x})["scores"].shape[0] == 1
    except Exception:
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--endpoint", help="a running daemon (give --pid too); default: start one")
    parser.add_argument("--pid", type=int, help="the running daemon's process id, for its memory")
    parser.add_argument("--frame-limit", type=int, help="the running daemon's server.max_message_bytes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sockets", type=int, default=4)
    parser.add_argument("--rss-bound-mib", type=float, default=32.0)
    args = parser.parse_args()
    if args.endpoint is not None:
        if args.pid is None:
            parser.error("--endpoint needs --pid")
        report = fuzz(
            args.endpoint, args.pid, args.seconds, seed=args.seed, sockets=args.sockets, frame_limit=args.frame_limit
        )
    else:
        folder = Path(tempfile.mkdtemp(prefix="ed-fuzz-", dir="/tmp"))
        (folder / "edged.toml").write_text(OWN_CONFIG)
        endpoint = f"ipc://{folder}/edged.sock"
        with DaemonProcess([endpoint], config=folder / "edged.toml", log_path=folder / "daemon.log") as daemon:
            daemon.wait_serving()
            report = fuzz(
                endpoint,
                daemon.process.pid,
                args.seconds,
                seed=args.seed,
                sockets=args.sockets,
                frame_limit=OWN_FRAME_LIMIT,
            )
        print(f"daemon log: {folder / 'daemon.log'}", file=sys.stderr)
    print(json.dumps(asdict(report), indent=2))
    problems = report.problems(args.rss_bound_mib)
    for problem in problems:
        print(f"PROBLEM: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
