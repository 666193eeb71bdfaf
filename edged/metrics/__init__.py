"""The daemon's figures: how its latencies are kept (histogram), and the Prometheus endpoint that
exports them, on a thread of its own."""
