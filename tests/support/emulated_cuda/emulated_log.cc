// Launch counts, kernel families and the casts that feed GEMMs, from the emulated backend's launch
// log (emulated_cuda.h).
#include <algorithm>
#include <string>

#include "tests/support/emulated_cuda/emulated_cuda.h"

namespace strata::testing::emulated_cuda {

std::string kernel_family(const std::string& k) {
  auto has = [&](const char* part) { return k.find(part) != std::string::npos; };
  if (has("gemm")) return "gemm";
  if (has("cast")) return "cast";
  if (has("attention")) return "attention";
  if (has("norm")) return "norm";
  if (has("cross_entropy")) return "loss";
  if (has("adam")) return "adam";
  if (has("embedding")) return "embedding";
  if (has("rope")) return "rope";
  if (has("reduce") || has("column")) return "reduce";
  if (has("gelu") || has("swiglu") || has("add") || has("scale")) return "elementwise";
  return "other";
}

std::int64_t launches_of(const std::vector<std::string>& log, const std::string& kernel) {
  return std::count(log.begin(), log.end(), kernel);
}

std::map<std::string, std::int64_t> launches_by_family(const std::vector<std::string>& log) {
  std::map<std::string, std::int64_t> counts;
  for (const std::string& k : log)
    ++counts[kernel_family(k)];
  return counts;
}

std::int64_t casts_before_gemms(const std::vector<std::string>& log) {
  std::int64_t total = 0;
  std::int64_t run = 0;  // cast kernels since the last kernel of another family
  for (const std::string& k : log) {
    const std::string family = kernel_family(k);
    if (family == "cast") {
      ++run;
      continue;
    }
    if (family == "gemm") total += run;
    run = 0;
  }
  return total;
}

std::map<std::string, std::int64_t> casts_before_gemms_by_kernel(
    const std::vector<std::string>& log) {
  std::map<std::string, std::int64_t> out;
  std::vector<std::string> run;  // cast kernels since the last kernel of another family
  for (const std::string& k : log) {
    const std::string family = kernel_family(k);
    if (family == "cast") {
      run.push_back(k.substr(0, k.find_first_of("<(")));
      continue;
    }
    if (family == "gemm") {
      for (const std::string& name : run)
        ++out[name];
    }
    run.clear();
  }
  return out;
}

std::map<int, std::int64_t> gemms_by_operands_narrowed(const std::vector<std::string>& log) {
  std::map<int, std::int64_t> out;
  int narrowed = 0;  // cast_block_kernel launches since the last kernel of another family
  for (const std::string& k : log) {
    const std::string family = kernel_family(k);
    if (family == "cast") {
      if (k.find("cast_block_kernel") != std::string::npos) ++narrowed;
      continue;
    }
    if (family == "gemm") ++out[narrowed];
    narrowed = 0;
  }
  return out;
}

}  // namespace strata::testing::emulated_cuda
