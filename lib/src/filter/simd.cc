#include "kdedup/filter/simd.h"

#include <atomic>

namespace kdedup::filter {
namespace {

Simd detect() noexcept {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  const bool base = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi") &&
                    __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("popcnt");
  if (base && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) {
    return Simd::kAvx512;
  }
  if (base) return Simd::kAvx2;
#endif
  return Simd::kPortable;
}

std::atomic<Simd>& level() noexcept {
  static std::atomic<Simd> current{detect()};
  return current;
}

}  // namespace

Simd simd_supported() noexcept {
  static const Simd best = detect();
  return best;
}

Simd simd_in_use() noexcept { return level().load(std::memory_order_relaxed); }

Simd set_simd(Simd wanted) noexcept {
  const Simd best = simd_supported();
  const Simd use =
      static_cast<std::uint8_t>(wanted) <= static_cast<std::uint8_t>(best) ? wanted : best;
  level().store(use, std::memory_order_relaxed);
  return use;
}

std::string_view to_string(Simd s) noexcept {
  switch (s) {
    case Simd::kAvx512:
      return "avx512";
    case Simd::kAvx2:
      return "avx2";
    case Simd::kPortable:
      break;
  }
  return "portable";
}

std::optional<Simd> simd_from_string(std::string_view name) noexcept {
  for (const Simd s : {Simd::kPortable, Simd::kAvx2, Simd::kAvx512}) {
    if (name == to_string(s)) return s;
  }
  return std::nullopt;
}

}  // namespace kdedup::filter
