#pragma once
// Whether this test build runs under AddressSanitizer or ThreadSanitizer
// (the asan and tsan presets), for tests that cannot run or mean nothing
// there.

namespace kdedup::testing {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitizerBuild = true;
#else
inline constexpr bool kSanitizerBuild = false;
#endif

}  // namespace kdedup::testing
