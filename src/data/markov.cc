// The synthetic Markov chain (see markov.h).
#include "data/markov.h"

#include <cmath>
#include <numeric>

#include "common/assert.h"

namespace strata::data {

std::uint64_t splitmix64_next(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

std::uint64_t uniform_below(std::uint64_t& state, std::uint64_t n) {
  STRATA_ASSERT(n > 0);
  unsigned __int128 m = static_cast<unsigned __int128>(splitmix64_next(state)) * n;
  auto low = static_cast<std::uint64_t>(m);
  if (low < n) {
    const std::uint64_t threshold = (0 - n) % n;
    while (low < threshold) {
      m = static_cast<unsigned __int128>(splitmix64_next(state)) * n;
      low = static_cast<std::uint64_t>(m);
    }
  }
  return static_cast<std::uint64_t>(m >> 64);
}

namespace {

std::vector<std::int32_t> permutation(std::int64_t n, std::uint64_t& state) {
  std::vector<std::int32_t> p(static_cast<std::size_t>(n));
  std::iota(p.begin(), p.end(), 0);
  for (std::int64_t i = n - 1; i > 0; --i) {
    const auto j =
        static_cast<std::int64_t>(uniform_below(state, static_cast<std::uint64_t>(i + 1)));
    std::swap(p[static_cast<std::size_t>(i)], p[static_cast<std::size_t>(j)]);
  }
  return p;
}

}  // namespace

MarkovChain::MarkovChain(std::int64_t vocab, std::int64_t branching, std::uint64_t seed)
    : vocab_(vocab), branching_(branching), seed_(seed) {
  STRATA_ASSERT(vocab >= 2 && branching >= 1 && branching <= vocab);
  std::uint64_t state = seed ^ 0x6d61726b6f76ull;  // "markov"
  const std::vector<std::int32_t> tau = permutation(vocab, state);
  const std::vector<std::int32_t> rho = permutation(vocab, state);
  const std::vector<std::int32_t> offsets = permutation(vocab, state);  // first k are distinct
  successors_.resize(static_cast<std::size_t>(vocab * branching));
  for (std::int64_t s = 0; s < vocab; ++s) {
    for (std::int64_t j = 0; j < branching; ++j) {
      const std::int64_t shifted =
          (rho[static_cast<std::size_t>(s)] + offsets[static_cast<std::size_t>(j)]) % vocab;
      successors_[static_cast<std::size_t>(s * branching + j)] =
          tau[static_cast<std::size_t>(shifted)];
    }
  }
}

std::int32_t MarkovChain::successor(std::int32_t s, std::int64_t j) const {
  return successors_[static_cast<std::size_t>(s * branching_ + j)];
}

double MarkovChain::entropy_nats() const {
  return std::log(static_cast<double>(branching_));
}

void MarkovChain::sequence(std::uint64_t stream, std::uint64_t index, std::int64_t length,
                           std::int32_t* out) const {
  std::uint64_t state = seed_ ^ (0x9e3779b97f4a7c15ull * (stream + 1));
  state ^= splitmix64_next(state) + index * 0xd1b54a32d192ed03ull;
  splitmix64_next(state);
  auto s = static_cast<std::int32_t>(uniform_below(state, static_cast<std::uint64_t>(vocab_)));
  for (std::int64_t i = 0; i < length; ++i) {
    out[i] = s;
    s = successor(
        s, static_cast<std::int64_t>(uniform_below(state, static_cast<std::uint64_t>(branching_))));
  }
}

}  // namespace strata::data
