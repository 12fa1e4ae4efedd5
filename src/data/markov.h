// The synthetic source: a seeded random Markov chain over `vocab` states in which every state
// has exactly `branching` distinct successors, each taken with probability 1/branching. The
// successors of s are tau((rho(s) + d_j) mod V) for random permutations tau, rho and distinct
// offsets d_1..d_k, so every state also has exactly k predecessors: the transition matrix is
// doubly stochastic, the uniform distribution is stationary, and the entropy rate is exactly
// ln(branching) nats per token. Sequences start in a uniformly random state, so every target
// token of every sample has conditional entropy ln(branching) given the previous token: no model
// can beat that mean loss, and a perfect one reaches it.
#pragma once

#include <cstdint>
#include <vector>

namespace strata::data {

class MarkovChain {
 public:
  MarkovChain(std::int64_t vocab, std::int64_t branching, std::uint64_t seed);

  // Writes `length` tokens of sequence number `index` of stream `stream` (each (stream, index)
  // pair is its own deterministic random sequence).
  void sequence(std::uint64_t stream, std::uint64_t index, std::int64_t length,
                std::int32_t* out) const;
  // The j-th successor of state s.
  std::int32_t successor(std::int32_t s, std::int64_t j) const;
  // ln(branching).
  double entropy_nats() const;
  std::int64_t vocab() const { return vocab_; }
  std::int64_t branching() const { return branching_; }

 private:
  std::int64_t vocab_;
  std::int64_t branching_;
  std::uint64_t seed_;
  std::vector<std::int32_t> successors_;  // vocab x branching
};

// A uniform integer in [0, n) from a splitmix64 stream, without modulo bias (Lemire's method).
std::uint64_t uniform_below(std::uint64_t& state, std::uint64_t n);
std::uint64_t splitmix64_next(std::uint64_t& state);

}  // namespace strata::data
