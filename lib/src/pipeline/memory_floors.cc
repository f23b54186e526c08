// The assigned partitions' floors against the memory budget
// (memory_floors.h).

#include "memory_floors.h"

#include <spdlog/spdlog.h>

#include <cstdint>

#include "kdedup/common/byte_size.h"
#include "kdedup/filter/memory_budget.h"

namespace kdedup::pipeline {

bool warn_if_floors_exceed_budget(const config::Config& config, std::size_t assigned) {
  const std::uint64_t max_bytes = config.memory.max_bytes;
  const std::uint64_t min_bytes = config.filter.min_bytes;
  if (max_bytes == 0 || assigned == 0 || min_bytes * assigned <= max_bytes) return false;
  spdlog::warn(
      "memory budget: the {} assigned partitions need at least filter.min_bytes ({} bytes) "
      "each once they have had a record, {} together, more than memory.max_bytes ({}): past "
      "it every partition's effective fpp rises, up to {:g}; raise memory.max_bytes or lower "
      "filter.min_bytes",
      assigned, min_bytes, format_bytes(min_bytes * assigned), format_bytes(max_bytes),
      filter::kMaxEffectiveFpp);
  return true;
}

}  // namespace kdedup::pipeline
