"""Load generators: the sweep, the fleet and isolation benchmarks, and a daemon launched for them."""
