"""The benchmarks, each run from the repository root as `python -m benchmarks.<name>` (its docstring opens with the
command); stored.py holds what each stores and its shared options."""
