"""Your code, named by import path in the config (`model.factory`, `data.factory`, `train.loss`): found, called and
checked here. The workers call the same functions; `check_user_code` calls them once on the driver, on CPU,
before Ray starts, so that a factory that cannot work is one line and exit 2 (docs/your-code.md)."""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import sys
from collections.abc import Callable
from typing import Any

from raydist.errors import ConfigError


def resolve(path: str, key: str) -> Callable:
    """The callable at 'package.module:attribute'; every way that fails is one ConfigError naming `key`."""
    module_name, _, attribute = path.partition(":")
    if "" not in sys.path and os.getcwd() not in sys.path:
        # Your package where you run the job, as `python -m` would find it (Ray gives the workers this directory).
        sys.path.append(os.getcwd())
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as e:  # the user's module may raise anything while it imports
        raise ConfigError(f"{key}={path}: cannot import {module_name}: {type(e).__name__}: {_first_line(e)}") from None
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ConfigError(f"{key}={path}: {module_name} has no attribute {attribute!r}")
        target = getattr(target, part)
    if not callable(target):
        raise ConfigError(f"{key}={path}: is a {type(target).__name__}, not a function or class to call")
    return target


def call(path: str, key: str, args: dict[str, Any], **offered: Any) -> Any:
    """Call the factory with `args` as keyword arguments, plus each of `offered` its signature names."""
    fn = resolve(path, key)
    try:
        params = inspect.signature(fn).parameters
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    except (TypeError, ValueError):  # a builtin without a signature
        params, takes_any = {}, True
    extra = {name: value for name, value in offered.items() if name in params or takes_any}
    try:
        return fn(**args, **extra)
    except Exception as e:
        raise ConfigError(f"{key}={path}: calling it failed: {type(e).__name__}: {_first_line(e)}") from None


def _first_line(e: BaseException) -> str:
    return next((ln for ln in str(e).splitlines() if ln.strip()), "").strip()


def user_datasets(path: str, args: dict[str, Any]) -> tuple[Any, Any]:
    """data.factory's (train, test): two map-style datasets (`len` and indexing) of (input tensor, target) pairs."""
    import torch

    got = call(path, "data.factory", args)
    if not (isinstance(got, (tuple, list)) and len(got) == 2):
        raise ConfigError(f"data.factory={path}: must return (train, test), two Datasets; got {_kind(got)}")
    for name, ds in zip(("train", "test"), got):
        if not (hasattr(ds, "__len__") and hasattr(ds, "__getitem__")):
            raise ConfigError(
                f"data.factory={path}: its {name} set is a {_kind(ds)}, not a map-style Dataset (len() and indexing)"
            )
        if len(ds) == 0:
            raise ConfigError(f"data.factory={path}: its {name} set is empty")
        sample = ds[0]
        if not (isinstance(sample, (tuple, list)) and len(sample) == 2 and isinstance(sample[0], torch.Tensor)):
            raise ConfigError(
                f"data.factory={path}: each {name} sample must be an (input tensor, target) pair; "
                f"sample 0 is {_kind(sample)}"
            )
    return got[0], got[1]


def user_model(path: str, args: dict[str, Any], data: Any) -> Any:
    """model.factory's module."""
    import torch

    got = call(path, "model.factory", args, data=data)
    if not isinstance(got, torch.nn.Module):
        raise ConfigError(f"model.factory={path}: must return a torch.nn.Module; got {_kind(got)}")
    return got


def _kind(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    return f"a {type(value).__module__}.{type(value).__qualname__}".replace("builtins.", "")


def cross_entropy(output, target):
    """The default loss: cross-entropy of the output's last dimension (class scores) against integer targets; a
    sequence model's [batch, tokens, vocabulary] scores are scored per token."""
    import torch.nn.functional as F

    return F.cross_entropy(
        output.flatten(0, -2) if output.dim() > 2 else output, target.flatten() if output.dim() > 2 else target
    )


@functools.cache
def loss_function(path: str) -> Callable:
    """train.loss's function, or `cross_entropy`."""
    return resolve(path, "train.loss") if path else cross_entropy
