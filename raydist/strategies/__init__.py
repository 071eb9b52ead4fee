"""Training strategies, one folder each; `raydist.registry` lists them and says where each part of one lives.

A strategy's folder holds what only it knows: its worker (a `raydist.train.Strategy` run by the shared loop) or its
own driver, its config section, its checks before Ray starts, its summary fields and its cost-model terms.
"""
