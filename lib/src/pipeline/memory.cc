// The process's memory budget and the log lines of its pressure changes.

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <string>

#include "kdedup/filter/memory_budget.h"
#include "kdedup/pipeline/pipeline.h"

namespace kdedup::pipeline {
namespace {

/// "96.0 KiB", "1.5 MiB", "2.0 GiB": budgets range from kilobytes (tests,
/// small pods) to gigabytes.
std::string bytes_text(double bytes) {
  constexpr double kKiB = 1024.0;
  if (bytes < kKiB * kKiB) return fmt::format("{:.1f} KiB", bytes / kKiB);
  if (bytes < kKiB * kKiB * kKiB) return fmt::format("{:.1f} MiB", bytes / (kKiB * kKiB));
  return fmt::format("{:.1f} GiB", bytes / (kKiB * kKiB * kKiB));
}

}  // namespace

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
      const double floors = static_cast<double>(min_bytes) * c.filters;
      const std::string why =
          floors > static_cast<double>(c.max_bytes)
              ? fmt::format(
                    "each holds at least filter.min_bytes ({} bytes, {} together): raise "
                    "memory.max_bytes or lower filter.min_bytes",
                    min_bytes, bytes_text(floors))
              : std::string("raise memory.max_bytes, or spread the partitions over more instances");
      spdlog::warn(
          "memory budget: even at effective fpp {:g} the {} partitions' filters need {}, "
          "more than memory.max_bytes ({}): {}",
          effective, c.filters, bytes_text(static_cast<double>(c.demand)),
          bytes_text(static_cast<double>(c.max_bytes)), why);
    } else if (c.level > c.previous) {
      spdlog::warn(
          "memory budget: the filters need more than memory.max_bytes ({} reserved of "
          "{}): effective fpp raised to {:g} (filter.fpp {:g}) on every partition",
          bytes_text(static_cast<double>(c.used)), bytes_text(static_cast<double>(c.max_bytes)),
          effective, fpp);
    } else if (c.level > 0) {
      spdlog::info("memory budget: {} reserved of {}: effective fpp lowered to {:g}",
                   bytes_text(static_cast<double>(c.used)),
                   bytes_text(static_cast<double>(c.max_bytes)), effective);
    } else {
      spdlog::info(
          "memory budget: back within memory.max_bytes ({} reserved of {}): "
          "every partition sizes for filter.fpp {:g} again",
          bytes_text(static_cast<double>(c.used)), bytes_text(static_cast<double>(c.max_bytes)),
          fpp);
    }
  };
  return std::make_shared<filter::MemoryBudget>(std::move(o));
}

}  // namespace kdedup::pipeline
