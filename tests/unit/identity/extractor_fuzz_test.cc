// Randomized hostile input for the extractor: mutated JSON, random bytes and
// deep nesting must give an identity or a clear error, never a crash or hang
// (run under ASan+UBSan in CI). Seeds are fixed so failures reproduce.

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "kdedup/identity/extractor.h"

namespace kdedup::identity {
namespace {

const std::vector<std::string> kSeeds = {
    R"({"id":"a","ts":1,"user":{"id":7,"tags":["x","y"]}})",
    R"({"id":12.5e3,"ts":-3,"user":null})",
    R"({"id":"\u00e9\ud83d\ude00\\\"","ts":18446744073709551615,"user":{"id":[{}]}})",
    R"([{"id":1}])",
    R"({"a/b":{"m~n":[true,false,null]},"id":{"k":"v"}})",
};

// Alphabet biased toward JSON structure so mutations reach deep parser paths.
constexpr std::string_view kStructural = "{}[]\":,\\ 0123456789-+.eEtrufalsn\x00\xff\xc3\x80";

std::string mutate(std::string s, std::mt19937_64& rng) {
  const int edits = 1 + static_cast<int>(rng() % 8);
  for (int i = 0; i < edits; ++i) {
    const std::size_t pos = s.empty() ? 0 : rng() % (s.size() + 1);
    const char c = kStructural[rng() % kStructural.size()];
    switch (rng() % 4) {
      case 0:  // insert
        s.insert(s.begin() + static_cast<std::ptrdiff_t>(pos), c);
        break;
      case 1:  // delete
        if (pos < s.size()) s.erase(pos, 1);
        break;
      case 2:  // replace
        if (pos < s.size()) s[pos] = c;
        break;
      default:  // truncate
        s.resize(pos);
        break;
    }
  }
  return s;
}

std::string random_bytes(std::mt19937_64& rng) {
  std::string s(rng() % 200, '\0');
  for (auto& c : s) c = static_cast<char>(rng() & 0xFF);
  return s;
}

// Every outcome is either an identity or an error with a known reason and a
// non-empty message.
void check_outcome(const Extracted<Extraction>& got, const std::string& input) {
  if (got) return;
  EXPECT_FALSE(got.error().message.empty()) << input;
  EXPECT_TRUE(parse_reason(to_string(got.error().reason))) << input;
}

TEST(ExtractorFuzz, MutatedJsonNeverCrashes) {
  std::mt19937_64 rng(20240601);
  std::vector<IdentityExtractor> extractors;
  for (const char* spec :
       {"json:/id", "json:/user/id,json:/id", "json:", "json:/a~1b/m~0n/2", "json:/user/tags/1"}) {
    auto x = IdentityExtractor::create(spec, "json:/ts");
    ASSERT_TRUE(x);
    extractors.push_back(std::move(*x));
  }
  int ok = 0, failed = 0;
  for (int i = 0; i < 20'000; ++i) {
    const std::string input = mutate(kSeeds[rng() % kSeeds.size()], rng);
    auto& x = extractors[rng() % extractors.size()];
    auto got = x.extract(RecordView{std::nullopt, input, {}});
    check_outcome(got, input);
    (got ? ok : failed)++;
  }
  // Both paths were exercised: mutations keep some documents valid.
  EXPECT_GT(ok, 0);
  EXPECT_GT(failed, 0);
}

TEST(ExtractorFuzz, RandomBytesAreNotJson) {
  std::mt19937_64 rng(7);
  auto x = IdentityExtractor::create("json:/id");
  ASSERT_TRUE(x);
  auto line = IdentityExtractor::create("value");
  ASSERT_TRUE(line);
  for (int i = 0; i < 5'000; ++i) {
    const std::string input = random_bytes(rng);
    auto got = x->extract(RecordView{std::nullopt, input, {}});
    check_outcome(got, input);
    // The whole-value extractor takes any bytes as they are.
    auto whole = line->extract(RecordView{std::nullopt, input, {}});
    ASSERT_TRUE(whole);
    EXPECT_EQ(whole->identity, input);
  }
}

TEST(ExtractorFuzz, DeepNestingIsRejectedNotRecursedInto) {
  auto x = IdentityExtractor::create("json:/a");
  ASSERT_TRUE(x);
  for (std::size_t depth : {1000u, 1100u, 100'000u}) {
    std::string doc = "{\"a\":";
    doc += std::string(depth, '[') + std::string(depth, ']') + "}";
    auto got = x->extract(RecordView{std::nullopt, doc, {}});
    if (depth < 1000) {
      EXPECT_TRUE(got);
    } else if (!got) {
      EXPECT_EQ(got.error().reason, Reason::kNotJson) << got.error().message;
    }
    check_outcome(got, "depth " + std::to_string(depth));
  }
  std::string unclosed(1'000'000, '{');
  auto got = x->extract(RecordView{std::nullopt, unclosed, {}});
  ASSERT_FALSE(got);
  EXPECT_EQ(got.error().reason, Reason::kNotJson);
}

}  // namespace
}  // namespace kdedup::identity
