#pragma once
// Partition lists as people read them in a log line: "in[0-255], orders[3,7]"
// (grouped by topic, consecutive numbers as ranges, sorted), so a line stays
// short with a thousand partitions. Used by every module that logs sets of
// partitions (pipeline assignments and commits, the snapshot store).

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kdedup {

/// (topic, partition) pairs in any order, duplicates allowed; "" when empty.
[[nodiscard]] std::string summarize_partitions(
    std::vector<std::pair<std::string, std::int32_t>> partitions);

}  // namespace kdedup
