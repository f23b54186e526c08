#pragma once
// Load-balance figures across an instance's slices (seed 000 §7, Fig. 5(b)
// and 5(c)): Jain's fairness index and the largest share of the load.

#include <span>

namespace kdedup::metrics {

/// Jain's fairness index (Σx)² / (S·Σx²) over the per-slice loads `x`
/// (records in one interval). 1 means perfectly even, 1/S means one slice got
/// everything. With no slices or no load at all the split is vacuously even
/// and the result is 1. Negative loads are treated as 0.
[[nodiscard]] double jain_fairness(std::span<const double> loads) noexcept;

/// max x_i / Σx: the share of the load taken by the busiest slice; the
/// optimum is 1/S. Returns 0 with no slices or no load.
[[nodiscard]] double max_share(std::span<const double> loads) noexcept;

}  // namespace kdedup::metrics
