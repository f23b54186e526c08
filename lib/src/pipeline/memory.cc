// The process's memory budget and the log lines of its pressure changes.

#include <spdlog/spdlog.h>

#include "kdedup/filter/memory_budget.h"
#include "kdedup/pipeline/pipeline.h"

namespace kdedup::pipeline {

std::shared_ptr<filter::MemoryBudget> make_memory_budget(const config::Config& config) {
  filter::MemoryBudget::Options o;
  o.max_bytes = config.memory.max_bytes;
  o.fpp = config.filter.fpp;
  // One line per change of level, on the worker thread that changed it
  // (changes are rare: each needs the filters to have seen the last one).
  o.on_change = [fpp = config.filter.fpp](const filter::MemoryBudget::Change& c) {
    constexpr double kMiB = 1024.0 * 1024.0;
    const double effective = filter::effective_fpp(fpp, c.scale);
    if (c.level > c.previous) {
      spdlog::warn(
          "memory budget: the filters need more than memory.max_bytes ({:.1f} MiB reserved of "
          "{:.1f} MiB): effective fpp raised to {:g} (filter.fpp {:g}) on every partition",
          static_cast<double>(c.used) / kMiB, static_cast<double>(c.max_bytes) / kMiB, effective,
          fpp);
    } else if (c.level > 0) {
      spdlog::info(
          "memory budget: {:.1f} MiB reserved of {:.1f} MiB: effective fpp lowered to {:g}",
          static_cast<double>(c.used) / kMiB, static_cast<double>(c.max_bytes) / kMiB, effective);
    } else {
      spdlog::info(
          "memory budget: back within memory.max_bytes ({:.1f} MiB reserved of {:.1f} MiB): "
          "every partition sizes for filter.fpp {:g} again",
          static_cast<double>(c.used) / kMiB, static_cast<double>(c.max_bytes) / kMiB, fpp);
    }
  };
  return std::make_shared<filter::MemoryBudget>(std::move(o));
}

}  // namespace kdedup::pipeline
