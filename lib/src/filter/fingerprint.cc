#include "kdedup/filter/fingerprint.h"

// XXH3_generateSecret is in the "experimental" (stable since 0.8.0) section.
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "kdedup/common/bytes.h"

namespace kdedup::filter {

static_assert(XXH3_SECRET_SIZE_MIN <= 192);

Fingerprinter::Fingerprinter(std::string_view salt) {
  // XXH3_generateSecret accepts any custom seed, even empty; a nullptr with
  // size 0 is allowed, so pass a valid pointer regardless.
  static constexpr char kEmpty = 0;
  const void* seed = salt.empty() ? &kEmpty : salt.data();
  XXH3_generateSecret(secret_.data(), secret_.size(), seed, salt.size());
  salt_digest_ = hash64(salt, 0x6b64656475702d73ULL);
}

Fingerprint Fingerprinter::operator()(std::string_view identity) const noexcept {
  const XXH128_hash_t h =
      XXH3_128bits_withSecret(identity.data(), identity.size(), secret_.data(), secret_.size());
  return Fingerprint{h.low64, h.high64};
}

}  // namespace kdedup::filter
