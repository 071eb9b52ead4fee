import time, os, sys
t0 = time.time()
import torch, torch.distributed as dist
t1 = time.time()
dist.init_process_group("gloo", rank=int(os.environ.get("SLURM_PROCID", os.environ.get("RANK", 0))), world_size=int(os.environ.get("SLURM_NTASKS", os.environ.get("WORLD_SIZE", 1))))
t2 = time.time()
x = torch.ones(1000); dist.all_reduce(x)
t3 = time.time()
print(f"step 1 OMP={os.environ.get('OMP_NUM_THREADS')} threads={torch.get_num_threads()} import={t1-t0:.2f} init={t2-t1:.2f} ar={t3-t2:.2f} start_unix={t0:.2f}", flush=True)
dist.barrier(); dist.destroy_process_group()
