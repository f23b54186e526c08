#include "kdedup/common/byte_size.h"

#include <fmt/format.h>

namespace kdedup {

std::string format_bytes(std::uint64_t bytes) {
  const auto b = static_cast<double>(bytes);
  if (bytes < 1024) return fmt::format("{} B", bytes);
  if (bytes < (1ULL << 20)) return fmt::format("{:.1f} KiB", b / 1024.0);
  if (bytes < (1ULL << 30)) return fmt::format("{:.1f} MiB", b / 1048576.0);
  return fmt::format("{:.2f} GiB", b / 1073741824.0);
}

}  // namespace kdedup
