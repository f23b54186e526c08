#pragma once
// Sizing math for blocked (cache-line) Bloom-style filters.
//
// A blocked filter maps each element to one block of B cells (one 64-byte
// cache line) and sets k distinct cells inside it. Blocks receive a Poisson
// number of elements, so the false-positive probability is not the classic
// (1 - e^{-kn/m})^k but the Poisson mixture over the per-block load
// (Putze, Sanders, Singler 2007, "Cache-, hash- and space-efficient Bloom
// filters"):
//
//   fpp(lambda) = sum_{x >= 0} Pois(x; lambda) * q_k(x)
//
// where lambda = elements per block and q_k(x) is the probability that a
// fresh element's k distinct probes all hit cells already set by x elements
// in its block. q_k is computed exactly: the number z of set cells after x
// elements is a Markov chain (each element sets k distinct cells, j of them
// new with hypergeometric probability C(B-z, j) C(z, k-j) / C(B, k)), and a
// probe of k distinct cells all hits with probability C(z, k) / C(B, k).
// The mixture is tabulated over lambda and inverted numerically to find the
// largest load (and so the fewest cells per element) that meets a target.
//
// Thread-safe: models are immutable and shared through a locked cache.

#include <cstdint>
#include <memory>
#include <vector>

namespace kdedup::filter::sizing {

/// fpp of a blocked filter as a function of the load per block.
class BlockedModel {
 public:
  /// The model for blocks of `cells_per_block` cells and `k` probes; computed
  /// once per process per (cells_per_block, k) and shared.
  static std::shared_ptr<const BlockedModel> get(std::uint32_t cells_per_block, std::uint32_t k);

  BlockedModel(std::uint32_t cells_per_block, std::uint32_t k);

  std::uint32_t cells_per_block() const { return cells_; }
  std::uint32_t k() const { return k_; }

  /// False-positive probability at `lambda` live elements per block.
  [[nodiscard]] double fpp(double lambda) const;

  /// Largest load per block whose fpp does not exceed `target` (0 if none).
  [[nodiscard]] double lambda_for(double target) const;

  /// lambda_for() by bisection of fpp() over [0, hi]: 64 rounds (the
  /// reference the direct solution is tested against).
  [[nodiscard]] double bisect(double target, double hi) const;

 private:
  std::uint32_t cells_;
  std::uint32_t k_;
  double lambda_max_;
  double step_;
  std::vector<double> table_;  // fpp at lambda = i * step_, non-decreasing
};

/// The probe count and load that minimise cells per element at a target.
struct Layout {
  std::uint32_t k = 0;
  double elements_per_block = 0;  ///< lambda at which fpp == target
  [[nodiscard]] double cells_per_element(std::uint32_t cells_per_block) const {
    return cells_per_block / elements_per_block;
  }
};

/// Tries k = 1..max_k and keeps the one with the fewest cells per element.
[[nodiscard]] Layout choose_layout(std::uint32_t cells_per_block, double target_fpp,
                                   std::uint32_t max_k);

}  // namespace kdedup::filter::sizing
