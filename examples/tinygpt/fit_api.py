"""TinyGPT through raydist's Python API: the same job as `tinygpt.yaml`, from Python. From examples/:

    python -m tinygpt.fit_api                                        # the embedded local Ray instance
    ray job submit --working-dir . -- python -m tinygpt.fit_api      # a Ray cluster (`eval "$(raydist env)"` first)

`raydist.fit` returns the job's typed summary (the fields of summary.json).
"""

import argparse

import raydist
from tinygpt.data import make_datasets
from tinygpt.model import make_model

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--storage", default="~/raydist_runs", help="run.storage_path: shared by every node")
    args = parser.parse_args()
    summary = raydist.fit(
        "local_sgd",
        model=make_model,
        model_args={"width": 64, "layers": 2},
        data=make_datasets,
        data_args={"samples": 4096},
        train={"max_steps": args.steps, "batch_size": 32},
        local_sgd={"sync_every": 4},
        run={"storage_path": args.storage},
    )
    print(
        f"{summary.status}: {summary.steps} steps on {summary.ray}, test next-token accuracy "
        f"{summary.test_accuracy:.3f}, {summary.wall_s:.1f} s; {summary.run_dir}"
    )
