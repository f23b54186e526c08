#pragma once
// Partitions and positions as log lines read them: one short line whatever
// the number of partitions (STYLE.md: "Log lines summarise").

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kdedup/pipeline/slice.h"

namespace kdedup::pipeline {

/// "in[0-255]" (or "(none)"): a partition list that stays one short line.
[[nodiscard]] std::string join_partitions(const std::vector<PartitionId>& ids);

/// Final positions for a log line: each one while there are few, else the
/// partitions as ranges and the span of the offsets (every position is in
/// the debug log).
[[nodiscard]] std::string describe_positions(const std::map<PartitionId, std::int64_t>& positions);

}  // namespace kdedup::pipeline
