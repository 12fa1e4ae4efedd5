// Finite-difference gradient checking for the double-precision kernels: a scalar loss
// L = sum_i weight_i * out_i, its analytic gradient from a backward kernel, and central
// differences of L compared element by element.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace strata::testing {

inline std::vector<double> random_vector(std::size_t n, std::uint64_t seed, double lo = -1.0,
                                         double hi = 1.0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(n);
  for (double& x : v)
    x = dist(rng);
  return v;
}

inline double weighted_sum(const std::vector<double>& out, const std::vector<double>& weight) {
  double s = 0.0;
  for (std::size_t i = 0; i < out.size(); ++i)
    s += out[i] * weight[i];
  return s;
}

// Compares analytic[i] with (loss(x + h e_i) - loss(x - h e_i)) / 2h for `samples` indices of x
// (all of them when samples >= x.size()), chosen with a fixed seed. `x` is restored.
inline void expect_gradient_matches(const std::string& what, std::vector<double>& x,
                                    const std::vector<double>& analytic,
                                    const std::function<double()>& loss, double tolerance = 1e-7,
                                    std::size_t samples = 400, double h = 1e-5) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  std::vector<std::size_t> indices;
  if (samples >= x.size()) {
    for (std::size_t i = 0; i < x.size(); ++i)
      indices.push_back(i);
  } else {
    std::mt19937_64 rng(42);
    std::uniform_int_distribution<std::size_t> pick(0, x.size() - 1);
    for (std::size_t s = 0; s < samples; ++s)
      indices.push_back(pick(rng));
  }
  int failures = 0;
  for (std::size_t i : indices) {
    const double saved = x[i];
    x[i] = saved + h;
    const double plus = loss();
    x[i] = saved - h;
    const double minus = loss();
    x[i] = saved;
    const double numeric = (plus - minus) / (2 * h);
    ASSERT_FALSE(std::isnan(analytic[i])) << what << "[" << i << "] is NaN";
    const double error = std::abs(numeric - analytic[i]);
    if (error > tolerance * (1.0 + std::abs(numeric)) && ++failures <= 5) {
      ADD_FAILURE() << what << "[" << i << "]: analytic " << analytic[i] << " numeric " << numeric
                    << " error " << error;
    }
  }
  EXPECT_EQ(failures, 0) << what << ": " << failures << " of " << indices.size()
                         << " elements differ";
}

}  // namespace strata::testing
