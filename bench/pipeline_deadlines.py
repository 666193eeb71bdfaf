"""Pipelines admitted for what they cost: deadlines just past their price, and what expires.

    python bench/pipeline_deadlines.py [--requests 400] [--baseline DIR]

A fresh daemon serves the demo-ensemble (cnn-heavy beside pool then mlp-light, joined
in Python) and light-chain (three mlp-light calls with Python steps between), as
bench/pipeline.py builds them. For each pipeline: its cost inside the daemon (the p50
and p99 of `timing_us.total` over CALIBRATION requests with a long deadline), the sum
of its critical path's step prices (`stats`, as admission priced it before its whole
runs counted), then `--requests` requests one at a time, in the standard class, each
with a deadline drawn evenly between that sum and 1.5 times the cost: where admission
prices a pipeline below its cost, the ones it admits then expire mid-chain. Then as
many with deadlines between the cost's p99 and 1.5 times that, which a pipeline priced
at what its runs rarely pass admits. Reported for each range: how many were admitted,
and how many of those expired (target: at most 1%). With --baseline DIR, another
checkout's daemon takes the same requests after this one's.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
from paths import dealer
from pipeline import repository

from edged.client import Client
from edged.loadgen.launch import DaemonProcess, checkout_program
from edged.wire.codec import decode_reply, encode_request

INPUTS = {
    "demo-ensemble": lambda rng: {"image": rng.standard_normal((1, 3, 64, 64), dtype=np.float32)},
    "light-chain": lambda rng: {"x": rng.standard_normal((1, 64), dtype=np.float32)},
}
CALIBRATION = 300  # requests with a long deadline, for the cost's p50 and p99 inside the daemon
PATHS = {"demo-ensemble": ("heavy",), "light-chain": ("first", "widen1", "second", "widen2", "third")}


def one(sock, name: str, inputs: dict, deadline_ms: float) -> tuple[str, dict]:
    sock.send_multipart(encode_request(1, model=name, klass="standard", deadline_ms=deadline_ms, inputs=inputs))
    reply = decode_reply(sock.recv_multipart())
    return reply.status.value, reply.header


def sweep(sock, name: str, inputs: dict, deadlines_ms: np.ndarray) -> dict:
    """One request per deadline, in turn: how many were admitted, and what share of those expired."""
    statuses: Counter[str] = Counter(one(sock, name, inputs, float(ms))[0] for ms in deadlines_ms)
    admitted = len(deadlines_ms) - statuses["OVERLOADED"]
    expired = statuses["DEADLINE_EXCEEDED"]
    return {
        "statuses": dict(statuses),
        "admitted": admitted,
        "expired_share": round(expired / admitted, 4) if admitted else 0.0,
    }


def side(endpoint: str, requests: int, seed: int) -> dict[str, dict]:
    rng, sock, figures = np.random.default_rng(seed), dealer(endpoint), {}
    try:
        for name, make in INPUTS.items():
            inputs = make(rng)
            totals = [one(sock, name, inputs, 60_000.0)[1]["timing_us"]["total"] for _ in range(CALIBRATION)]
            cost_ms, tail_ms = (float(ms) / 1000 for ms in np.percentile(totals, [50, 99]))
            with Client(endpoint) as client:
                prices = client.stats()["classes"]["standard"]["prices"]
            elements = str(int(np.prod(next(iter(inputs.values())).shape)))

            def price_ms(key: str, elements: str = elements, prices: dict = prices) -> float:
                return prices[key]["row_ms_by_elements"][elements]

            path_ms = sum(price_ms(f"{name}/{step}") for step in PATHS[name])
            if name == "demo-ensemble":  # the other branch, pool then light, where it is the longer
                path_ms = max(path_ms, price_ms(f"{name}/pool") + price_ms(f"{name}/light")) + price_ms(f"{name}/join")
            figures[name] = {
                "cost_ms": round(cost_ms, 3),
                "cost_p99_ms": round(tail_ms, 3),
                "critical_path_price_ms": round(path_ms, 3),
                "whole_price_ms": price_ms(name),
                "bound_over_price": prices[name].get("bound_over_price"),
                # The issue's range, then one past the runs' own tail, where most should be admitted.
                "old_price_to_1.5x_cost": sweep(sock, name, inputs, rng.uniform(path_ms, 1.5 * cost_ms, requests)),
                "p99_to_1.5x_p99": sweep(sock, name, inputs, rng.uniform(tail_ms, 1.5 * tail_ms, requests)),
            }
    finally:
        sock.close()
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--baseline", help="another checkout, run after this one")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="edged-pdl-") as folder:
        root = repository(Path(folder))
        config = Path(folder) / "edged.toml"
        config.write_text(f'[server]\nmodel_repository = "{root}"\n')
        programs = {"this checkout": None}
        if args.baseline:
            programs["baseline"] = checkout_program(args.baseline)
        for label, program in programs.items():
            endpoint = f"ipc://{folder}/{label.replace(' ', '-')}.sock"
            with DaemonProcess([endpoint], config=config, program=program) as daemon:
                daemon.wait_serving()
                for name, row in side(endpoint, args.requests, seed=1).items():
                    print(f"{label:13} {name:13} {row}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
