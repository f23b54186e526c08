#pragma once
// Which vector instructions the filters' batch paths use.
//
// Every filter has a portable batch path (plain C++ and 16-byte vectors,
// which every x86-64 and ARM64 CPU runs). On x86-64 CPUs with AVX2 or
// AVX-512 (F and BW), the timer filter with 8-bit timers tests a whole
// 64-byte line in a few instructions and writes its k cells at once (a masked
// store with AVX-512, a blend with AVX2), and its scrub clears a line in a
// handful of instructions. At the avx512 level, on CPUs that also have
// AVX-512 VBMI and VBMI2 (Ice Lake and later, Zen 4), the compact filter
// scans and rewrites a whole 64-byte line in a register (compact_filter.h);
// without them it keeps its portable path. All paths give the same decisions
// and the same state, byte for byte (timer_filter_test.cc and
// compact_filter_test.cc in tests/unit/filter run each level the CPU supports
// against the portable one).
//
// The level is the best the CPU supports, detected once per process. The
// `kdedup` binary caps it with the environment variable
// KDEDUP_SIMD=portable|avx2|avx512 (a way to rule the vector paths out when
// diagnosing); tests and benchmarks switch it with set_simd() to compare the
// paths side by side.

#include <cstdint>
#include <optional>
#include <string_view>

namespace kdedup::filter {

enum class Simd : std::uint8_t {
  kPortable,  ///< no instructions beyond the platform's baseline
  kAvx2,      ///< x86-64 AVX2 (with BMI2 and POPCNT)
  kAvx512,    ///< x86-64 AVX-512 F+BW (with BMI2 and POPCNT)
};

/// The best level this CPU runs.
[[nodiscard]] Simd simd_supported() noexcept;
/// The level the filters use now.
[[nodiscard]] Simd simd_in_use() noexcept;
/// Uses `level`, or the best supported one below it; returns the level now
/// in use. Levels are ordered: portable < avx2 < avx512.
Simd set_simd(Simd level) noexcept;
[[nodiscard]] std::string_view to_string(Simd level) noexcept;
/// "portable", "avx2" or "avx512"; nullopt for anything else.
[[nodiscard]] std::optional<Simd> simd_from_string(std::string_view name) noexcept;

}  // namespace kdedup::filter
