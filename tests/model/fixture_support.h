// Reading the PyTorch reference fixtures (tools/make_fixtures.py) in tests, and comparing arrays
// with absolute + relative tolerance, failing on NaN and reporting the worst element.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "model/safetensors.h"
#include "support/run_strata.h"

namespace strata::testing {

inline const std::vector<std::string>& fixture_names() {
  static const std::vector<std::string> names = {
      "gpt2_tied",   "gpt2_untied",       "llama_gqa_tied", "llama_gqa_untied",
      "llama3_rope", "llama_linear_rope", "qwen2_tied",     "qwen2_untied_yarn",
      "qwen3",       "mistral_window",    "phi3",           "phi3_partial_longrope"};
  return names;
}

inline std::string fixture_dir(const std::string& name) {
  return source_path("tests/fixtures/models/" + name);
}

struct Fixture {
  std::unique_ptr<model::SafetensorsFile> file;
  std::vector<std::int32_t> tokens;  // B*T+1
  std::int64_t batch = 0;
  std::int64_t seq_len = 0;

  std::vector<float> tensor(const std::string& name) const {
    const model::StTensor* t = file->find(name);
    EXPECT_NE(t, nullptr) << name;
    if (t == nullptr) return {};
    std::vector<float> out(t->numel());
    EXPECT_TRUE(file->read_f32(name, t->shape, out.data()).is_ok()) << name;
    return out;
  }
  double metadata(const std::string& key) const { return std::stod(file->metadata().at(key)); }
};

inline Fixture load_fixture(const std::string& name) {
  Fixture f;
  auto file = model::SafetensorsFile::open(fixture_dir(name) + "/fixture.safetensors");
  EXPECT_TRUE(file.is_ok()) << file.status().to_string();
  f.file = std::make_unique<model::SafetensorsFile>(std::move(file).value());
  const model::StTensor* tokens = f.file->find("tokens");
  EXPECT_NE(tokens, nullptr);
  f.tokens.resize(tokens->numel());
  std::memcpy(f.tokens.data(), f.file->data(*tokens), tokens->numel() * 4);
  f.batch = static_cast<std::int64_t>(f.metadata("batch"));
  f.seq_len = static_cast<std::int64_t>(f.metadata("seq_len"));
  return f;
}

struct Closeness {
  double max_abs_error = 0.0;
  double max_abs_reference = 0.0;
  std::size_t worst = 0;
};

// Checks |got - want| <= atol + rtol * |want| element-wise; NaN fails. Returns the worst error.
inline Closeness expect_close(const std::string& what, const float* got,
                              const std::vector<float>& want, double atol, double rtol) {
  Closeness c;
  int failures = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double g = got[i], w = want[i];
    c.max_abs_reference = std::max(c.max_abs_reference, std::abs(w));
    const double error = std::abs(g - w);
    if (std::isnan(g) || error > atol + rtol * std::abs(w)) {
      if (++failures <= 3) {
        ADD_FAILURE() << what << "[" << i << "]: got " << g << " want " << w << " (error " << error
                      << ")";
      }
    }
    if (!(error <= c.max_abs_error)) {
      c.max_abs_error = error;
      c.worst = i;
    }
  }
  EXPECT_EQ(failures, 0) << what << ": " << failures << " of " << want.size()
                         << " elements outside atol " << atol << " + rtol " << rtol;
  return c;
}

}  // namespace strata::testing
