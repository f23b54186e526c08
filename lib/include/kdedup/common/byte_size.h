#pragma once
// Byte counts as people read them in log lines and reports.

#include <cstdint>
#include <string>

namespace kdedup {

/// "512 B", "96.0 KiB", "1.5 MiB", "2.00 GiB": the largest binary unit the
/// count reaches, once rounded (2^20 - 1 bytes: "1.0 MiB").
[[nodiscard]] std::string format_bytes(std::uint64_t bytes);

}  // namespace kdedup
