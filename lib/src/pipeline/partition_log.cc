// Partition lists and positions for log lines (partition_log.h).

#include "partition_log.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "kdedup/common/partitions.h"

namespace kdedup::pipeline {

std::string join_partitions(const std::vector<PartitionId>& ids) {
  std::vector<std::pair<std::string, std::int32_t>> parts;
  parts.reserve(ids.size());
  for (const auto& id : ids) parts.emplace_back(id.topic, id.partition);
  std::string out = summarize_partitions(std::move(parts));
  return out.empty() ? "(none)" : out;
}

std::string describe_positions(const std::map<PartitionId, std::int64_t>& positions) {
  constexpr std::size_t kListed = 8;
  std::string out;
  if (positions.size() <= kListed) {
    for (const auto& [id, offset] : positions) {
      out += (out.empty() ? "" : ", ") + id.str() + "@" + std::to_string(offset);
    }
    return out;
  }
  std::vector<PartitionId> ids;
  std::int64_t lo = INT64_MAX, hi = INT64_MIN;
  for (const auto& [id, offset] : positions) {
    ids.push_back(id);
    lo = std::min(lo, offset);
    hi = std::max(hi, offset);
  }
  std::string all;
  for (const auto& [id, offset] : positions) {
    all += (all.empty() ? "" : ", ") + id.str() + "@" + std::to_string(offset);
  }
  spdlog::debug("positions: {}", all);
  return fmt::format("{} partitions {} at offsets {}..{}", positions.size(), join_partitions(ids),
                     lo, hi);
}

}  // namespace kdedup::pipeline
