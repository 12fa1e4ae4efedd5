// GPT-2 style random initialisation (see init.h).
#include "model/init.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace strata::model {
namespace {

std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Uniform in (0, 1): 53 random bits, never 0.
double uniform(std::uint64_t& state) {
  return (static_cast<double>(splitmix64(state) >> 11) + 0.5) * 0x1.0p-53;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

void init_unit(const ModelShape& spec, const UnitLayout& unit, std::uint64_t seed, float* params) {
  std::fill(params, params + unit.padded_numel, 0.0f);
  const double std_dev = 0.02;
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(spec.num_layers));
  for (std::size_t t = 0; t < unit.tensors.size(); ++t) {
    const TensorSlot& slot = unit.tensors[t];
    float* out = params + slot.offset;
    const std::string& name = slot.name;
    const bool is_norm = name.find("ln_") != std::string::npos ||
                         name.find("layernorm") != std::string::npos ||
                         name.find(".norm.") != std::string::npos ||
                         ends_with(name, "_norm.weight");  // Qwen3's q_norm, k_norm
    if (ends_with(name, ".bias")) continue;                // zeros
    if (is_norm) {
      std::fill(out, out + slot.numel, 1.0f);
      continue;
    }
    const bool residual = ends_with(name, "attn.c_proj.weight") ||
                          ends_with(name, "mlp.c_proj.weight") ||
                          ends_with(name, "o_proj.weight") || ends_with(name, "down_proj.weight");
    const double sigma = residual ? residual_std : std_dev;
    std::uint64_t state = seed ^ (0x5bd1e995ull * (static_cast<std::uint64_t>(unit.index) + 1)) ^
                          (0xc2b2ae3d27d4eb4full * (t + 1));
    splitmix64(state);
    for (std::int64_t i = 0; i < slot.numel; i += 2) {
      // Box-Muller: two normals per pair of uniforms.
      const double r = std::sqrt(-2.0 * std::log(uniform(state)));
      const double a = 2.0 * M_PI * uniform(state);
      out[i] = static_cast<float>(sigma * r * std::cos(a));
      if (i + 1 < slot.numel) out[i + 1] = static_cast<float>(sigma * r * std::sin(a));
    }
  }
}

}  // namespace strata::model
