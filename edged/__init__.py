"""edged: a latency-first inference daemon for one GPU (or CPU) box, served over ZeroMQ."""

__version__ = "0.1.0"
