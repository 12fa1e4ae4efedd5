// Loads a config through the installed libstrata and prints one derived value.
#include <cstdio>

#include "config/config.h"
#include "strata/build_info.h"

int main() {
  auto loaded = strata::config::load_config_text(
      R"({"train_batch_size": 12, "zero_optimization": {"stage": 3}})", "consumer.json", {},
      strata::config::LoadOptions{3});
  if (!loaded.is_ok()) {
    std::fprintf(stderr, "%s\n", loaded.status().to_string().c_str());
    return 1;
  }
  std::printf("strata %s micro_batch=%llu\n", strata::build::kVersion,
              static_cast<unsigned long long>(loaded->config.train_micro_batch_size_per_gpu));
  return 0;
}
