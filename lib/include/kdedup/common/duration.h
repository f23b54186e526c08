#pragma once
// Durations as people write them in flags and config: "500ms", "30s",
// "10m", "24h", "7d" (an integer and one unit, no spaces).

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "kdedup/common/result.h"

namespace kdedup {

/// Parses a duration into milliseconds. Returns an error naming the text when
/// it is empty, has no unit or an unknown one, is zero or negative, or
/// overflows 64-bit milliseconds.
[[nodiscard]] Result<std::int64_t> parse_duration_ms(std::string_view text);

/// Formats milliseconds with the largest unit that divides them exactly
/// ("90s" stays "90s", 3600000 becomes "1h").
[[nodiscard]] std::string format_duration_ms(std::int64_t ms);

}  // namespace kdedup
