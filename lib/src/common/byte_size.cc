#include "kdedup/common/byte_size.h"

#include <fmt/format.h>

#include <cmath>

namespace kdedup {

std::string format_bytes(std::uint64_t bytes) {
  const auto b = static_cast<double>(bytes);
  if (bytes < 1024) return fmt::format("{} B", bytes);
  // A unit is left once the count, rounded to one decimal, reaches 1024 of
  // it: 2^20 - 1 bytes read "1.0 MiB", not "1024.0 KiB".
  const auto below_1024 = [](double x) { return std::round(x * 10.0) < 10240.0; };
  if (below_1024(b / 1024.0)) return fmt::format("{:.1f} KiB", b / 1024.0);
  if (below_1024(b / 1048576.0)) return fmt::format("{:.1f} MiB", b / 1048576.0);
  return fmt::format("{:.2f} GiB", b / 1073741824.0);
}

}  // namespace kdedup
