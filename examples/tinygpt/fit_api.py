"""TinyGPT through raydist's Python API: the same job as `tinygpt.yaml`, from Python. From examples/:

    python -m tinygpt.fit_api                         # the embedded local Ray instance
    ray job submit --working-dir . -- python -m tinygpt.fit_api   # a Ray cluster (`eval "$(raydist env)"` first)

`raydist.fit` returns the job's typed summary (the fields of summary.json).
"""

import raydist
from tinygpt.data import make_datasets
from tinygpt.model import make_model

if __name__ == "__main__":
    summary = raydist.fit(
        "local_sgd",
        model=make_model, model_args={"width": 64, "layers": 2},
        data=make_datasets, data_args={"samples": 4096},
        train={"max_steps": 300, "batch_size": 32},
        local_sgd={"sync_every": 4},
    )
    print(f"{summary.status}: {summary.steps} steps, test next-token accuracy {summary.test_accuracy:.3f}, "
          f"{summary.wall_s:.1f} s; {summary.run_dir}")
