#include "config/flags.h"

namespace strata::config {

const std::vector<TrainFlag>& train_flags() {
  // Names after the first are the Hugging Face TrainingArguments spellings, so a Trainer command
  // line carries over.
  static const std::vector<TrainFlag> flags = {
      {"--model",
       "DIR",
       FlagKind::kText,
       {{"strata.model.path"}},
       "Hugging Face model directory (config.json + safetensors) to train; same as --set "
       "strata.model.path=DIR"},
      {"--data",
       "FILE",
       FlagKind::kText,
       {{"strata.data.path"}},
       "training data: a token file (.bin) or a text file; same as --set strata.data.path=FILE "
       "(the source follows the extension unless strata.data.source says)"},
      {"--output-dir,--output_dir",
       "DIR",
       FlagKind::kText,
       {{"strata.output_dir"}},
       "where metrics, checkpoints and the final model go (strata.output_dir)"},
      {"--steps,--max-steps,--max_steps",
       "N",
       FlagKind::kWhole,
       {{"strata.train_steps"}},
       "optimizer steps to train (strata.train_steps)"},
      {"--lr,--learning-rate,--learning_rate",
       "LR",
       FlagKind::kNumber,
       {{"optimizer.params.lr"}, {"scheduler.params.warmup_max_lr", "", FlagWhen::kWarmupMaxLr}},
       "peak learning rate (optimizer.params.lr, and the scheduler's warmup_max_lr when it has "
       "one)"},
      {"--weight-decay,--weight_decay",
       "WD",
       FlagKind::kNumber,
       {{"optimizer.params.weight_decay"}},
       "weight decay (optimizer.params.weight_decay)"},
      {"--max-grad-norm,--max_grad_norm",
       "NORM",
       FlagKind::kNumber,
       {{"gradient_clipping"}},
       "clip the global gradient norm to this; 0 = off (gradient_clipping)"},
      {"--warmup-steps,--warmup_steps",
       "N",
       FlagKind::kWhole,
       {{"scheduler.params.warmup_num_steps"}},
       "learning-rate warm-up steps (scheduler.params.warmup_num_steps)"},
      {"--micro-batch-size,--per-device-train-batch-size,--per_device_train_batch_size",
       "N",
       FlagKind::kWhole,
       {{"train_micro_batch_size_per_gpu"}},
       "samples per rank per forward/backward (train_micro_batch_size_per_gpu)"},
      {"--grad-accum,--gradient-accumulation-steps,--gradient_accumulation_steps",
       "N",
       FlagKind::kWhole,
       {{"gradient_accumulation_steps"}},
       "micro-batches accumulated per step (gradient_accumulation_steps)"},
      {"--seq-len,--max-seq-length,--max_seq_length",
       "N",
       FlagKind::kWhole,
       {{"strata.data.seq_len"}},
       "tokens per sample (strata.data.seq_len)"},
      {"--seed", "N", FlagKind::kWhole, {{"strata.seed"}}, "random seed (strata.seed)"},
      {"--bf16",
       "",
       FlagKind::kSwitch,
       {{"bf16.enabled", "true"}, {"fp16.enabled", "false"}},
       "train in bf16 (bf16.enabled=true, fp16.enabled=false)"},
      {"--fp16",
       "",
       FlagKind::kSwitch,
       {{"fp16.enabled", "true"}, {"bf16.enabled", "false"}},
       "train in fp16 with loss scaling (fp16.enabled=true, bf16.enabled=false)"},
      {"--fp32",
       "",
       FlagKind::kSwitch,
       {{"fp16.enabled", "false"}, {"bf16.enabled", "false"}},
       "train in fp32 (fp16.enabled=false, bf16.enabled=false)"},
      {"--save-steps,--save_steps",
       "N",
       FlagKind::kWhole,
       {{"strata.checkpoint_every_steps"}},
       "checkpoint every N steps; 0 = only at the end (strata.checkpoint_every_steps)"},
      {"--eval-steps,--eval_steps",
       "N",
       FlagKind::kWhole,
       {{"strata.eval_every_steps"}},
       "evaluate every N steps; 0 = only at the end (strata.eval_every_steps)"},
      {"--logging-steps,--logging_steps",
       "N",
       FlagKind::kWhole,
       {{"strata.print_every_steps"}},
       "print progress every N steps; 0 = auto (strata.print_every_steps)"},
      {"--resume-from,--resume-from-checkpoint,--resume_from_checkpoint",
       "DIR",
       FlagKind::kText,
       {{"strata.resume_from"}},
       "resume from this checkpoint directory (strata.resume_from)"},
      {"--trace",
       "FILE",
       FlagKind::kText,
       {{"strata.trace_file"}},
       "write a Chrome/Perfetto trace (compute, copies, NVMe, Adam) to this file "
       "(strata.trace_file)"},
  };
  return flags;
}

std::string_view canonical_name(const TrainFlag& flag) {
  return flag.names.substr(0, flag.names.find(','));
}

const TrainFlag* find_train_flag(std::string_view name) {
  for (const TrainFlag& flag : train_flags()) {
    std::string_view names = flag.names;
    while (!names.empty()) {
      const std::size_t comma = names.find(',');
      if (names.substr(0, comma) == name) return &flag;
      if (comma == std::string_view::npos) break;
      names.remove_prefix(comma + 1);
    }
  }
  return nullptr;
}

}  // namespace strata::config
