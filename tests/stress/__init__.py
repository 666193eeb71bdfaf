"""Stress harnesses run beside the tests: the live fuzzer (a short run in
tests/serve/test_fuzz_live.py) and the overload, soak and many-clients scenarios."""
