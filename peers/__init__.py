"""Reference implementations of nets in other frameworks, for tests and benchmarks.

Each peer imports its framework inside functions only: torch (and friends) are test/bench extras,
never runtime dependencies of the toolkit.
"""
