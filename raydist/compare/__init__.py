"""jobs/compare.py: several strategies on one setting, side by side (results.json, results.md, plot.png).

`runner.py` runs them, `checks.py` refuses bad settings before the first one starts, `config.py` is its section.
"""
