#include "kdedup/filter/sizing.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <utility>

namespace kdedup::filter::sizing {
namespace {

double log_choose(double n, double r) {
  return std::lgamma(n + 1) - std::lgamma(r + 1) - std::lgamma(n - r + 1);
}

}  // namespace

std::shared_ptr<const BlockedModel> BlockedModel::get(std::uint32_t cells_per_block,
                                                      std::uint32_t k) {
  static std::mutex mu;
  static std::map<std::pair<std::uint32_t, std::uint32_t>, std::shared_ptr<const BlockedModel>>
      cache;
  std::lock_guard lock(mu);
  auto& slot = cache[{cells_per_block, k}];
  if (!slot) slot = std::make_shared<const BlockedModel>(cells_per_block, k);
  return slot;
}

BlockedModel::BlockedModel(std::uint32_t cells_per_block, std::uint32_t k)
    : cells_(cells_per_block), k_(std::clamp<std::uint32_t>(k, 1, cells_per_block)) {
  const std::uint32_t b = cells_;
  // q[x]: P(all k probes hit set cells | x elements in the block), from the
  // exact distribution of the number z of set cells (Markov chain over x).
  lambda_max_ = 2.0 * b;
  const std::uint32_t x_max = 3 * b + 60;  // Poisson(2B) tail beyond this is negligible
  std::vector<double> trans(static_cast<std::size_t>(b + 1) * (k_ + 1), 0.0);
  const double lc_bk = log_choose(b, k_);
  for (std::uint32_t z = 0; z <= b; ++z) {
    for (std::uint32_t j = 0; j <= k_; ++j) {
      if (j > b - z || k_ - j > z) continue;
      trans[z * (k_ + 1) + j] = std::exp(log_choose(b - z, j) + log_choose(z, k_ - j) - lc_bk);
    }
  }
  std::vector<double> hit(b + 1, 0.0);
  for (std::uint32_t z = k_; z <= b; ++z) hit[z] = std::exp(log_choose(z, k_) - lc_bk);
  std::vector<double> q(x_max + 1);
  std::vector<double> dist(b + 1, 0.0), next(b + 1);
  dist[0] = 1.0;
  for (std::uint32_t x = 0; x <= x_max; ++x) {
    double s = 0.0;
    for (std::uint32_t z = 0; z <= b; ++z) s += dist[z] * hit[z];
    q[x] = s;
    std::fill(next.begin(), next.end(), 0.0);
    for (std::uint32_t z = 0; z <= b; ++z) {
      if (dist[z] == 0.0) continue;
      for (std::uint32_t j = 0; j <= k_ && z + j <= b; ++j) {
        next[z + j] += dist[z] * trans[z * (k_ + 1) + j];
      }
    }
    dist.swap(next);
  }
  // Tabulate the Poisson mixture over lambda.
  constexpr std::size_t kPoints = 4096;
  step_ = lambda_max_ / kPoints;
  table_.resize(kPoints + 1);
  for (std::size_t i = 0; i <= kPoints; ++i) {
    const double lambda = static_cast<double>(i) * step_;
    double p = std::exp(-lambda);
    double s = 0.0;
    for (std::uint32_t x = 0; x <= x_max; ++x) {
      s += p * q[x];
      p *= lambda / (x + 1);
    }
    table_[i] = std::min(1.0, s);
    if (i > 0) table_[i] = std::max(table_[i], table_[i - 1]);
  }
}

double BlockedModel::fpp(double lambda) const {
  if (!(lambda > 0.0)) return 0.0;
  if (lambda >= lambda_max_) return table_.back();
  const double pos = lambda / step_;
  const auto i = static_cast<std::size_t>(pos);
  if (i == 0) {
    // fpp grows like lambda^k near zero: interpolate in that shape.
    return table_[1] * std::pow(pos, k_);
  }
  const double frac = pos - static_cast<double>(i);
  const double a = table_[i], b = table_[i + 1];
  if (a > 0.0 && b > 0.0) return std::exp(std::log(a) + frac * (std::log(b) - std::log(a)));
  return a + frac * (b - a);
}

double BlockedModel::lambda_for(double target) const {
  if (!(target > 0.0)) return 0.0;
  if (target >= table_.back()) return lambda_max_;
  // fpp() inverted exactly: the segment of the table that brackets the
  // target (table_[i] <= target < table_[i + 1]), then the segment's own
  // interpolation solved for the target. A filter with more than one
  // sub-filter asks this at every tick; a bisection over fpp() cost 64
  // exp/log rounds a call.
  const auto above = std::upper_bound(table_.begin() + 1, table_.end(), target);
  const auto i = static_cast<std::size_t>(above - table_.begin()) - 1;
  double pos = 0.0;
  if (i == 0) {
    pos = std::pow(target / table_[1], 1.0 / static_cast<double>(k_));
  } else {
    const double a = table_[i], b = table_[i + 1];
    const double frac = a > 0.0 ? (std::log(target) - std::log(a)) / (std::log(b) - std::log(a))
                                : (target - a) / (b - a);
    pos = static_cast<double>(i) + frac;
  }
  double lambda = std::min(pos * step_, lambda_max_);
  // Rounding may leave the solution an ulp or so above the target.
  for (int n = 0; n < 64 && lambda > 0.0 && fpp(lambda) > target; ++n) {
    lambda = std::nextafter(lambda, 0.0);
  }
  return fpp(lambda) <= target ? lambda : bisect(target, lambda);
}

double BlockedModel::bisect(double target, double hi) const {
  double lo = 0.0;
  for (int it = 0; it < 64; ++it) {
    const double mid = 0.5 * (lo + hi);
    if (fpp(mid) <= target) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

Layout choose_layout(std::uint32_t cells_per_block, double target_fpp, std::uint32_t max_k) {
  Layout best;
  for (std::uint32_t k = 1; k <= max_k; ++k) {
    const double lambda = BlockedModel::get(cells_per_block, k)->lambda_for(target_fpp);
    if (lambda > best.elements_per_block) best = Layout{k, lambda};
  }
  return best;
}

}  // namespace kdedup::filter::sizing
