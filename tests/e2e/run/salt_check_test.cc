// The salt's check value through the binaries: `kdedup run` warns about a
// salt shorter than 16 bytes (without printing it), stores Argon2id of the
// salt in its snapshots (not a fast hash a weak salt could be guessed from),
// `kdedup snapshot inspect` shows that value, and a changed salt still
// refuses the snapshots.

#include <gtest/gtest.h>

#include <fmt/format.h>

#include "broker.h"
#include "kdedup/common/bytes.h"
#include "kdedup/filter/fingerprint.h"
#include "process.h"
#include "run_until_output.h"

namespace kdedup::testing {
namespace {

constexpr const char* kWeakSalt = "tiny-salt";  // 9 bytes

std::string salted_config(const std::string& bootstrap, const std::string& salt) {
  return "group_id: salt-group\n"
         "input:\n  topics: [in]\n"
         "output:\n  topic: out\n"
         "identity:\n  salt: " +
         salt +
         "\nwindow: 1m\n"
         "filter:\n  type: exact\n"
         "dlq_topic: dlq\n"
         "commit_interval: 200ms\n"
         "kafka:\n  bootstrap.servers: \"" +
         bootstrap +
         "\"\n"
         "consumer:\n  session.timeout.ms: \"6000\"\n  heartbeat.interval.ms: \"500\"\n"
         "metrics:\n  address: \"\"\n";
}

/// Runs `kdedup run` until `out` holds `expected` records, then SIGTERM;
/// returns its stderr.
std::string run_salted_until(TestBroker& broker, const TempDir& dir, const std::string& name,
                             const std::string& salt, std::size_t expected) {
  const std::string config = dir.file(name + ".yaml");
  write_file(config, salted_config(broker.bootstrap(), salt));
  return run_until_output(broker, config, dir.file(name + ".log"), expected,
                          {"--set", "state.dir=" + dir.file("state")});
}

TEST(RunE2E, SnapshotsStoreASlowSaltCheckAndAShortSaltIsWarnedAbout) {
  auto broker = TestBroker::start({.brokers = 1, .topics = {"in:2", "out:2", "dlq:1"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TempDir dir;
  std::vector<TestRecord> records;
  for (int i = 0; i < 200; ++i) {
    records.push_back({"id-" + std::to_string(i), "v", 0, {}, i % 2});
  }
  ASSERT_TRUE((*broker)->produce("in", records));
  const std::string log = run_salted_until(**broker, dir, "first", kWeakSalt, 200);
  EXPECT_NE(log.find("warning: identity.salt: 9 bytes, shorter than 16"), std::string::npos) << log;
  EXPECT_EQ(log.find(kWeakSalt), std::string::npos) << "the salt itself was printed:\n" << log;

  auto inspected = run_kdedup({"snapshot", "inspect", "--state-dir", dir.file("state"), "--json"});
  ASSERT_EQ(inspected.exit_code, 0) << inspected.err;
  auto expected = filter::salt_check(kWeakSalt);
  ASSERT_TRUE(expected) << expected.error().message;
  const std::string slow = fmt::format("\"salt_check\":\"{:016x}\"", *expected);
  const std::string fast = fmt::format("{:016x}", hash64(kWeakSalt, 0x6b64656475702d73ULL));
  EXPECT_NE(inspected.out.find(slow), std::string::npos) << inspected.out;
  EXPECT_EQ(inspected.out.find(fast), std::string::npos)
      << "inspect shows the fast XXH3 digest of the salt:\n"
      << inspected.out;

  // Another salt gives other fingerprints: the snapshots are refused.
  records.clear();
  for (int i = 200; i < 300; ++i) {
    records.push_back({"id-" + std::to_string(i), "v", 0, {}, i % 2});
  }
  ASSERT_TRUE((*broker)->produce("in", records));
  const std::string second =
      run_salted_until(**broker, dir, "second", "another-salt-of-20-bytes", 300);
  EXPECT_NE(second.find("snapshot not usable (config_changed)"), std::string::npos) << second;
  EXPECT_NE(second.find("taken with another salt"), std::string::npos) << second;
}

}  // namespace
}  // namespace kdedup::testing
