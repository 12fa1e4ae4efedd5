// What a training run reports: one JSON object per line in <output_dir>/metrics.jsonl (a step
// line every log_every_steps steps, an eval line per evaluation, and a final summary line), and
// a progress bar on stderr when it is a terminal (plain lines every steps_per_print steps when it
// is not).
#pragma once

#include <json/json.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "common/status.h"

namespace strata::train {

class MetricsLog {
 public:
  MetricsLog() = default;
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  // Opens `path` for writing: truncated for a fresh run (`resumed_step` -1); when resuming from
  // the checkpoint of `resumed_step`, appended to after a repair: a torn last line (a crash or a
  // full disk mid-write) and the lines of steps after `resumed_step` (trained again now) go.
  Status open(const std::string& path, std::int64_t resumed_step);
  // Writes one compact JSON line and flushes it.
  Status write(const Json::Value& line);
  // One compact line of JSON, as written.
  static std::string to_line(const Json::Value& value);

 private:
  std::FILE* file_ = nullptr;
  std::string path_;
};

class Progress {
 public:
  // `tty` true draws a bar that redraws in place; false prints a line every `print_every` steps.
  Progress(std::int64_t total_steps, bool tty, std::int64_t print_every);
  // `extra` is appended to the line (e.g. compute wait and peak bytes per tier).
  void step(std::int64_t step, double loss, double lr, double tokens_per_s, bool skipped,
            const std::string& extra = {});
  // A message on its own line (the bar is redrawn after it).
  void note(const std::string& message);
  void finish();

 private:
  std::int64_t total_;
  bool tty_;
  std::int64_t print_every_;
  bool drawn_ = false;
};

}  // namespace strata::train
