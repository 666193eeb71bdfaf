"""The daemon's figures for scrapers: the Prometheus endpoint, on a thread of its own."""
