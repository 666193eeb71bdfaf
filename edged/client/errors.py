"""What a call to edged raises: one exception per status other than OK, and NoReply.
Shared by the clients (edged.client) and the CLI."""

from __future__ import annotations

from edged.wire.codec import Reply, Status


class EdgedError(Exception):
    """A request that did not succeed; `status` is the daemon's, `message` its sentence."""

    status: Status | None = None

    def __init__(self, message: str, reply: Reply | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.reply = reply


class InvalidArgument(EdgedError):
    status = Status.INVALID_ARGUMENT


class NotFound(EdgedError):
    status = Status.NOT_FOUND


class Overloaded(EdgedError):
    status = Status.OVERLOADED

    @property
    def retry_after_ms(self) -> float:
        return float(self.reply.header.get("retry_after_ms", 0.0)) if self.reply else 0.0


class DeadlineExceeded(EdgedError):
    status = Status.DEADLINE_EXCEEDED


class Unavailable(EdgedError):
    status = Status.UNAVAILABLE


class Internal(EdgedError):
    status = Status.INTERNAL


class NoReply(EdgedError):
    """No reply came within the client's timeout (the daemon may be gone or stuck)."""


ERRORS: dict[Status, type[EdgedError]] = {
    cls.status: cls for cls in (InvalidArgument, NotFound, Overloaded, DeadlineExceeded, Unavailable, Internal)
}


def raise_for_status(reply: Reply) -> Reply:
    """The reply itself when OK; else the exception of its status."""
    if reply.status is not Status.OK:
        raise ERRORS[reply.status](f"{reply.status.value}: {reply.error}", reply)
    return reply
