"""libgpushare-cuda.so against the fake driver (tests/fakecuda), one process per case."""
