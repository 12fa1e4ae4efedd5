// The names of the configuration's enumerations as they are written in JSON, and the DeepSpeed
// values Strata refuses, with the reason (config/schema.h uses them for its choices).
#pragma once

#include <string_view>
#include <utility>
#include <vector>

#include "config/config.h"

namespace strata::config {

template <typename E>
using EnumNames = std::vector<std::pair<E, std::string_view>>;
// DeepSpeed values of a choice that Strata refuses: (name, why).
using Refusals = std::vector<std::pair<std::string_view, std::string_view>>;

inline const EnumNames<OffloadDevice>& offload_device_names() {
  static const EnumNames<OffloadDevice> names = {
      {OffloadDevice::kNone, "none"}, {OffloadDevice::kCpu, "cpu"}, {OffloadDevice::kNvme, "nvme"}};
  return names;
}
inline const EnumNames<OptimizerType>& optimizer_type_names() {
  static const EnumNames<OptimizerType> names = {{OptimizerType::kAdam, "Adam"},
                                                 {OptimizerType::kAdamW, "AdamW"}};
  return names;
}
inline const Refusals& refused_optimizer_types() {
  static const Refusals refusals = {
      {"OneBitAdam",
       "1-bit Adam compresses the gradient exchange to one bit per element after a warm-up, "
       "which changes the update"},
      {"ZeroOneAdam", "0/1 Adam skips and compresses updates, which changes the arithmetic"},
      {"OneBitLamb", "1-bit LAMB compresses the gradient exchange, which changes the update"},
      {"Lamb", "LAMB scales each layer's update by its trust ratio; Strata has no LAMB"},
      {"Lion", "Lion is a different update rule; Strata has no Lion"},
      {"Adagrad", "Adagrad is a different update rule; Strata has no Adagrad"},
      {"Muon", "Muon orthogonalises the update; Strata has no Muon"},
      {"MuAdam", "muP's MuAdam rescales learning rates per layer; Strata has no muP"},
      {"MuAdamW", "muP's MuAdamW rescales learning rates per layer; Strata has no muP"},
      {"MuSGD", "muP's MuSGD is SGD; Strata has no SGD"},
      {"SGD", "SGD is a different update rule; Strata has no SGD"}};
  return refusals;
}
inline const EnumNames<SchedulerType>& scheduler_type_names() {
  static const EnumNames<SchedulerType> names = {
      {SchedulerType::kNone, "none"},
      {SchedulerType::kWarmupLR, "WarmupLR"},
      {SchedulerType::kWarmupDecayLR, "WarmupDecayLR"},
      {SchedulerType::kWarmupCosineLR, "WarmupCosineLR"}};
  return names;
}
inline const Refusals& refused_scheduler_types() {
  static const Refusals refusals = {
      {"OneCycle", "the 1-cycle schedule (with momentum cycling) is not implemented"},
      {"LRRangeTest", "the learning-rate range test is not implemented"}};
  return refusals;
}
inline const EnumNames<WarmupType>& warmup_type_names() {
  static const EnumNames<WarmupType> names = {{WarmupType::kLog, "log"},
                                              {WarmupType::kLinear, "linear"}};
  return names;
}
inline const EnumNames<Backend>& backend_names() {
  static const EnumNames<Backend> names = {
      {Backend::kAuto, "auto"}, {Backend::kCpu, "cpu"}, {Backend::kCuda, "cuda"}};
  return names;
}
// The names and the list are the format's own (common/state_format.h), so the configuration and
// the kernels cannot disagree on them.
inline const EnumNames<MomentFormat>& moment_format_names() {
  static const EnumNames<MomentFormat> names = [] {
    EnumNames<MomentFormat> all;
    for (MomentFormat format : kMomentFormats)
      all.emplace_back(format, to_string(format));
    return all;
  }();
  return names;
}

// The types master weights and gradients may be stored in: fp32 or bf16 (not fp16).
inline const EnumNames<DType>& state_dtype_names() {
  static const EnumNames<DType> names = {{DType::kF32, to_string(DType::kF32)},
                                         {DType::kBF16, to_string(DType::kBF16)}};
  return names;
}

inline const EnumNames<DeviceOptimizer>& device_optimizer_names() {
  static const EnumNames<DeviceOptimizer> names = {{DeviceOptimizer::kAuto, "auto"},
                                                   {DeviceOptimizer::kOn, "on"},
                                                   {DeviceOptimizer::kOff, "off"}};
  return names;
}

inline const EnumNames<GradientSum>& gradient_sum_names() {
  static const EnumNames<GradientSum> names = {{GradientSum::kOrdered, "ordered"},
                                               {GradientSum::kBackend, "backend"}};
  return names;
}

inline const EnumNames<GemmPrecision>& gemm_precision_names() {
  static const EnumNames<GemmPrecision> names = {{GemmPrecision::kAuto, "auto"},
                                                 {GemmPrecision::kFp32, "fp32"},
                                                 {GemmPrecision::kTf32, "tf32"},
                                                 {GemmPrecision::kBf16, "bf16"},
                                                 {GemmPrecision::kFp16, "fp16"}};
  return names;
}
inline const EnumNames<ModelFamily>& model_family_names() {
  static const EnumNames<ModelFamily> names = {{ModelFamily::kGpt2, "gpt2"},
                                               {ModelFamily::kLlama, "llama"}};
  return names;
}
inline const EnumNames<DataSource>& data_source_names() {
  static const EnumNames<DataSource> names = {{DataSource::kSynthetic, "synthetic"},
                                              {DataSource::kTokens, "tokens"},
                                              {DataSource::kText, "text"}};
  return names;
}

}  // namespace strata::config
