#include "kdedup/filter/fingerprint.h"

// XXH3_generateSecret is in the "experimental" (stable since 0.8.0) section.
#define XXH_STATIC_LINKING_ONLY
#include <sodium.h>
#include <xxhash.h>

#include <cstring>
#include <mutex>

namespace kdedup::filter {

static_assert(XXH3_SECRET_SIZE_MIN <= 192);

Fingerprinter::Fingerprinter(std::string_view salt) {
  // XXH3_generateSecret accepts any custom seed, even empty; a nullptr with
  // size 0 is allowed, so pass a valid pointer regardless.
  static constexpr char kEmpty = 0;
  const void* seed = salt.empty() ? &kEmpty : salt.data();
  XXH3_generateSecret(secret_.data(), secret_.size(), seed, salt.size());
}

Fingerprint Fingerprinter::operator()(std::string_view identity) const noexcept {
  const XXH128_hash_t h =
      XXH3_128bits_withSecret(identity.data(), identity.size(), secret_.data(), secret_.size());
  return Fingerprint{h.low64, h.high64};
}

Result<std::uint64_t> salt_check(std::string_view salt) {
  static std::once_flag init;
  static int init_result = 0;
  std::call_once(init, [] { init_result = sodium_init(); });
  if (init_result < 0) return fail("salt check: libsodium could not be initialised");
  // Public and fixed: it separates this use from any other Argon2id of the
  // same salt; the cost per guess comes from the limits.
  static constexpr unsigned char kKdfSalt[crypto_pwhash_SALTBYTES] = {
      'k', 'd', 'e', 'd', 'u', 'p', '-', 's', 'a', 'l', 't', '-', 'c', 'h', 'k', '1'};
  unsigned char out[16];
  static_assert(sizeof out >= crypto_pwhash_BYTES_MIN);
  // libsodium wants a valid pointer even for an empty password.
  static constexpr char kEmpty = 0;
  if (crypto_pwhash(out, sizeof out, salt.empty() ? &kEmpty : salt.data(), salt.size(), kKdfSalt,
                    crypto_pwhash_OPSLIMIT_INTERACTIVE, crypto_pwhash_MEMLIMIT_INTERACTIVE,
                    crypto_pwhash_ALG_ARGON2ID13) != 0) {
    return fail("salt check: Argon2id needs 64 MiB of memory and could not get it");
  }
  std::uint64_t value = 0;
  std::memcpy(&value, out, sizeof value);
  return value;
}

}  // namespace kdedup::filter
