"""The torch pieces every loop shares (raydist/torchkit/): resumable sample order, LR schedule, checkpoint round
trip, the built-in models' sizes, the digits split."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import TensorDataset

from raydist.config import ScheduleConfig
from raydist.torchkit.checkpoint import Progress, load_state, rng_state, save_state, set_rng_state
from raydist.torchkit.optim import lr_factor
from raydist.torchkit.sampler import ResumableDistributedSampler


def test_sampler_resumes_mid_epoch_with_the_same_order():
    ds = TensorDataset(torch.arange(103))
    full = ResumableDistributedSampler(ds, num_replicas=3, rank=1, shuffle=True, seed=5, drop_last=True)
    full.set_epoch(4)
    order = list(full)
    resumed = ResumableDistributedSampler(ds, num_replicas=3, rank=1, shuffle=True, seed=5, drop_last=True)
    resumed.set_epoch(4, start=10)
    assert list(resumed) == order[10:] and len(resumed) == len(order) - 10
    resumed.set_epoch(5)  # a later epoch starts from its beginning
    assert len(list(resumed)) == len(order)


def test_lr_schedule_warms_up_then_decays_to_the_floor():
    cfg = ScheduleConfig(name="cosine", warmup_steps=10, min_lr_ratio=0.1)
    assert lr_factor(0, 100, cfg) == 0.1 and lr_factor(9, 100, cfg) == 1.0
    assert lr_factor(10, 100, cfg) == 1.0
    assert abs(lr_factor(100, 100, cfg) - 0.1) < 1e-9
    assert lr_factor(55, 100, cfg) < lr_factor(30, 100, cfg)
    assert lr_factor(50, 100, ScheduleConfig(name="constant")) == 1.0


def test_checkpoint_round_trip_restores_rng_and_progress(tmp_path):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    state = rng_state()
    expected = torch.rand(4)
    save_state(
        str(tmp_path), model=model, optimizer=opt, scheduler=sched, progress=Progress(7, 1, 3), rng_per_rank=[state]
    )
    loaded = load_state(str(tmp_path))
    assert loaded["progress"] == Progress(7, 1, 3)
    set_rng_state(loaded["rng_per_rank"][0])
    assert torch.equal(torch.rand(4), expected)


@pytest.mark.parametrize("params", [1_000_000, 10_000_000, 50_000_000])
@pytest.mark.parametrize("depth", [1, 2, 4])
def test_model_params_sizes_the_mlp_within_a_percent(params, depth):
    from raydist.torchkit.model_size import mlp_params, mlp_width

    width = mlp_width(params, 64, 10, depth)
    assert abs(mlp_params(64, 10, width, depth) / params - 1) < 0.01
    assert mlp_params(64, 10, width + 1, depth) > mlp_params(64, 10, width, depth)  # the count grows with width


def test_model_params_builds_that_model_and_is_refused_for_other_models():
    from raydist.config import load_config
    from raydist.errors import ConfigError
    from raydist.torchkit.data import load_splits
    from raydist.torchkit.models import build_model

    cfg = load_config(
        None,
        [],
        [
            "data.name=synthetic",
            "data.synthetic_features=32",
            "data.synthetic_samples=100",
            "model.params=2000000",
            "model.depth=3",
        ],
    )
    model = build_model(cfg.model, load_splits(cfg.data))
    assert abs(sum(p.numel() for p in model.parameters()) / 2_000_000 - 1) < 0.01
    with pytest.raises(ConfigError, match="model.params: sizes the mlp and the transformer only"):
        load_config(None, [], ["model.name=cnn", "model.params=1000000"])


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["model.name=simple"],
        ["model.name=cnn"],
        ["model.name=transformer", "model.hidden=32", "model.depth=1"],
        ["model.params=300000", "model.depth=3"],
        ["data.name=synthetic", "data.synthetic_features=48", "data.synthetic_classes=5", "data.synthetic_samples=200"],
        [
            "data.name=synthetic",
            "data.synthetic_features=64",
            "data.synthetic_samples=200",
            "model.name=transformer",
            "model.params=200000",
            "model.heads=2",
        ],
    ],
)
def test_the_drivers_count_of_a_builtin_model_is_the_built_models(overrides):
    """The driver's checks size a built-in model without torch (raydist.torchkit.model_size, from the data's numpy
    arrays): the same count as the model built from the loaded splits."""
    from raydist.config import load_config
    from raydist.torchkit.data import builtin_arrays, load_splits
    from raydist.torchkit.model_size import builtin_params
    from raydist.torchkit.models import build_model

    cfg = load_config(None, [], overrides)
    arrays = builtin_arrays(cfg.data)
    splits = load_splits(cfg.data)
    built = sum(p.numel() for p in build_model(cfg.model, splits).parameters())
    assert builtin_params(cfg.model, arrays.num_features, arrays.num_classes, arrays.image_shape) == built
    assert (arrays.num_train, arrays.num_features, arrays.num_classes) == (
        len(splits.train),
        splits.num_features,
        splits.num_classes,
    )


@pytest.mark.parametrize("params", [1_000_000, 10_000_000])
def test_the_transformer_is_sized_by_params_and_counted_exactly(params):
    from raydist.config import load_config
    from raydist.torchkit.data import load_splits
    from raydist.torchkit.model_size import transformer_params
    from raydist.torchkit.models import build_model

    cfg = load_config(
        None,
        [],
        [
            "data.name=synthetic",
            "data.synthetic_features=64",
            "data.synthetic_samples=100",
            "model.name=transformer",
            f"model.params={params}",
            "model.depth=4",
        ],
    )
    model = build_model(cfg.model, load_splits(cfg.data))
    count = sum(p.numel() for p in model.parameters())
    assert count == transformer_params(64, 2, 8, model.head.in_features, 4)
    assert abs(count / params - 1) < 0.03 and model.head.in_features % 4 == 0


@pytest.mark.long
def test_the_transformer_learns_digits_from_their_rows():
    from raydist.config import load_config
    from raydist.torchkit.data import load_splits
    from raydist.torchkit.models import build_model

    torch.manual_seed(0)
    cfg = load_config(None, [], ["model.name=transformer", "model.hidden=32", "model.depth=1"])
    data = load_splits(cfg.data)
    model = build_model(cfg.model, data)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    x, y = data.train.tensors
    for _ in range(3):
        for i in range(0, len(x), 32):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[i : i + 32]), y[i : i + 32]).backward()
            opt.step()
    model.eval()
    xt, yt = data.test.tensors
    with torch.no_grad():
        assert (model(xt).argmax(1) == yt).float().mean() > 0.85


def test_the_transformer_refuses_tokens_that_do_not_divide_the_features():
    from raydist.config import load_config
    from raydist.errors import ConfigError

    with pytest.raises(ConfigError, match="model.tokens: must divide the 64 input features into equal tokens"):
        load_config(None, [], ["model.name=transformer", "model.tokens=7"])
    with pytest.raises(ConfigError, match="model.hidden: must be a multiple of model.heads=4"):
        load_config(None, [], ["model.name=transformer", "model.hidden=30"])


@pytest.mark.parametrize("seed,fraction", [(0, 0.2), (1, 0.25), (7, 0.5)])
def test_the_split_is_scikit_learns_without_importing_it(seed, fraction):
    """raydist.torchkit.data reads the digits and splits them itself (scikit-learn's import is ~0.9 s of every worker's
    start-up), with exactly scikit-learn's stratified split, so results stay what they were."""
    import numpy as np
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    from raydist.config import DataConfig
    from raydist.torchkit.data import _digits, _synthetic, stratified_split

    d = load_digits()
    x, y, _ = _digits(DataConfig())
    assert np.array_equal(x, (d.data / 16.0).astype(np.float32)) and np.array_equal(y, d.target)
    for labels in (y, _synthetic(DataConfig(name="synthetic", synthetic_samples=3000, synthetic_classes=7))[1]):
        ours = stratified_split(labels, fraction, seed)
        theirs = train_test_split(np.arange(len(labels)), test_size=fraction, random_state=seed, stratify=labels)
        assert np.array_equal(ours[0], theirs[0]) and np.array_equal(ours[1], theirs[1])
