#!/usr/bin/env python3
"""Asks DeepSpeed's own config classes whether each DeepSpeed config file is accepted.

The oracle for tests/fixtures/ds-configs-public/: it reads each file as DeepSpeed does (hjson),
replaces "auto" the way the Hugging Face Trainer does with its default arguments (the Trainer
never hands "auto" to DeepSpeed), and builds deepspeed.runtime.config.DeepSpeedConfig, which runs
DeepSpeed's pydantic models and its batch-size checks. Prints ACCEPT or REFUSE (with DeepSpeed's
first error line) per file.

Usage (needs a Python environment with deepspeed and torch, e.g. ~/.cache/strata/bench-ds-venv,
which tools/bench_python_adam.sh sets up):
    DS_ACCELERATOR=cpu python tools/ds_config_oracle.py tests/fixtures/ds-configs-public/*/*.json
"""
import json
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import hjson  # noqa: E402  (DeepSpeed's own JSON reader)
from deepspeed.runtime.config import DeepSpeedConfig  # noqa: E402

# The Hugging Face Trainer's values for "auto" with default TrainingArguments (fp16/bf16 off).
TRAINER_VALUES = {
    "train_batch_size": 8,
    "train_micro_batch_size_per_gpu": 8,
    "gradient_accumulation_steps": 1,
    "gradient_clipping": 1.0,
    "lr": 5e-5,
    "betas": [0.9, 0.999],
    "eps": 1e-8,
    "weight_decay": 0.0,
    "enabled": False,
    "warmup_min_lr": 0.0,
    "warmup_max_lr": 5e-5,
    "warmup_num_steps": 0,
    "total_num_steps": 100,
}


def fill_auto(node, key=""):
    if isinstance(node, dict):
        return {k: fill_auto(v, k) for k, v in node.items()}
    if node == "auto":
        return TRAINER_VALUES.get(key, node)
    return node


def main(paths):
    for path in paths:
        try:
            with open(path) as f:
                config = json.loads(json.dumps(hjson.loads(f.read())))
            DeepSpeedConfig(fill_auto(config))
            print(f"ACCEPT {path}")
        except BaseException as e:  # DeepSpeed raises AssertionError, ValueError, pydantic errors
            first = str(e).splitlines()[0] if str(e) else ""
            print(f"REFUSE {path}: {type(e).__name__}: {first}")


if __name__ == "__main__":
    main(sys.argv[1:])
