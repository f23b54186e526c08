// The process's memory budget and the log lines of its pressure changes.

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <string>

#include "kdedup/common/byte_size.h"
#include "kdedup/filter/memory_budget.h"
#include "kdedup/pipeline/pipeline.h"

namespace kdedup::pipeline {

std::shared_ptr<filter::MemoryBudget> make_memory_budget(const config::Config& config) {
  filter::MemoryBudget::Options o;
  o.max_bytes = config.memory.max_bytes;
  o.fpp = config.filter.fpp;
  // One line per change of level, on the worker thread that changed it
  // (changes are rare: each needs the filters to have seen the last one).
  o.on_change = [fpp = config.filter.fpp,
                 min_bytes = config.filter.min_bytes](const filter::MemoryBudget::Change& c) {
    const double effective = filter::effective_fpp(fpp, c.scale);
    if (c.unmet) {
      // The fpp cannot rise further: the budget is too small for what the
      // partitions hold whatever their fpp. Said once, each time it starts.
      const std::uint64_t floors = min_bytes * c.filters;
      const std::string why =
          floors > c.max_bytes
              ? fmt::format(
                    "each holds at least filter.min_bytes ({} bytes, {} together): raise "
                    "memory.max_bytes or lower filter.min_bytes",
                    min_bytes, format_bytes(floors))
              : std::string("raise memory.max_bytes, or spread the partitions over more instances");
      spdlog::warn(
          "memory budget: even at effective fpp {:g} the {} partitions' filters need {}, "
          "more than memory.max_bytes ({}): {}",
          effective, c.filters, format_bytes(c.demand), format_bytes(c.max_bytes), why);
    } else if (c.level > c.previous) {
      spdlog::warn(
          "memory budget: the filters need more than memory.max_bytes ({} reserved of "
          "{}): effective fpp raised to {:g} (filter.fpp {:g}) on every partition",
          format_bytes(c.used), format_bytes(c.max_bytes), effective, fpp);
    } else if (c.level > 0) {
      spdlog::info("memory budget: {} reserved of {}: effective fpp lowered to {:g}",
                   format_bytes(c.used), format_bytes(c.max_bytes), effective);
    } else {
      spdlog::info(
          "memory budget: back within memory.max_bytes ({} reserved of {}): "
          "every partition sizes for filter.fpp {:g} again",
          format_bytes(c.used), format_bytes(c.max_bytes), fpp);
    }
  };
  return std::make_shared<filter::MemoryBudget>(std::move(o));
}

}  // namespace kdedup::pipeline
