// The output verifier on hand-made inputs and outputs: a clean run passes,
// and each kind of fault (lost, duplicated, out of order, unexpected) is
// detected and reported on its own, with examples naming the records.

#include "verifier.h"

#include <gtest/gtest.h>

namespace kdedup::testing {
namespace {

constexpr std::int64_t kT0 = 1'700'000'000'000;

InputRecord in(std::int32_t p, std::int64_t off, const std::string& id, std::int64_t ts = kT0) {
  return InputRecord{"in", p, off, id, ts, id, "v" + std::to_string(off)};
}

OutputRecord out(std::int32_t p, std::int64_t off, const InputRecord& src) {
  OutputRecord o;
  o.partition = p;
  o.offset = off;
  o.source_topic = src.topic;
  o.source_partition = src.partition;
  o.source_offset = src.offset;
  o.key = src.key;
  o.value = src.value;
  return o;
}

const VerifySpec kSpec{.window_ms = 60'000, .tick_ms = 1'000};

// Partition 0: a b a c b ; partition 1: a a d. Oracle-distinct: 0@0 0@1 0@3, 1@0 1@2.
std::vector<InputRecord> sample_input() {
  return {in(0, 0, "a"), in(0, 1, "b"), in(0, 2, "a"), in(0, 3, "c"),
          in(0, 4, "b"), in(1, 0, "a"), in(1, 1, "a"), in(1, 2, "d")};
}

std::vector<OutputRecord> clean_output(const std::vector<InputRecord>& i) {
  return {out(0, 0, i[0]), out(0, 1, i[1]), out(0, 2, i[3]), out(1, 0, i[5]), out(1, 1, i[7])};
}

TEST(Verifier, CleanRunPasses) {
  auto input = sample_input();
  auto r = verify_output(input, clean_output(input), kSpec);
  EXPECT_TRUE(r.ok()) << r.to_string();
  EXPECT_EQ(r.input_records, 8u);
  EXPECT_EQ(r.oracle_distinct, 5u);
  EXPECT_EQ(r.output_records, 5u);
  EXPECT_EQ(r.ambiguous, 0u);
  EXPECT_NE(r.to_string().find("-> OK"), std::string::npos);
}

TEST(Verifier, InputOrderDoesNotMatter) {
  auto input = sample_input();
  auto output = clean_output(input);
  std::reverse(input.begin(), input.end());
  std::reverse(output.begin(), output.end());
  auto r = verify_output(input, output, kSpec);
  EXPECT_TRUE(r.ok()) << r.to_string();
}

TEST(Verifier, LostRecordIsReported) {
  auto input = sample_input();
  auto output = clean_output(input);
  output.erase(output.begin() + 2);  // 0@3 'c'
  auto r = verify_output(input, output, kSpec);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.lost, 1u) << r.to_string();
  EXPECT_EQ(r.duplicated + r.out_of_order + r.unexpected, 0u) << r.to_string();
  ASSERT_EQ(r.lost_examples.size(), 1u);
  EXPECT_NE(r.lost_examples[0].find("in[0]@3 identity 'c'"), std::string::npos)
      << r.lost_examples[0];
}

TEST(Verifier, SameSourceOffsetTwiceIsDuplicated) {
  auto input = sample_input();
  auto output = clean_output(input);
  output.push_back(out(0, 3, input[3]));  // 0@3 again, later in the same partition
  auto r = verify_output(input, output, kSpec);
  EXPECT_EQ(r.duplicated, 1u) << r.to_string();
  EXPECT_EQ(r.lost + r.out_of_order + r.unexpected, 0u) << r.to_string();
  EXPECT_NE(r.to_string().find("copy 2 of the same source offset"), std::string::npos);
}

TEST(Verifier, IdentityEmittedTwiceWithinTheWindowIsDuplicated) {
  auto input = sample_input();
  // 0@2 'a' is an oracle duplicate of 0@0, which was emitted before it.
  std::vector<OutputRecord> output = {out(0, 0, input[0]), out(0, 1, input[1]),
                                      out(0, 2, input[2]), out(0, 3, input[3]),
                                      out(1, 0, input[5]), out(1, 1, input[7])};
  auto r = verify_output(input, output, kSpec);
  EXPECT_EQ(r.duplicated, 1u) << r.to_string();
  EXPECT_EQ(r.lost + r.out_of_order + r.unexpected, 0u) << r.to_string();
  EXPECT_NE(r.to_string().find("identity 'a' emitted again within the window"), std::string::npos)
      << r.to_string();
}

TEST(Verifier, LowerSourceOffsetLaterInAPartitionIsOutOfOrder) {
  auto input = sample_input();
  auto output = clean_output(input);
  std::swap(output[1].offset, output[2].offset);  // 0@3 read before 0@1 in output partition 0
  auto r = verify_output(input, output, kSpec);
  EXPECT_EQ(r.out_of_order, 1u) << r.to_string();
  EXPECT_EQ(r.lost + r.duplicated + r.unexpected, 0u) << r.to_string();
  // Different output partitions do not order against each other.
  output = clean_output(input);
  output[2].partition = 5;
  output[2].offset = 0;
  r = verify_output(input, output, kSpec);
  EXPECT_TRUE(r.ok()) << r.to_string();
}

TEST(Verifier, OutputsThatAreNotOracleDistinctAreUnexpected) {
  auto input = sample_input();
  auto base = clean_output(input);

  // An oracle duplicate emitted while its first occurrence was not (the
  // first is then lost, the second unexpected).
  auto o = base;
  o[0] = out(0, 0, input[2]);
  auto r = verify_output(input, o, kSpec);
  EXPECT_EQ(r.unexpected, 1u) << r.to_string();
  EXPECT_EQ(r.lost, 1u) << r.to_string();
  EXPECT_EQ(r.duplicated, 0u) << r.to_string();

  // No provenance, malformed provenance, unknown source, changed payload.
  o = base;
  OutputRecord bare;
  bare.partition = 1;
  bare.offset = 10;
  o.push_back(bare);
  OutputRecord broken = out(1, 11, input[6]);
  broken.malformed = "kdedup-source-offset 'x' is not a decimal";
  o.push_back(broken);
  OutputRecord ghost = out(1, 12, input[7]);
  ghost.source_offset = 99;
  o.push_back(ghost);
  OutputRecord changed = out(0, 3, input[4]);
  o.push_back(changed);
  o.back().value = "tampered";
  r = verify_output(input, o, kSpec);
  EXPECT_EQ(r.unexpected, 4u) << r.to_string();
  EXPECT_EQ(r.lost + r.duplicated + r.out_of_order, 0u) << r.to_string();
  const auto text = r.to_string();
  EXPECT_NE(text.find("no provenance headers"), std::string::npos) << text;
  EXPECT_NE(text.find("malformed provenance"), std::string::npos) << text;
  EXPECT_NE(text.find("in[1]@99: no such input record"), std::string::npos) << text;
  EXPECT_NE(text.find("key/value differ"), std::string::npos) << text;
}

TEST(Verifier, WindowExpiryMakesARepeatDistinctAgain) {
  // 'a' at t0, 'a' at t0 + 30 s (duplicate), 'a' at t0 + 2 min (expired:
  // distinct again), 'a' at t0 + 2 min + 60.5 s: past the window by less
  // than one tick, ambiguous either way.
  std::vector<InputRecord> input = {in(0, 0, "a", kT0), in(0, 1, "a", kT0 + 30'000),
                                    in(0, 2, "a", kT0 + 120'000), in(0, 3, "a", kT0 + 180'500)};
  std::vector<OutputRecord> output = {out(0, 0, input[0]), out(0, 1, input[2])};
  auto r = verify_output(input, output, kSpec);
  EXPECT_TRUE(r.ok()) << r.to_string();
  EXPECT_EQ(r.oracle_distinct, 2u);
  EXPECT_EQ(r.ambiguous, 1u);
  output.push_back(out(0, 2, input[3]));
  r = verify_output(input, output, kSpec);
  EXPECT_TRUE(r.ok()) << "the edge record may go either way: " << r.to_string();

  // Missing the expired repeat is a loss.
  output = {out(0, 0, input[0])};
  r = verify_output(input, output, kSpec);
  EXPECT_EQ(r.lost, 1u) << r.to_string();
}

TEST(Verifier, ARepeatAtExactlyTheWindowIsADuplicate) {
  // Age 60 s == window: still a duplicate (DESIGN.md "Clock"); emitting it
  // is a false negative, whatever the tick.
  std::vector<InputRecord> input = {in(0, 0, "a", kT0), in(0, 1, "a", kT0 + 60'000)};
  std::vector<OutputRecord> output = {out(0, 0, input[0])};
  auto r = verify_output(input, output, kSpec);
  EXPECT_TRUE(r.ok()) << r.to_string();
  EXPECT_EQ(r.ambiguous, 0u);
  output.push_back(out(0, 1, input[1]));
  r = verify_output(input, output, kSpec);
  EXPECT_FALSE(r.ok()) << r.to_string();
}

TEST(Verifier, ExamplesAreCappedButCountsAreNot) {
  std::vector<InputRecord> input;
  for (int i = 0; i < 20; ++i) input.push_back(in(0, i, "id" + std::to_string(i)));
  VerifySpec spec = kSpec;
  spec.examples = 3;
  auto r = verify_output(input, {}, spec);
  EXPECT_EQ(r.lost, 20u);
  EXPECT_EQ(r.lost_examples.size(), 3u);
  EXPECT_NE(r.to_string().find("lost (20, first 3)"), std::string::npos) << r.to_string();
}

TEST(Verifier, ReadsKafkaRecordsWithKeyOrJsonIdentity) {
  using testbroker::KafkaRecord;
  std::vector<KafkaRecord> topic = {
      {.topic = "in", .partition = 0, .offset = 0, .key = "k", .value = R"({"user":{"id":7}})"},
      {.topic = "in", .partition = 0, .offset = 1, .key = "k", .value = R"({"user":{"id":"7"}})"},
  };
  auto by_key = to_input_records(topic, "key");
  ASSERT_TRUE(by_key) << by_key.error().message;
  EXPECT_EQ((*by_key)[0].identity, "k");
  auto by_json = to_input_records(topic, "json:/user/id");
  ASSERT_TRUE(by_json) << by_json.error().message;
  EXPECT_EQ((*by_json)[0].identity, "7");
  EXPECT_EQ((*by_json)[1].identity, "\"7\"");
  auto missing = to_input_records(topic, "json:/user/name");
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().message.find("in[0]@0 has no field /user/name"), std::string::npos)
      << missing.error().message;
  topic[1].key.reset();
  auto no_key = to_input_records(topic, "key");
  ASSERT_FALSE(no_key);
  EXPECT_NE(no_key.error().message.find("in[0]@1 has no key"), std::string::npos);

  std::vector<KafkaRecord> output = {
      {.topic = "out",
       .partition = 2,
       .offset = 5,
       .key = "k",
       .value = "v",
       .headers = {{"kdedup-source-topic", "in"},
                   {"kdedup-source-partition", "0"},
                   {"kdedup-source-offset", "1"}}},
      {.topic = "out", .partition = 2, .offset = 6, .value = "plain"},
      {.topic = "out",
       .partition = 2,
       .offset = 7,
       .headers = {{"kdedup-source-topic", "in"},
                   {"kdedup-source-partition", "0"},
                   {"kdedup-source-offset", "-3"}}},
      {.topic = "out", .partition = 2, .offset = 8, .headers = {{"kdedup-source-topic", "in"}}},
  };
  auto parsed = to_output_records(output);
  ASSERT_EQ(parsed.size(), 4u);
  EXPECT_EQ(parsed[0].source_topic, "in");
  EXPECT_EQ(parsed[0].source_partition, 0);
  EXPECT_EQ(parsed[0].source_offset, 1);
  EXPECT_TRUE(parsed[0].malformed.empty());
  EXPECT_FALSE(parsed[1].source_topic);
  EXPECT_TRUE(parsed[1].malformed.empty());
  EXPECT_NE(parsed[2].malformed.find("kdedup-source-offset' is not an offset: '-3'"),
            std::string::npos)
      << parsed[2].malformed;
  EXPECT_NE(parsed[3].malformed.find("'kdedup-source-partition' is missing"), std::string::npos)
      << parsed[3].malformed;
}

}  // namespace
}  // namespace kdedup::testing

namespace kdedup::testing {
namespace {

// on_duplicate: refresh: "a" every 40 s under a 60 s window is one delivery
// under refresh; the keep_first oracle wants it again at 80 s.
TEST(Verifier, RefreshOracleRenewsOnEveryOccurrence) {
  const std::vector<InputRecord> input{
      InputRecord{"in", 0, 0, "a", kT0, "a", "v0"},
      InputRecord{"in", 0, 1, "a", kT0 + 40'000, "a", "v1"},
      InputRecord{"in", 0, 2, "a", kT0 + 80'000, "a", "v2"},
      InputRecord{"in", 0, 3, "a", kT0 + 150'000, "a", "v3"},  // 70 s after the last
  };
  OutputRecord first;
  first.source_topic = "in";
  first.source_partition = 0;
  first.source_offset = 0;
  first.key = "a";
  first.value = "v0";
  OutputRecord last = first;
  last.offset = 1;
  last.source_offset = 3;
  last.value = "v3";
  VerifySpec refresh{.window_ms = 60'000, .tick_ms = 1'000, .refresh = true};
  auto r = verify_output(input, {first, last}, refresh);
  EXPECT_TRUE(r.ok()) << r.to_string();
  EXPECT_EQ(r.oracle_distinct, 2u);
  auto keep =
      verify_output(input, {first, last}, VerifySpec{.window_ms = 60'000, .tick_ms = 1'000});
  EXPECT_EQ(keep.lost, 1u) << "keep_first delivers a again at 80 s: " << keep.to_string();
  auto missing = verify_output(input, {first}, refresh);
  EXPECT_EQ(missing.lost, 1u) << missing.to_string();
}

}  // namespace
}  // namespace kdedup::testing
