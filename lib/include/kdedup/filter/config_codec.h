#pragma once
// Binary encoding of FilterConfig inside serialized filter state, shared by
// every filter type so a restored filter always carries its exact config.

#include "kdedup/common/bytes.h"
#include "kdedup/filter/sliding_filter.h"

namespace kdedup::filter {

void write_config(ByteWriter& w, const FilterConfig& config);

/// Reads and re-validates a config (normalize()); corrupted fields are errors.
[[nodiscard]] Result<FilterConfig> read_config(ByteReader& r);

}  // namespace kdedup::filter
