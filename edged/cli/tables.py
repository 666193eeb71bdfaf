"""What `edged models`, `stats` and `health` print for a person: a short table, a line per
model or class, with the figures an operator reads first. `--json` prints the daemon's
reply instead, for scripts (edged.cli.client_commands)."""

from __future__ import annotations

from typing import Any


def table(headers: list[str], rows: list[list[str]]) -> str:
    """Columns padded to their widest cell, two spaces apart, as `kubectl get` prints them."""
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows)]
    lines = [headers, *rows]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in lines)


def _ms(us: float) -> str:
    return f"{us / 1000:.2f}"


def _mib(size: int | None) -> str:
    return "-" if size is None else f"{size / (1 << 20):.1f}"


def stats_table(stats: dict[str, Any]) -> str:
    """A line per class: what waits, what was served, shed, expired and failed, and the
    latency of its requests inside the daemon (ms, from receipt to reply)."""
    summary = (
        f"{stats['state']}: {_mib(stats['memory']['rss_bytes'])} MiB resident, "
        f"{stats['invalid']} invalid, {stats['unroutable']} unroutable"
    )
    if not stats["classes"]:
        return summary + "; no class serves yet"
    headers = ["CLASS", "QUEUED", "COMPLETED", "SHED", "EXPIRED", "FAILED", "P50 MS", "P99 MS", "P99.9 MS"]
    rows = []
    for name, figures in stats["classes"].items():
        total = figures["latency_us"]["total"]
        rows.append(
            [
                name,
                str(figures["queue_depth"]),
                str(figures["completed"]),
                str(sum(figures["shed"].values())),
                str(figures["expired"]),
                str(figures["failed"]),
                # None answered after admission yet: no latency, not a latency of 0.
                *(_ms(total[p]) if figures["completed"] + figures["failed"] else "-" for p in ("p50", "p99", "p999")),
            ]
        )
    return summary + "\n" + table(headers, rows)


def health_table(health: dict[str, Any]) -> str:
    """The state in one line, then a line per class (its lane, the sockets that take it
    alone) and a line per model that failed."""
    ready = "ready" if health["ready"] else "not ready"
    lines = [f"{health['state']}, {ready}, up {health['uptime_s']:.1f} s"]
    lanes, ingress = health["lanes"], health["ingress"]
    names = list(dict.fromkeys([*lanes, *ingress]))
    if names:
        rows = [[name, lanes.get(name, "-"), " ".join(ingress.get(name, [])) or "-"] for name in names]
        lines.append(table(["CLASS", "LANE", "INGRESS"], rows))
    lines += [f"failed model {name}: {why}" for name, why in health["failed_models"].items()]
    return "\n".join(lines)


def _price(prices: dict[str, dict[str, Any]], model: str) -> str:
    """A call of one row on the lane, in ms; a model priced by its size says so."""
    price = prices.get(model)
    if price is None:
        return "-"
    return f"{price['first_row_ms']:.3f}" if "first_row_ms" in price else "by size"


def _tensors(specs: list[dict[str, Any]]) -> str:
    return ", ".join(f"{s['name']} {s['dtype']}[{','.join(map(str, s['shape']))}]" for s in specs)


def models_table(models: list[dict[str, Any]], stats: dict[str, Any], health: dict[str, Any]) -> str:
    """A line per model: how it is served, its tensors, and what one row costs on each
    class's lane (ms, as admission prices it); then a line per model that failed."""
    classes = stats["classes"]
    headers = ["NAME", "BACKEND", "PRECISION", "INPUTS", "OUTPUTS", *(f"{name.upper()} MS" for name in classes)]
    rows = [
        [
            model["name"],
            model["backend"],
            model["precision"],
            _tensors(model["inputs"]),
            _tensors(model["outputs"]),
            *(_price(figures.get("prices", {}), model["name"]) for figures in classes.values()),
        ]
        for model in models
    ]
    lines = [table(headers, rows)] if rows else [f"{health['state']}: no model served"]
    lines += [f"failed model {name}: {why}" for name, why in health["failed_models"].items()]
    return "\n".join(lines)
