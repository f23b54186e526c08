#include "kdedup/filter/tick_scale.h"

#include <cstdio>

#include "kdedup/common/bytes.h"

namespace kdedup::filter {

Result<TickScale> TickScale::make(std::int64_t window_ms, std::uint32_t ticks_per_window) {
  if (window_ms <= 0)
    return fail("window must be positive, got " + std::to_string(window_ms) + " ms");
  if (ticks_per_window == 0) return fail("ticks_per_window must be at least 1");
  return TickScale(window_ms, ticks_per_window);
}

std::int64_t TickScale::start_ms(Tick t) const noexcept {
  __extension__ using Wide = unsigned __int128;
  const Wide scaled = static_cast<Wide>(t) * static_cast<Wide>(window_ms_);
  return static_cast<std::int64_t>((scaled + ticks_ - 1) / ticks_);
}

std::string TickScale::describe_tick() const {
  if (window_ms_ % ticks_ == 0) return std::to_string(window_ms_ / ticks_) + "ms";
  char text[32];
  std::snprintf(text, sizeof text, "%.3fms", tick_ms());
  return text;
}

std::uint64_t TickScale::fingerprint() const noexcept {
  std::string bytes;
  ByteWriter w(bytes);
  w.put<std::int64_t>(window_ms_);
  w.put<std::uint32_t>(ticks_);
  w.put<std::uint32_t>(kMappingVersion);
  return hash64(bytes, 0x7469636b73ULL);
}

}  // namespace kdedup::filter
