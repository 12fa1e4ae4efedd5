// Running tools/prepare_data.py from a test, in the environment tools/setup.sh makes for it
// (tools/data_venv.sh: ${STRATA_DATA_VENV:-~/.cache/strata/data-venv}), and reading the fixture
// that tools/make_data_fixture.py wrote (tests/fixtures/models/llama_bpe).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "model/safetensors.h"
#include "support/run_strata.h"

namespace strata::testing {

// The data venv's python, or "" when tools/setup.sh has not made it.
inline std::string data_python() {
  const char* venv = std::getenv("STRATA_DATA_VENV");
  const char* home = std::getenv("HOME");
  const std::string dir =
      venv != nullptr ? std::string(venv)
                      : std::string(home != nullptr ? home : "/root") + "/.cache/strata/data-venv";
  const std::string python = dir + "/bin/python";
  return ::access(python.c_str(), X_OK) == 0 ? python : std::string();
}

#define STRATA_SKIP_WITHOUT_DATA_VENV()                                                    \
  if (::strata::testing::data_python().empty()) {                                          \
    GTEST_SKIP() << "the data-preparation environment is missing: run tools/setup.sh (or " \
                    "tools/data_venv.sh), which installs it from PyPI";                    \
  }

inline RunOutput prepare_data(const std::vector<std::string>& args, int timeout_s = 120) {
  std::vector<std::string> all = {source_path("tools/prepare_data.py"), "--quiet"};
  all.insert(all.end(), args.begin(), args.end());
  return run_program(data_python(), all, {}, timeout_s);
}

inline std::string bpe_model_dir() {
  return source_path("tests/fixtures/models/llama_bpe");
}
inline std::string sft_jsonl() {
  return source_path("tests/fixtures/data/sft.jsonl");
}

// An int32 tensor of the fixture's sft_reference.safetensors.
inline std::vector<std::int32_t> reference_ints(const std::string& name) {
  auto file = model::SafetensorsFile::open(bpe_model_dir() + "/sft_reference.safetensors");
  EXPECT_TRUE(file.is_ok()) << file.status().to_string();
  if (!file.is_ok()) return {};
  const model::StTensor* t = file->find(name);
  EXPECT_NE(t, nullptr) << name;
  if (t == nullptr) return {};
  std::vector<std::int32_t> out(t->numel());
  std::memcpy(out.data(), file->data(*t), out.size() * 4);
  return out;
}

}  // namespace strata::testing
