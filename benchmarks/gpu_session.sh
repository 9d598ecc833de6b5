#!/usr/bin/env bash
# One call of a lent GPU machine (the device tool): carry .whl (pydantic, zuko and their needs as
# cp312 wheels; the machine has no registry). Results land in $OUT. Most important first: every
# method end to end on CUDA, then the yardstick in each precision, uneven step counts, sampled
# evaluation at scale, the sequential yardstick and the trainers. Each step has its own limit, so
# a slow one costs only itself; the whole fits a call of about 9 minutes.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())" | tee -a "$OUT/gpu.txt"
b() { timeout "$1" python3 -m cflpipe bench --device cuda --threads 1 "${@:2}"; }
timeout 190 python3 benchmarks/gpu_check.py --device cuda --output "$OUT/gpu_check.json"
b 80 --part yardstick --trainer batched --rounds 200 --precision float32 --precision tf32 --precision bf16 \
  --output "$OUT/yardstick_batched.json"
b 60 --part steps --repeats 2 --output "$OUT/steps.json"
b 80 --part scale --repeats 1 --clients 1000 --method fedavg --method kmeans_cfl --limit-s 30 --output "$OUT/scale.json"
b 45 --part yardstick --trainer sequential --rounds 40 --output "$OUT/yardstick_sequential.json"
b 90 --part trainers --repeats 1 --output "$OUT/trainers.json"
