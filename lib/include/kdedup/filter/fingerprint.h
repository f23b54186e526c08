#pragma once
// Fingerprint: the salted 128-bit hash of a record's dedup identity.
//
// The salt is a secret from config. XXH3-128 is keyed with a secret derived
// from it (XXH3_generateSecret), so without the salt nobody can craft two
// identities that collide and suppress someone else's events. Every filter
// derives its probe positions from the two 64-bit halves.

#include <array>
#include <cstdint>
#include <string_view>

#include "kdedup/common/result.h"

namespace kdedup::filter {

struct Fingerprint {
  std::uint64_t lo = 0;
  std::uint64_t hi = 0;
  friend bool operator==(const Fingerprint&, const Fingerprint&) = default;
};

struct FingerprintHash {
  std::size_t operator()(const Fingerprint& f) const noexcept {
    return f.lo ^ (f.hi * 0x9E3779B97F4A7C15ULL);
  }
};

/// Hashes identities with one salt. Immutable after construction, so one
/// instance may be shared by every thread.
class Fingerprinter {
 public:
  /// An empty salt is allowed (tests, offline runs) but gives no protection.
  explicit Fingerprinter(std::string_view salt);

  [[nodiscard]] Fingerprint operator()(std::string_view identity) const noexcept;

 private:
  static constexpr std::size_t kSecretSize = 192;  // >= XXH3_SECRET_SIZE_MIN
  alignas(64) std::array<unsigned char, kSecretSize> secret_{};
};

/// The value stored with persisted state (snapshot manifests) so that a salt
/// change is detected; the salt itself is never written out. It is shown by
/// `kdedup snapshot inspect`, so it must not give the salt away: it is the
/// first 8 bytes of Argon2id (libsodium's crypto_pwhash with its
/// "interactive" limits: 2 passes over 64 MiB, about 0.1-0.3 s of one core)
/// of the salt, with a fixed public KDF salt. Every guess of a weak salt
/// costs as much; a salt of 16 or more random bytes cannot be guessed at all.
/// Slow on purpose: compute it once per process. Fails only when the 64 MiB
/// cannot be allocated.
[[nodiscard]] Result<std::uint64_t> salt_check(std::string_view salt);

/// Salts shorter than this are warned about: guessable from salt_check().
inline constexpr std::size_t kMinSaltBytes = 16;

}  // namespace kdedup::filter
