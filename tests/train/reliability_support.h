// Shared by the reliability tests of `strata train` as users run it: a tiny Llama config with a
// constant learning rate (so a run's result does not depend on train_steps, and a run stopped at
// any step and resumed to N steps must equal an uninterrupted N-step run bit for bit), and runs
// under /bin/sh so that a test can signal or kill the trainer at a chosen moment ($$ is the
// trainer's pid after `exec`).
#pragma once

#include <gtest/gtest.h>
#include <json/json.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "support/run_strata.h"

namespace strata::testing {

inline std::string reliability_config(const std::string& out, int steps,
                                      const std::string& extra_strata = "") {
  return R"({"bf16": {"enabled": true},
    "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
    "gradient_clipping": 1.0,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "weight_decay": 0.1}},
    "strata": {"output_dir": ")" +
         out + R"(", "train_steps": )" + std::to_string(steps) +
         R"(, "seed": 7, "cpu_threads": 1,
      "device_bytes_max": "256MiB", "host_bytes_max": "256MiB", "eval_batches": 1,)" +
         extra_strata + R"(
      "model": {"family": "llama", "vocab_size": 64, "max_seq_len": 32, "hidden_size": 32,
                "num_layers": 2, "num_heads": 4, "num_kv_heads": 2},
      "data": {"source": "synthetic", "seq_len": 16, "synthetic_vocab_size": 64,
               "synthetic_branching": 3}}})";
}

// `strata train` of `config` with `extra` arguments.
inline RunOutput train_with(const std::string& config, const std::vector<std::string>& extra = {},
                            const std::vector<std::string>& env = {}) {
  std::vector<std::string> args = {"train", "--config", config, "--quiet"};
  args.insert(args.end(), extra.begin(), extra.end());
  return run_strata(args, env, 300);
}

// Runs `before; exec strata ARGS` under /bin/sh (before may start background work that signals
// $$, the trainer once exec'd).
inline RunOutput sh_then_strata(const std::string& before, const std::vector<std::string>& args,
                                const std::vector<std::string>& env = {}) {
  std::string command = before + " exec " + std::string(STRATA_BINARY);
  for (const std::string& a : args)
    command += " '" + a + "'";
  return run_program("/bin/sh", {"-c", command}, env, 300);
}

// Shell that waits (at most ~60 s) until `out`/metrics.jsonl has a line for step `step`, then
// sends `signals` (e.g. "-TERM" or "-INT; kill -INT") to $$, in the background.
inline std::string signal_after_step(const std::string& out, int step, const std::string& kill) {
  return "( i=0; while ! grep -q '\"step\":" + std::to_string(step) + "[,}]' '" + out +
         "/metrics.jsonl' 2>/dev/null && [ $i -lt 6000 ]; do sleep 0.01; i=$((i+1)); done; " +
         "kill " + kill + " ) & ";
}

// Byte-for-byte equality of two files (not printed when they differ).
inline bool same_bytes(const std::string& a, const std::string& b) {
  const std::string x = read_file(a), y = read_file(b);
  return !x.empty() && x == y;
}

// step -> loss of every step line of `out`/metrics.jsonl (every line must parse).
inline std::map<int, double> losses_of(const std::string& out) {
  std::ifstream in(out + "/metrics.jsonl");
  std::map<int, double> losses;
  std::string line;
  while (std::getline(in, line)) {
    const Json::Value v = parse_json(line);
    if (v.isMember("loss")) {
      EXPECT_EQ(losses.count(v["step"].asInt()), 0u) << "step " << v["step"] << " twice";
      losses[v["step"].asInt()] = v["loss"].asDouble();
    }
  }
  return losses;
}

// The step `latest` of `out`'s checkpoint root names, or -1.
inline int latest_step(const std::string& out) {
  std::ifstream in(out + "/checkpoints/latest");
  std::string name;
  if (!(in >> name) || name.size() < 6) return -1;
  return std::stoi(name.substr(5));
}

}  // namespace strata::testing
