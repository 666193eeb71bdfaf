"""The class loops as the steering thread (edged.daemon.daemon) holds them: every method
here, and `fence`, are that thread's alone. All is bound on creation, before any model
loads, so a client asking during start-up hears `starting`. `ask` hands the loops
callables and a fence; the same fences feed systemd's watchdog (`check`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import ExitStack
from functools import partial

from edged.config import Config
from edged.daemon.lifecycle import Lifecycle
from edged.daemon.systemd import Notifier
from edged.metrics.prometheus import PrometheusEndpoint
from edged.serve.dispatch import Dispatcher, Serving
from edged.serve.figures import figures
from edged.serve.pending import PendingBytes
from edged.serve.transport.loop import Loop
from edged.serve.transport.sockets import Sockets
from edged.serve.transport.spin import Spin
from edged.serve.transport.turns import Turns
from edged.shm.intake import FdIntake
from edged.shm.registry import Regions

log = logging.getLogger("edged")

CHECK_LOOPS_EVERY_NS = 1_000_000_000  # or systemd's watchdog interval, where shorter


class Loops:
    """Every class's loop and dispatcher (`serving.dispatchers`, in class order), the fd intake
    and the Prometheus endpoint. `wake` wakes the steering thread when a loop passes a fence."""

    def __init__(self, config: Config, lifecycle: Lifecycle, wake: Callable[[], None]) -> None:
        names = tuple(c.name for c in config.classes)
        self.sockets = Sockets(
            config.endpoints,
            config.max_message_bytes,
            names,
            config.default_class,
            class_sockets=config.class_sockets,
            tcp_ports={c.name: c.tcp_port for c in config.classes if c.tcp_port is not None},
            ipc_mode=config.ipc_mode,
            ipc_group=config.ipc_group,
            security=config.security,
        )
        self.serving = Serving(
            config, lifecycle, Regions(config.shm), PendingBytes(config.limits), self.sockets.ingress, wake
        )
        turns = Turns()
        for name in names:
            dispatcher = Dispatcher(name, self.serving)
            dispatcher.loop = Loop(
                name,
                self.sockets.by_class[name],
                dispatcher.handle,
                turns,
                top=name == names[0],
                spin=Spin(config.spin_max_us * 1000),
                quiet=partial(self.serving.quiet, name),
            )
            self.serving.dispatchers[name] = dispatcher
        with ExitStack() as opened:  # closed again if what follows fails
            opened.callback(self.sockets.close)
            self.fd_intake = FdIntake(config, self.serving.regions)
            opened.callback(self.fd_intake.close)
            self.prometheus: PrometheusEndpoint | None = None
            if config.metrics.prometheus_port:
                self.prometheus = PrometheusEndpoint(config.metrics, lambda: figures(self.serving))
            opened.pop_all()
        self.fence = 0  # the latest fence asked of the loops
        self.next_check_ns = 0  # when `check` next asks for a fence
        self._checked_fence = 0  # the fence the loops must pass before the next ping
        self._behind = False  # a loop missed the last one (logged once)

    @property
    def dispatchers(self) -> list[Dispatcher]:
        return list(self.serving.dispatchers.values())

    def start(self) -> None:
        """Start the loops' threads: from now on each reads its sockets."""
        for dispatcher in self.dispatchers:
            dispatcher.loop.start()  # type: ignore[union-attr]

    def ask(self, ask: Callable[[Dispatcher], None] | None = None) -> None:
        """Hand each loop `ask(its dispatcher)`, if given, then a fence. Once `fenced`, every
        loop has run what it was handed before and finished the request it was handling."""
        self.fence += 1
        for dispatcher in self.dispatchers:
            assert dispatcher.loop is not None
            if ask is not None:
                dispatcher.loop.call_soon(ask, dispatcher)
            dispatcher.loop.call_soon(dispatcher.pass_fence, self.fence)

    def fenced(self) -> bool:
        return all(dispatcher.fence >= self.fence for dispatcher in self.dispatchers)

    def check(self, now: int, notifier: Notifier) -> None:
        """Ask for a fence; ping systemd's watchdog if every loop passed the last one (a stuck loop
        reads no socket). Fences also feed Loop.handoff_ns, so they are asked without a watchdog too."""
        if now < self.next_check_ns:
            return
        interval_ns = notifier.watchdog_interval_ns
        self.next_check_ns = now + min(interval_ns or CHECK_LOOPS_EVERY_NS, CHECK_LOOPS_EVERY_NS)
        behind = [d.klass for d in self.dispatchers if d.fence < self._checked_fence]
        if behind and not self._behind:
            log.error("the %s loop is inside a call: systemd's watchdog goes unfed", ", ".join(behind))
        self._behind = bool(behind)
        if interval_ns and not behind:
            notifier.notify(WATCHDOG="1")
        self.ask()
        self._checked_fence = self.fence

    def close(self, default: str, end: float) -> None:
        """Close the loops (waiting for each until `end`, monotonic, but at least 1 s), then the rest."""
        # The shared endpoints' loop last: the other loops hand it replies to what it read.
        for dispatcher in sorted(self.dispatchers, key=lambda d: d.klass == default):
            assert dispatcher.loop is not None
            dispatcher.loop.close()
            if not dispatcher.loop.join(max(end - time.monotonic(), 1.0)):
                log.error("the %s loop did not close: it is inside a call that does not return", dispatcher.klass)
        self.sockets.close()
        self.fd_intake.close()
        if self.prometheus is not None:
            self.prometheus.close()
