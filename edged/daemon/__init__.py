"""The daemon's life: start-up, loading, reloads, drains and stops, steered by one thread."""
