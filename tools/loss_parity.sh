#!/usr/bin/env bash
# Loss parity of the compressed optimizer state (docs/benchmarks.md, "Compressed optimizer
# state"): fine-tunes nothing pre-trained, but trains a Llama-shaped model of 10.1M parameters
# from scratch on ~4 MB of real English text (the Python documentation's reST sources, Debian's
# python3-doc) with a byte-level BPE tokenizer of 8192 tokens trained on that text, once per
# choice of strata.optimizer_state, the same seed and data order, and prints one JSON line per
# run (final train loss as the mean of the last 20 steps, validation loss) and their ratio to the
# fp32 run. Needs python3-doc (apt-get install python3-doc) and tools/data_venv.sh's environment.
# Usage: tools/loss_parity.sh [WORK_DIR] [STEPS]   (default strata_out/loss-parity, 300 steps)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
work="${1:-$root/strata_out/loss-parity}"
steps="${2:-300}"
strata="${STRATA_BIN:-$root/build/strata}"
sources=/usr/share/doc/python3-dev/html/_sources
if [ ! -d "$sources" ]; then
  echo "loss_parity: $sources is missing: apt-get install python3-doc" >&2
  exit 1
fi
python="$(bash "$root/tools/data_venv.sh")"
mkdir -p "$work/model"
# ~4 MB of text: the tutorial, HOWTOs, language reference, FAQ and the library reference's
# first files in name order.
if [ ! -f "$work/corpus.txt" ]; then
  find "$sources/tutorial" "$sources/howto" "$sources/reference" "$sources/faq" "$sources/library" \
    -name '*.txt' | sort | xargs cat > "$work/corpus.full.txt"
  head -c 4000000 "$work/corpus.full.txt" > "$work/corpus.txt"
  rm -f "$work/corpus.full.txt"
fi
if [ ! -f "$work/model/tokenizer.json" ]; then
  "$python" - "$work" <<'EOF'
import json, sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
work = sys.argv[1]
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=8192, special_tokens=["<|endoftext|>"],
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
tok.train([f"{work}/corpus.txt"], trainer)
tok.save(f"{work}/model/tokenizer.json")
json.dump({"eos_token": "<|endoftext|>", "bos_token": None},
          open(f"{work}/model/tokenizer_config.json", "w"))
json.dump({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 8192,
           "hidden_size": 320, "intermediate_size": 864, "num_hidden_layers": 6,
           "num_attention_heads": 5, "num_key_value_heads": 5, "max_position_embeddings": 512,
           "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True,
           "hidden_act": "silu"}, open(f"{work}/model/config.json", "w"), indent=1)
EOF
fi
if [ ! -f "$work/data/train.bin" ]; then
  bash "$root/tools/prepare_data.sh" --model "$work/model" --input "$work/corpus.txt" \
    --output "$work/data" --text-docs paragraph --val-fraction 0.02 >&2
fi
run() {  # name, optimizer_state JSON
  local name="$1" state="$2" out="$work/run-$1"
  rm -rf "$out"
  cat > "$work/$name.json" <<EOF
{"bf16": {"enabled": true},
 "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "gradient_clipping": 1.0,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95], "weight_decay": 0.1}},
 "scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 30, "total_num_steps": $steps}},
 "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
 "strata": {"output_dir": "$out", "train_steps": $steps, "seed": 1, "eval_batches": 32,
   "optimizer_state": $state,
   "model": {"path": "$work/model/config.json"},
   "data": {"source": "tokens", "path": "$work/data/train.bin", "val_path": "$work/data/val.bin",
            "seq_len": 128}}}
EOF
  "$strata" train --config "$work/$name.json" --quiet > "$work/$name.out"
  "$python" - "$name" "$out" "$work/$name.out" <<'EOF'
import json, sys
name, out, summary = sys.argv[1:]
lines = [json.loads(l) for l in open(f"{out}/metrics.jsonl")]
losses = [l["loss"] for l in lines if "loss" in l and "step" in l]
evals = [l["eval_loss"] for l in lines if "eval_loss" in l]
print(json.dumps({"run": name, "steps": len(losses), "first_loss": losses[0],
                  "final_loss": sum(losses[-20:]) / len(losses[-20:]),
                  "eval_loss": evals[-1] if evals else None}))
EOF
}
results="$work/results.jsonl"
# LOSS_PARITY_RUNS picks runs (e.g. "moments_8bit all_compressed"); the others' rows are kept.
runs="${LOSS_PARITY_RUNS:-fp32 moments_bf16 moments_8bit moments_8bit_grads_bf16 all_compressed}"
touch "$results"
for name in $runs; do
  case "$name" in
    fp32) state='{}' ;;
    moments_bf16) state='{"moments": "bf16"}' ;;
    moments_8bit) state='{"moments": "8bit"}' ;;
    moments_8bit_grads_bf16) state='{"moments": "8bit", "gradients": "bf16"}' ;;
    all_compressed) state='{"moments": "8bit", "master": "bf16", "gradients": "bf16"}' ;;
    *) echo "loss_parity: unknown run '$name' in LOSS_PARITY_RUNS" >&2; exit 2 ;;
  esac
  row="$(run "$name" "$state")"
  echo "$row"
  grep -v "\"run\": \"$name\"" "$results" > "$results.tmp" || true
  echo "$row" >> "$results.tmp"
  mv "$results.tmp" "$results"
done
"$python" - "$results" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
base = next((r for r in rows if r["run"] == "fp32"), None)
if base is None:
    sys.exit("loss_parity: no fp32 run to compare with (run it: LOSS_PARITY_RUNS=fp32)")
for r in rows:
    r["final_vs_fp32"] = r["final_loss"] / base["final_loss"]
    if r["eval_loss"] is not None and base["eval_loss"]:
        r["eval_vs_fp32"] = r["eval_loss"] / base["eval_loss"]
print(json.dumps({"loss_parity": rows}, indent=1))
EOF
