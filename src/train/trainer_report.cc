// What a run reports about itself: the tiers' bytes (in each metrics line) and the summary line
// that ends metrics.jsonl and `strata train`'s output (see trainer.h).
#include <numeric>

#include "train/stop_signal.h"
#include "train/trainer.h"

namespace strata::train {

Json::Value Trainer::memory_json() const {
  Json::Value j(Json::objectValue);
  const offload::TierUsage u = state_->tiers().usage();
  j["device_bytes"] = Json::UInt64(u.bytes_in_use[0]);
  j["host_bytes"] = Json::UInt64(u.bytes_in_use[1]);
  j["nvme_bytes"] = Json::UInt64(u.bytes_in_use[2]);
  j["device_bytes_peak"] = Json::UInt64(u.bytes_peak[0]);
  j["host_bytes_peak"] = Json::UInt64(u.bytes_peak[1]);
  j["nvme_bytes_peak"] = Json::UInt64(u.bytes_peak[2]);
  return j;
}

Json::Value Trainer::summary() const {
  Json::Value j(Json::objectValue);
  j["summary"] = true;
  j["steps"] = Json::Int64(counters_.step);
  const auto& recent = counters_.recent_losses;
  j["final_loss"] = recent.empty()
                        ? Json::Value()
                        : Json::Value(std::accumulate(recent.begin(), recent.end(), 0.0) /
                                      static_cast<double>(recent.size()));
  j["final_loss_steps"] = Json::UInt64(recent.size());
  if (dataset_->entropy_floor()) j["entropy_floor"] = *dataset_->entropy_floor();
  if (last_eval_loss_) j["eval_loss"] = *last_eval_loss_;
  j["tokens"] = Json::Int64(counters_.tokens_seen);
  j["skipped_steps"] = Json::Int64(counters_.skipped_steps);
  j["elapsed_s"] = elapsed_s_;
  const offload::TierUsage u = state_->tiers().usage();
  j["device_bytes_peak"] = Json::UInt64(u.bytes_peak[0]);
  j["host_bytes_peak"] = Json::UInt64(u.bytes_peak[1]);
  j["nvme_bytes_peak"] = Json::UInt64(u.bytes_peak[2]);
  j["device_bytes_max"] = Json::UInt64(u.bytes_max[0]);
  j["host_bytes_max"] = Json::UInt64(u.bytes_max[1]);
  j["nvme_bytes_max"] = Json::UInt64(u.bytes_max[2]);
  j["compute_wait_ms"] = state_->counters().compute_wait_ms;
  if (world_size() > 1) {
    j["world_size"] = world_size();
    const offload::SchedulerStats& st = state_->scheduler().stats();
    j["param_gathers"] = Json::UInt64(st.gathers);  // stage 3: all-gathers of parameter shards
    j["param_gathers_ahead"] = Json::UInt64(st.gathers_ahead);
  }
  if (stopped_ != 0) {
    j["stopped_by"] = stopped_ > 0 ? signal_name(stopped_) : "another rank";
    j["checkpoint"] = last_checkpoint_;
  } else {
    j["final_model"] = config_.strata.output_dir + "/final";
  }
  return j;
}

}  // namespace strata::train
