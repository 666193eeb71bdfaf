"""`edged health --probe`: the daemon's health reply turned into a verdict and an exit
code, for Kubernetes' probes (deploy/kubernetes/) or any other supervisor.

- live: the socket loop answered; nothing else is asked of it, so a daemon that is
  still loading its models is live (restarting it would only start the load again).
- started: the first set of lanes is loaded and warm (the state left `starting`).
- ready: the daemon's own `ready`: inference open (not starting, not draining) and
  every lane ok (none waiting for a worker its watchdog replaced).
"""

from __future__ import annotations

from typing import Any

PROBES = ("live", "ready", "started")


def verdict(probe: str, health: dict[str, Any]) -> tuple[bool, str]:
    """Whether `health` passes `probe`, and one line saying why."""
    state = health.get("state")
    if probe == "live":
        return True, f"live: the daemon answered ({state})"
    if probe == "started":
        started = state not in (None, "starting")
        return started, f"{'started' if started else 'not started'}: {state}"
    if health.get("ready") is True:
        return True, "ready"
    reasons = [] if state == "serving" else [str(state)]
    reasons += [f"lane {name} {why}" for name, why in health.get("lanes", {}).items() if why != "ok"]
    return False, "not ready: " + ("; ".join(reasons) or "the daemon says so")
