"""Helpers the tests share, and the benchmarks too: imported as `tests.support.<module>` from the repository root
(pytest puts it on sys.path: pyproject.toml's `pythonpath`; benchmarks run as `python -m benchmarks.<name>` from it)."""
