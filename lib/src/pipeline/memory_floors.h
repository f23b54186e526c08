#pragma once
// The assigned partitions' floors against the memory budget.

#include <cstddef>

#include "kdedup/config/config.h"

namespace kdedup::pipeline {

/// Warns when `assigned` partitions at their floor (filter.min_bytes each)
/// would hold more than memory.max_bytes; the rebalance calls it once per
/// assignment. A partition makes its filter at its first record, so the
/// budget's own warning comes only once enough of them have had one. True
/// when it warned.
bool warn_if_floors_exceed_budget(const config::Config& config, std::size_t assigned);

}  // namespace kdedup::pipeline
