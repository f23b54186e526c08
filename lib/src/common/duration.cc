#include "kdedup/common/duration.h"

#include <array>
#include <charconv>
#include <limits>
#include <utility>

namespace kdedup {
namespace {

constexpr std::array<std::pair<std::string_view, std::int64_t>, 5> kUnits{{
    {"ms", 1},
    {"s", 1000},
    {"m", 60'000},
    {"h", 3'600'000},
    {"d", 86'400'000},
}};

}  // namespace

Result<std::int64_t> parse_duration_ms(std::string_view text) {
  const std::string quoted = "'" + std::string(text) + "'";
  std::size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  if (digits == 0) {
    return fail(quoted + " is not a duration (expected e.g. 500ms, 30s, 10m, 24h, 7d)");
  }
  std::int64_t value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + digits, value);
  if (ec != std::errc() || ptr != text.data() + digits) {
    return fail(quoted + " is too large a duration");
  }
  const std::string_view unit = text.substr(digits);
  for (const auto& [name, factor] : kUnits) {
    if (unit != name) continue;
    if (value == 0) return fail(quoted + " must be greater than zero");
    if (value > std::numeric_limits<std::int64_t>::max() / factor) {
      return fail(quoted + " is too large a duration");
    }
    return value * factor;
  }
  if (unit.empty()) return fail(quoted + " has no unit (use ms, s, m, h or d)");
  return fail(quoted + " has an unknown unit '" + std::string(unit) + "' (use ms, s, m, h or d)");
}

std::string format_duration_ms(std::int64_t ms) {
  for (auto it = kUnits.rbegin(); it != kUnits.rend(); ++it) {
    if (ms != 0 && ms % it->second == 0) {
      return std::to_string(ms / it->second) + std::string(it->first);
    }
  }
  return std::to_string(ms) + "ms";
}

}  // namespace kdedup
