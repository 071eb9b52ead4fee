"""The Python API: `raydist.fit(...)` runs the same job as `jobs/<name>.py` and returns its typed summary;
`raydist.tune(...)` sweeps a strategy's settings as `jobs/tune.py` does.

    import raydist
    from mypkg.nets import make_model
    from mypkg.data import make_datasets

    summary = raydist.fit("local_sgd", model=make_model, model_args={"width": 256}, data=make_datasets,
                          train={"max_steps": 1000}, scaling={"num_workers": 4})

From a notebook or a script, on the embedded local Ray instance or on the cluster RAY_ADDRESS names (as under
`ray job submit`). docs/your-code.md.
"""

from __future__ import annotations

import importlib
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from raydist import registry
from raydist.config import Config, job_defaults, named
from raydist.errors import UsageError
from raydist.typedconfig import apply, merge

Code = str | Callable | None
"""An import path 'package.module:function', or a function or class the workers can import by its module."""


def fit(
    strategy: str,
    *,
    model: Code = None,
    model_args: dict[str, Any] | None = None,
    data: Code = None,
    data_args: dict[str, Any] | None = None,
    loss: Code = None,
    config: str | Path | Iterable[str | Path] = (),
    **sections: dict[str, Any],
) -> Any:
    """Run `strategy` (a registry name, `raydist.registry.jobs()`: each strategy, and compare) and return its summary.

    model, data, loss: your factories (`model.factory`, `data.factory`, `train.loss`), their keyword arguments in
    model_args and data_args. config: YAML file(s) merged over the job's defaults, as `--config`. Every other
    keyword is a config section as a mapping, as `--set`: `train={"max_steps": 100}`. Raises a `RaydistError`
    (a `UsageError` for bad input) with the one line the job scripts print."""
    from raydist.versions import check_versions

    check_versions()
    cfg = config_for(
        strategy,
        model=model,
        model_args=model_args,
        data=data,
        data_args=data_args,
        loss=loss,
        config=config,
        sections=sections,
    )
    import ray

    from raydist.job import run_job

    ours = not ray.is_initialized()
    try:
        return run_job(strategy, cfg, time.perf_counter())
    finally:
        if ours and ray.is_initialized():
            from raydist.driver.ending import end_local

            end_local()  # a second fit() in the same notebook starts its own instance again


def tune(
    strategy: str,
    *,
    space: dict[str, str],
    num_samples: int | None = None,
    metric: str | None = None,
    **arguments: Any,
) -> Any:
    """Sweep `strategy`'s settings with Ray Tune, as `jobs/tune.py` does, and return the sweep's summary (best
    trial, its values, best.yaml's path). space: config key -> distribution, `{"optim.lr": "loguniform(1e-4, 1e-1)"}`
    (docs/tune.md). Every other argument is `fit`'s: your model and data, config files, sections (`tune={...}` for
    the rest of the tune section)."""
    own = {"strategy": strategy, "space": space, "num_samples": num_samples, "metric": metric}
    section = {**arguments.pop("tune", {}), **{k: v for k, v in own.items() if v is not None}}
    return fit("tune", tune=section, **arguments)


def config_for(
    strategy: str,
    *,
    model: Code,
    model_args: dict[str, Any] | None,
    data: Code,
    data_args: dict[str, Any] | None,
    loss: Code,
    config: str | Path | Iterable[str | Path],
    sections: dict[str, dict[str, Any]],
) -> Config:
    """The validated config `fit` runs: the job's defaults, `config`, the sections, then the code arguments."""
    if strategy not in registry.jobs():
        raise UsageError(f"unknown strategy {strategy!r} (choose from {', '.join(registry.jobs())})")
    files = [config] if isinstance(config, (str, Path)) else list(config)
    cfg = merge(Config(), ([d] if (d := job_defaults(strategy)) else []) + files)
    for name, values in sections.items():
        if not isinstance(values, dict):
            raise UsageError(f"{name}=: give a config section as a mapping, e.g. train={{'max_steps': 100}}")
        apply(cfg, {name: values})
    code = {
        "model": {"factory": import_path_of(model, "model"), "args": model_args},
        "data": {"factory": import_path_of(data, "data"), "args": data_args},
        "train": {"loss": import_path_of(loss, "loss")},
    }
    apply(cfg, {section: {k: v for k, v in values.items() if v is not None} for section, values in code.items()})
    return named(cfg, strategy)


def import_path_of(code: Code, what: str) -> str | None:
    """'package.module:name' for `code`, checked to import back to the same object (the workers import it so)."""
    if code is None or isinstance(code, str):
        return code
    if not callable(code):
        raise UsageError(
            f"{what}=: give a function or class, or its import path 'package.module:name' (got a {type(code).__name__})"
        )
    module, qualname = _module_of(code), getattr(code, "__qualname__", "")
    target: Any = importlib.import_module(module) if module else None
    for part in qualname.split("."):
        target = getattr(target, part, None)
    if not module or "<" in qualname or target is not code:
        raise UsageError(
            f"{what}={getattr(code, '__name__', code)!r}: the workers import your code by module, and "
            f"this one cannot be imported back (defined in a notebook, or inside a function): put it in "
            f"a .py module and import it from there"
        )
    return f"{module}:{qualname}"


def _module_of(code: Callable) -> str:
    """The module a worker imports `code` from: a script's __main__ by the name it has on sys.path."""
    module = getattr(code, "__module__", "") or ""
    if module != "__main__":
        return module
    main = sys.modules["__main__"]
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name:  # python -m package.module
        return spec.name
    path = getattr(main, "__file__", None)  # python script.py: Ray puts its directory on the workers' sys.path
    return Path(path).stem if path else ""
