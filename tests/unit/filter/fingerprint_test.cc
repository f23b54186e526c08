#include "kdedup/filter/fingerprint.h"

#include <gtest/gtest.h>

#include <unordered_set>

#include "kdedup/common/bytes.h"

namespace kdedup::filter {
namespace {

TEST(Fingerprinter, SameSaltSameIdentityGivesSameFingerprint) {
  Fingerprinter a("secret"), b("secret");
  EXPECT_EQ(a("user-42"), b("user-42"));
}

TEST(Fingerprinter, SaltChangesEveryFingerprint) {
  Fingerprinter a("secret"), b("other");
  for (int i = 0; i < 1000; ++i) {
    const std::string id = "id-" + std::to_string(i);
    EXPECT_NE(a(id), b(id));
  }
}

// The check value snapshots store (and snapshot inspect shows) is Argon2id
// of the salt: stable across releases (a change refuses every snapshot once),
// different per salt, and not a fast hash anyone can invert by guessing.
TEST(SaltCheck, StableArgon2idOfTheSalt) {
  auto a = salt_check("secret");
  auto again = salt_check("secret");
  auto other = salt_check("other");
  auto empty = salt_check("");
  ASSERT_TRUE(a && again && other && empty);
  EXPECT_EQ(*a, *again);
  EXPECT_NE(*a, *other);
  EXPECT_NE(*a, *empty);
  // Known answer: a change here refuses every stored snapshot as
  // config_changed, which docs/operations.md must then announce.
  EXPECT_EQ(*a, 0xba5ab9e4a16bc01cULL) << std::hex << *a;
  // Not the fast digest of earlier releases (XXH3-64 with a public seed).
  EXPECT_NE(*a, hash64("secret", 0x6b64656475702d73ULL));
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
