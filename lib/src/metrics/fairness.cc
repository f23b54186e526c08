#include "kdedup/metrics/fairness.h"

#include <algorithm>

namespace kdedup::metrics {

double jain_fairness(std::span<const double> loads) noexcept {
  double sum = 0.0, sum_sq = 0.0;
  for (double x : loads) {
    x = std::max(x, 0.0);
    sum += x;
    sum_sq += x * x;
  }
  if (loads.empty() || sum_sq <= 0.0) return 1.0;
  return (sum * sum) / (static_cast<double>(loads.size()) * sum_sq);
}

double max_share(std::span<const double> loads) noexcept {
  double sum = 0.0, top = 0.0;
  for (double x : loads) {
    x = std::max(x, 0.0);
    sum += x;
    top = std::max(top, x);
  }
  return sum > 0.0 ? top / sum : 0.0;
}

}  // namespace kdedup::metrics
