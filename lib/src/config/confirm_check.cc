// The semantic check of filter.confirm_store (confirm_check.h).

#include "confirm_check.h"

namespace kdedup::config {

std::vector<std::string> confirm_store_problems(const Config& c) {
  std::vector<std::string> out;
  if (!c.confirm_store) return out;
  if (!c.filter_enabled) {
    out.emplace_back(
        "needs a filter: with filter.enabled: false every record is distinct and there is "
        "nothing to confirm");
  } else if (c.filter.type == filter::FilterType::kExact) {
    out.emplace_back(
        "the exact filter has no false positives to confirm; use filter.type timer, aging or "
        "compact with confirm_store, or the exact filter alone");
  }
  if (c.state.dir.empty()) {
    out.emplace_back(
        "needs state.dir: the confirm store lives in <state.dir>/confirm and travels with the "
        "snapshots; set state.dir to a persistent volume or remove confirm_store");
  }
  return out;
}

}  // namespace kdedup::config
