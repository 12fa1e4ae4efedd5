"""Run by test_shard.py, once under torchrun (2 ranks) and once alone: the Hugging Face Trainer
training a tiny Llama with OffloadAdamW, optimizer state on NVMe, writing the logged losses and
the final weights.

    shard_trainer_run.py OUT NVME_DIR GRADIENT_ACCUMULATION_STEPS

Under torchrun the Trainer wraps the model in DDP, which averages the gradients over the ranks,
so the optimizer is told gradients="averaged" and shards its state over the ranks (stage 2).
Batches are taken in order (a SequentialSampler): with 2 ranks, step k trains on batches 2k and
2k+1, one per rank, as one process accumulating 2 micro-batches does."""
import gc
import json
import os
import sys

import torch
import torch.distributed as dist
import transformers

from strata.torch import OffloadAdamW


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n):
        gen = torch.Generator().manual_seed(2)
        self.ids = torch.randint(0, 128, (n, 16), generator=gen)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class InOrder(transformers.Trainer):
    def _get_train_sampler(self, *args, **kwargs):
        return torch.utils.data.SequentialSampler(self.train_dataset)


def main(out, nvme, accumulation):
    distributed = "RANK" in os.environ
    args = transformers.TrainingArguments(
        output_dir=out + ".trainer", max_steps=4, per_device_train_batch_size=4,
        learning_rate=1e-3, logging_steps=1, report_to="none", use_cpu=True, seed=0,
        data_seed=0, dataloader_num_workers=0, disable_tqdm=True, save_strategy="no",
        gradient_accumulation_steps=accumulation, max_grad_norm=0.0)
    assert args.device.type == "cpu"  # sets up torch.distributed under torchrun
    rank = dist.get_rank() if distributed else 0
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))
    config = {"zero_optimization": {"stage": 2, "offload_optimizer": {
        "device": "nvme", "nvme_path": os.path.join(nvme, f"rank{rank}")}}}
    opt = OffloadAdamW(model.parameters(), lr=1e-3, config=config, unit_elements=4096,
                       process_group=dist.group.WORLD if distributed else None,
                       gradients="averaged" if distributed else "local")
    trainer = InOrder(model=model, args=args, train_dataset=Tokens(64), optimizers=(opt, None))
    trainer.train()
    summary = opt.summary()
    opt.close()
    if rank == 0:
        losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
        with open(out + ".json", "w") as f:
            json.dump({"losses": losses, "nvme_bytes": summary["bytes"]["nvme"],
                       "ranks": summary["ranks"]}, f)
        torch.save(model.state_dict(), out + ".pt")
    if distributed:
        # The run's objects (the Trainer's DDP wrapper, the optimizer) go before the process group,
        # and the group before the interpreter's exit: a gloo group left to be destroyed during
        # finalization can abort the process ("terminate called without an active exception").
        del trainer, opt, model
        gc.collect()  # and the reference cycles among them, which hold the group (bench_shard.py)
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
