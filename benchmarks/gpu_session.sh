#!/usr/bin/env bash
# One call of a lent GPU machine (the device tool): carry .whl (pydantic, zuko and their needs as
# cp312 wheels; the machine has no registry). Results land in $OUT. Most important first: every
# method end to end on CUDA, then the yardstick, the trainers and model application.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())" | tee -a "$OUT/gpu.txt"
timeout 240 python3 benchmarks/gpu_check.py --device cuda --output "$OUT/gpu_check.json"
timeout 75 python3 -m cflpipe bench --part yardstick --device cuda --trainer sequential --rounds 60 --threads 1 \
  --output "$OUT/yardstick_sequential.json"
timeout 90 python3 -m cflpipe bench --part yardstick --device cuda --trainer batched --rounds 200 --threads 1 \
  --output "$OUT/yardstick_batched.json"
timeout 120 python3 -m cflpipe bench --part trainers --device cuda --repeats 1 --threads 1 --output "$OUT/trainers.json"
timeout 50 python3 -m cflpipe bench --part apply --device cuda --repeats 2 --threads 1 --output "$OUT/apply.json"
