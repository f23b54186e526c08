#pragma once
// The layout of a timer filter's serialized state, for tests that edit or
// compare parts of it (lib/src/filter/timer_snapshot.cc writes it).

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string_view>

namespace kdedup::filter {

/// Where the growth state (format 4) starts in the payload of a timer
/// filter's state with `subfilters` sub-filters: it ends with the query
/// counts' ring size and ring, and is 69 bytes and 16 per sub-filter before
/// them. Everything before it is the format 3 layout.
inline std::size_t growth_state_at(std::string_view payload, std::size_t subfilters) {
  for (std::uint32_t n = 1; 4 * std::size_t{n} + 4 < payload.size(); ++n) {
    std::uint32_t size = 0;
    std::memcpy(&size, payload.data() + payload.size() - 4 * n - 4, 4);
    if (size == n) return payload.size() - 4 * n - 69 - 16 * subfilters;
  }
  ADD_FAILURE() << "no growth state";
  return 0;
}

}  // namespace kdedup::filter
