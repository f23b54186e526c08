// Randomized tests of the config loader: mutated YAML (byte flips, cuts,
// YAML indicators, deep nesting) and random values for every key. The loader
// must never crash or hang, and every rejection must carry a message a person
// can act on. Seeds are fixed so a failure reproduces; the seed and input are
// printed with it.

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kdedup/config/config.h"
#include "process.h"

namespace kdedup::config {
namespace {

std::optional<std::string> fixed_env(const std::string& name) {
  if (name == "KDEDUP_BOOTSTRAP" || name == "KAFKA_BOOTSTRAP") return std::string("127.0.0.1:9092");
  if (name == "KDEDUP_SALT") return std::string("salt");
  return std::nullopt;
}

std::string example() {
  return kdedup::testing::read_file(std::string(KDEDUP_SOURCE_DIR) + "/config/kdedup.yaml");
}

/// Asserts the report is coherent: a config iff no errors, and every error
/// says something.
void expect_coherent(const LoadReport& r, const std::string& input) {
  EXPECT_EQ(r.ok(), r.errors.empty()) << input;
  for (const auto& e : r.errors) {
    EXPECT_FALSE(e.message.empty()) << input;
    EXPECT_FALSE(to_string(e).empty());
  }
}

std::string mutate(std::string text, std::mt19937_64& rng) {
  static const std::vector<std::string> kTokens = {":",
                                                   "- ",
                                                   "[",
                                                   "]",
                                                   "{",
                                                   "}",
                                                   "&a ",
                                                   "*a",
                                                   "!!binary ",
                                                   "\"",
                                                   "'",
                                                   "#",
                                                   "\n",
                                                   "\t",
                                                   "  ",
                                                   "${",
                                                   "${X",
                                                   "${KDEDUP_SALT:-",
                                                   "}",
                                                   "|",
                                                   ">",
                                                   "? ",
                                                   "---\n",
                                                   "...\n",
                                                   "%YAML 1.2\n",
                                                   "\\",
                                                   "\x00",
                                                   "\xff",
                                                   "\xc3",
                                                   "-1",
                                                   "1e309",
                                                   "0x",
                                                   ".inf",
                                                   "null",
                                                   "~",
                                                   "true",
                                                   "9999999999999999999999"};
  int edits = 1 + static_cast<int>(rng() % 6);
  for (int i = 0; i < edits && !text.empty(); ++i) {
    std::size_t pos = rng() % text.size();
    switch (rng() % 5) {
      case 0:  // flip a byte
        text[pos] = static_cast<char>(rng() & 0xff);
        break;
      case 1:  // cut
        text.erase(pos, rng() % 40);
        break;
      case 2: {  // insert a YAML token
        const auto& t = kTokens[rng() % kTokens.size()];
        text.insert(pos, t);
        break;
      }
      case 3:  // truncate
        text.resize(pos);
        break;
      default: {  // duplicate a slice somewhere else
        std::size_t len = std::min<std::size_t>(rng() % 80, text.size() - pos);
        std::string slice = text.substr(pos, len);
        text.insert(rng() % text.size(), slice);
        break;
      }
    }
  }
  return text;
}

TEST(ConfigFuzz, MutatedExampleNeverCrashes) {
  const std::string base = example();
  ASSERT_TRUE(check_config_text(base, "kdedup.yaml", {}, fixed_env).ok());
  std::mt19937_64 rng(0x6b646564);
  int rejected = 0;
  for (int i = 0; i < 300; ++i) {
    std::string input = mutate(base, rng);
    auto r = check_config_text(input, "fuzz.yaml", {}, fixed_env);
    expect_coherent(r, input);
    if (!r.ok()) ++rejected;
    for (const auto& e : r.errors) {
      if (e.message.rfind("YAML syntax error", 0) == 0) {
        // A syntax error points at file, line and column.
        EXPECT_NE(e.where.find("fuzz.yaml:"), std::string::npos) << input;
      }
    }
  }
  EXPECT_GT(rejected, 30);  // the mutations do break things
}

TEST(ConfigFuzz, RandomValuesForEveryKey) {
  static const std::vector<std::string> kKeys = {"group_id",
                                                 "input.topics",
                                                 "output.topic",
                                                 "output.partitioning",
                                                 "identity.extractor",
                                                 "identity.salt",
                                                 "window",
                                                 "max_future_skew",
                                                 "filter.enabled",
                                                 "filter.type",
                                                 "filter.fpp",
                                                 "filter.capacity",
                                                 "filter.ticks_per_window",
                                                 "filter.timer_bits",
                                                 "filter.equal_timers",
                                                 "filter.growth",
                                                 "filter.min_bytes",
                                                 "filter.max_bytes",
                                                 "threads",
                                                 "batch_size",
                                                 "on_invalid",
                                                 "dlq_topic",
                                                 "duplicates_topic",
                                                 "delivery",
                                                 "commit_interval",
                                                 "shutdown_timeout",
                                                 "kafka.bootstrap.servers",
                                                 "consumer.fetch.min.bytes",
                                                 "producer.linger.ms",
                                                 "state.dir",
                                                 "state.snapshot_interval",
                                                 "state.snapshot_records",
                                                 "metrics.address",
                                                 "metrics.per_partition",
                                                 "metrics.audit_sample",
                                                 "log_level"};
  static const std::vector<std::string> kValues = {"",
                                                   "0",
                                                   "-1",
                                                   "1",
                                                   "3",
                                                   "0.5",
                                                   "1e-9",
                                                   "1e309",
                                                   "18446744073709551616",
                                                   "true",
                                                   "null",
                                                   "~",
                                                   "[a,b]",
                                                   "[]",
                                                   "{}",
                                                   "{a: 1}",
                                                   "x",
                                                   "24h",
                                                   "0ms",
                                                   "10x",
                                                   "99999999999999999999d",
                                                   "64KiB",
                                                   "1GiB",
                                                   "0B",
                                                   "timer",
                                                   "exact",
                                                   "dlq",
                                                   "key",
                                                   "header:",
                                                   "json:/a,json:/b",
                                                   "0.0.0.0:99999",
                                                   "'quoted'",
                                                   "\"${UNSET}\"",
                                                   "[a, [b, [c]]]",
                                                   "&x [1]",
                                                   "*x",
                                                   "\"\\u0000\"",
                                                   "65536"};
  const std::string base = example();
  std::mt19937_64 rng(42);
  for (int i = 0; i < 300; ++i) {
    std::vector<std::string> sets;
    int n = 1 + static_cast<int>(rng() % 4);
    std::string input;
    for (int j = 0; j < n; ++j) {
      sets.push_back(kKeys[rng() % kKeys.size()] + "=" + kValues[rng() % kValues.size()]);
      input += sets.back() + " ";
    }
    auto r = check_config_text(base, "kdedup.yaml", sets, fixed_env);
    expect_coherent(r, input);
    for (const auto& e : r.errors) {
      // Value errors name the key they concern.
      EXPECT_FALSE(e.path.empty() && e.where.rfind("--set", 0) != 0) << input << to_string(e);
    }
  }
}

TEST(ConfigFuzz, DeepNestingAndLongInputsAreRejectedCleanly) {
  for (int depth : {10, 100, 1000, 5000}) {
    std::string nested = "group_id: " + std::string(depth, '[') + std::string(depth, ']') + "\n";
    expect_coherent(check_config_text(nested, "deep.yaml", {}, fixed_env), "depth");
    std::string maps = "a:\n";
    for (int i = 1; i < std::min(depth, 500); ++i) maps += std::string(i * 1, ' ') + "a:\n";
    expect_coherent(check_config_text(maps, "deep-map.yaml", {}, fixed_env), "maps");
  }
  std::string huge(5u << 20, 'x');
  auto r = check_config_text("group_id: " + huge, "huge.yaml", {}, fixed_env);
  EXPECT_FALSE(r.ok());
  ASSERT_FALSE(r.errors.empty());
  EXPECT_NE(r.errors[0].message.find("larger than"), std::string::npos);
}

TEST(ConfigFuzz, RandomBytes) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 500; ++i) {
    std::string input(rng() % 300, '\0');
    for (auto& c : input) c = static_cast<char>(rng() & 0xff);
    auto r = check_config_text(input, "random.yaml", {}, fixed_env);
    expect_coherent(r, input);
    EXPECT_FALSE(r.ok());
  }
}

}  // namespace
}  // namespace kdedup::config
