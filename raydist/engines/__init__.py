"""How a loop strategy's workers run: Ray Train (`raytrain`, its trainer, backend and worker function) or plain
processes under `raydist launch`'s loop (`processes`, `process_worker`); both read the loop's `train.result`."""
