#include "kdedup/filter/fingerprint.h"

#include <gtest/gtest.h>

#include <unordered_set>

namespace kdedup::filter {
namespace {

TEST(Fingerprinter, SameSaltSameIdentityGivesSameFingerprint) {
  Fingerprinter a("secret"), b("secret");
  EXPECT_EQ(a("user-42"), b("user-42"));
  EXPECT_EQ(a.salt_digest(), b.salt_digest());
}

TEST(Fingerprinter, SaltChangesEveryFingerprint) {
  Fingerprinter a("secret"), b("other");
  EXPECT_NE(a.salt_digest(), b.salt_digest());
  for (int i = 0; i < 1000; ++i) {
    const std::string id = "id-" + std::to_string(i);
    EXPECT_NE(a(id), b(id));
  }
}

TEST(Fingerprinter, EmptySaltAndEmptyIdentityAreValid) {
  Fingerprinter f("");
  EXPECT_NE(f(""), f("x"));
}

TEST(Fingerprinter, NoCollisionsAmongManyIdentities) {
  Fingerprinter f("s");
  std::unordered_set<Fingerprint, FingerprintHash> seen;
  for (int i = 0; i < 200'000; ++i) EXPECT_TRUE(seen.insert(f(std::to_string(i))).second);
}

}  // namespace
}  // namespace kdedup::filter
