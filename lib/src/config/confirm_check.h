#pragma once
// Internal: the semantic check of filter.confirm_store (confirmed mode
// confirms a probabilistic filter's duplicates in a store that lives and
// travels with the snapshots in state.dir).

#include <string>
#include <vector>

#include "kdedup/config/config.h"

namespace kdedup::config {

/// What is wrong with `config`'s filter.confirm_store, one complete message
/// each (the key is filter.confirm_store); empty when nothing is.
[[nodiscard]] std::vector<std::string> confirm_store_problems(const Config& config);

}  // namespace kdedup::config
