#include "kdedup/identity/extractor.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kdedup::identity {
namespace {

using namespace std::literals;

RecordView value_record(std::string_view value) { return RecordView{std::nullopt, value, {}}; }

IdentityExtractor make(std::string_view spec, std::string_view time = {}) {
  auto e = IdentityExtractor::create(spec, time);
  EXPECT_TRUE(e) << (e ? "" : e.error().message);
  return std::move(*e);
}

// Extracts and copies the identity (the view dies with the next call).
std::string id_of(IdentityExtractor& x, const RecordView& r) {
  auto got = x.extract(r);
  EXPECT_TRUE(got) << (got ? "" : got.error().message);
  return got ? std::string(got->identity) : "<error>";
}

Reason reason_of(IdentityExtractor& x, const RecordView& r) {
  auto got = x.extract(r);
  EXPECT_FALSE(got) << "unexpected identity '" << (got ? std::string(got->identity) : "") << "'";
  return got ? Reason::kTooLarge : got.error().reason;
}

std::string composite(std::initializer_list<std::string_view> parts) {
  std::string out;
  for (auto p : parts) append_length_prefixed(out, p);
  return out;
}

// ---- specs ----------------------------------------------------------------

TEST(IdentitySpec, ParsesEveryKindAndPrintsItBack) {
  for (std::string text : {"key", "value", "header:tenant", "json:/a", "json:/a/b~1c,json:/d",
                           "header:t,json:/id,key", "json:"}) {
    auto spec = parse_identity_spec(text);
    ASSERT_TRUE(spec) << text << ": " << spec.error().message;
    EXPECT_EQ(spec->to_string(), text);
  }
  auto spec = parse_identity_spec("header:t,json:/x/0");
  ASSERT_TRUE(spec);
  ASSERT_EQ(spec->parts.size(), 2u);
  EXPECT_EQ(spec->parts[0], (IdentityPart{PartKind::kHeader, "t"}));
  EXPECT_EQ(spec->parts[1], (IdentityPart{PartKind::kJson, "/x/0"}));
  EXPECT_TRUE(spec->needs_json());
  EXPECT_FALSE(parse_identity_spec("key,header:h")->needs_json());
  EXPECT_TRUE(spec->reads_headers());
  EXPECT_TRUE(parse_identity_spec("key,header:h")->reads_headers());
  EXPECT_FALSE(parse_identity_spec("key,value,json:/h")->reads_headers());
}

TEST(IdentitySpec, RejectsBadSpecsWithAMessageNamingThePart) {
  struct Case {
    std::string spec, needle;
  };
  for (const auto& c : std::vector<Case>{{"", "empty"},
                                         {"jsn:/a", "'jsn:/a': unknown kind"},
                                         {"json:a", "must start with '/'"},
                                         {"json:/a~2", "'~' not followed"},
                                         {"json:/a~", "'~' not followed"},
                                         {"header:", "header name is empty"},
                                         {"json:/a,", "empty part"},
                                         {"json:/a,,json:/b", "empty part"},
                                         {"KEY", "'KEY': unknown kind"}}) {
    auto spec = parse_identity_spec(c.spec);
    ASSERT_FALSE(spec) << c.spec;
    EXPECT_NE(spec.error().message.find(c.needle), std::string::npos)
        << c.spec << " -> " << spec.error().message;
  }
}

TEST(TimeSpec, AcceptsOnlyJsonPointers) {
  ASSERT_TRUE(parse_time_spec("json:/ts"));
  EXPECT_EQ(parse_time_spec("json:/meta/ts")->pointer, "/meta/ts");
  EXPECT_FALSE(parse_time_spec("ts"));
  EXPECT_FALSE(parse_time_spec("json:"));
  EXPECT_FALSE(parse_time_spec("json:ts"));
  EXPECT_FALSE(parse_time_spec("header:ts"));
}

TEST(Reason, NamesAreStableAndRoundTrip) {
  EXPECT_STREQ(to_string(Reason::kMissingKey), "missing_key");
  EXPECT_STREQ(to_string(Reason::kNullValue), "null_value");
  EXPECT_STREQ(to_string(Reason::kNotJson), "not_json");
  EXPECT_STREQ(to_string(Reason::kNotObject), "not_object");
  EXPECT_STREQ(to_string(Reason::kMissingField), "missing_field");
  EXPECT_STREQ(to_string(Reason::kNullField), "null_field");
  EXPECT_STREQ(to_string(Reason::kMissingHeader), "missing_header");
  EXPECT_STREQ(to_string(Reason::kNullHeader), "null_header");
  EXPECT_STREQ(to_string(Reason::kBadTime), "bad_time");
  EXPECT_STREQ(to_string(Reason::kTooLarge), "too_large");
  for (Reason r : kAllReasons) EXPECT_EQ(parse_reason(to_string(r)), r);
  EXPECT_EQ(parse_reason("nope"), std::nullopt);
}

// ---- key / value / header -------------------------------------------------

TEST(Extractor, KeyIsTheKeyBytesAndNullKeyIsMissingKey) {
  auto x = make("key");
  EXPECT_EQ(id_of(x, RecordView{"user-1"sv, "v"sv, {}}), "user-1");
  EXPECT_EQ(id_of(x, RecordView{""sv, std::nullopt, {}}), "");  // empty != null
  auto err = x.extract(RecordView{std::nullopt, "v"sv, {}});
  ASSERT_FALSE(err);
  EXPECT_EQ(err.error().reason, Reason::kMissingKey);
  EXPECT_NE(err.error().message.find("null key"), std::string::npos);
}

TEST(Extractor, ValueIsOpaqueBytesIncludingNulAndInvalidUtf8) {
  auto x = make("value");
  const std::string hostile = "a\0b\xff\xfe\xc3("s;
  EXPECT_EQ(id_of(x, value_record(hostile)), hostile);
  EXPECT_EQ(id_of(x, value_record("")), "");
  EXPECT_EQ(reason_of(x, RecordView{"k"sv, std::nullopt, {}}), Reason::kNullValue);
}

TEST(Extractor, HeaderUsesLastOccurrenceAndDistinguishesNullFromMissing) {
  auto x = make("header:id");
  std::vector<RecordHeader> headers{{"id", "first"sv}, {"other", "x"sv}, {"id", "second"sv}};
  EXPECT_EQ(id_of(x, RecordView{std::nullopt, std::nullopt, headers}), "second");

  std::vector<RecordHeader> empty_value{{"id", ""sv}};
  EXPECT_EQ(id_of(x, RecordView{std::nullopt, std::nullopt, empty_value}), "");

  std::vector<RecordHeader> null_value{{"id", std::nullopt}};
  auto err = x.extract(RecordView{std::nullopt, std::nullopt, null_value});
  ASSERT_FALSE(err);
  EXPECT_EQ(err.error().reason, Reason::kNullHeader);
  EXPECT_NE(err.error().message.find("'id'"), std::string::npos);

  std::vector<RecordHeader> other{{"ID", "x"sv}};  // names are case-sensitive
  err = x.extract(RecordView{std::nullopt, std::nullopt, other});
  ASSERT_FALSE(err);
  EXPECT_EQ(err.error().reason, Reason::kMissingHeader);
  EXPECT_NE(err.error().message.find("'id'"), std::string::npos);
}

// ---- JSON -----------------------------------------------------------------

TEST(Extractor, JsonScalarsContributeTheirText) {
  auto x = make("json:/v");
  EXPECT_EQ(id_of(x, value_record(R"({"v":"plain"})")), "plain");
  EXPECT_EQ(id_of(x, value_record(R"({"v":"a\"b\\c\u00e9\n"})")), "a\"b\\c\xc3\xa9\n");
  EXPECT_EQ(id_of(x, value_record(R"({"v":"nul\u0000inside"})")), "nul\0inside"s);
  EXPECT_EQ(id_of(x, value_record(R"({"v":""})")), "");
  EXPECT_EQ(id_of(x, value_record(R"({"v":42})")), "42");
  EXPECT_EQ(id_of(x, value_record(R"({"v":-7})")), "-7");
  EXPECT_EQ(id_of(x, value_record(R"({"v":18446744073709551615})")), "18446744073709551615");
  EXPECT_EQ(id_of(x, value_record(R"({"v":2.50})")), "2.5");
  EXPECT_EQ(id_of(x, value_record(R"({"v":1e2})")), "100");
  EXPECT_EQ(id_of(x, value_record(R"({"v":true})")), "true");
  EXPECT_EQ(id_of(x, value_record(R"({"v":false})")), "false");
}

TEST(Extractor, JsonContainersContributeMinifiedJson) {
  auto x = make("json:/v");
  EXPECT_EQ(id_of(x, value_record(R"({"v": { "a" : [1, 2 ,"x"] } })")), R"({"a":[1,2,"x"]})");
  EXPECT_EQ(id_of(x, value_record(R"({"v":[]})")), "[]");
  auto whole = make("json:");
  EXPECT_EQ(id_of(whole, value_record("{ \"b\" : 1 ,\n \"a\" : 2 }")), R"({"b":1,"a":2})");
}

TEST(Extractor, JsonPointersFollowRfc6901) {
  auto x = make("json:/a~1b/m~0n/1");
  EXPECT_EQ(id_of(x, value_record(R"({"a/b":{"m~n":["zero","one"]}})")), "one");
  auto nested = make("json:/user/id");
  EXPECT_EQ(id_of(nested, value_record(R"({"user":{"id":"u1"}})")), "u1");
  EXPECT_EQ(reason_of(nested, value_record(R"({"user":{"name":"x"}})")), Reason::kMissingField);
  EXPECT_EQ(reason_of(nested, value_record(R"({"user":"scalar"})")), Reason::kMissingField);
  EXPECT_EQ(reason_of(nested, value_record(R"({"user":["a"]})")), Reason::kMissingField);
  auto index = make("json:/list/5");
  EXPECT_EQ(reason_of(index, value_record(R"({"list":[1,2]})")), Reason::kMissingField);
}

TEST(Extractor, JsonFailureReasonsNameThePointer) {
  auto x = make("json:/id");
  auto check = [&](std::string_view value, Reason reason, std::string_view needle) {
    auto got = x.extract(value_record(value));
    ASSERT_FALSE(got) << value;
    EXPECT_EQ(got.error().reason, reason) << value << ": " << got.error().message;
    EXPECT_NE(got.error().message.find(needle), std::string::npos)
        << value << ": " << got.error().message;
  };
  check(R"({"id":null})", Reason::kNullField, "/id is null");
  check(R"({"other":1})", Reason::kMissingField, "/id is missing");
  check(R"([1,2])", Reason::kNotObject, "an array");
  check(R"("str")", Reason::kNotObject, "a string");
  check("17", Reason::kNotObject, "an integer");
  check("null", Reason::kNotObject, "null");
  check("", Reason::kNotJson, "not valid JSON");
  check("{", Reason::kNotJson, "not valid JSON");
  check(R"({"id":1} trailing)", Reason::kNotJson, "not valid JSON");
  check("{\"id\":\"\xff\xfe\"}", Reason::kNotJson, "UTF-8");
  check(R"({"id":123456789012345678901234567890})", Reason::kNotJson, "number");
  check(std::string(2000, '[') + std::string(2000, ']'), Reason::kNotJson,
        "deeper than the JSON limit of 1024 levels");
  // The limit itself: kMaxJsonDepth levels (the outer object is level 1)
  // are read, one more is not.
  auto nested = [](std::size_t levels) {
    return R"({"id":"x","d":)" + std::string(levels - 1, '[') + std::string(levels - 1, ']') + "}";
  };
  auto at_limit = x.extract(value_record(nested(kMaxJsonDepth)));
  ASSERT_TRUE(at_limit) << at_limit.error().message;
  EXPECT_EQ(at_limit->identity, "x");
  check(nested(kMaxJsonDepth + 1), Reason::kNotJson, "deeper than the JSON limit of 1024 levels");
  EXPECT_EQ(reason_of(x, RecordView{"k"sv, std::nullopt, {}}), Reason::kNullValue);
}

TEST(Extractor, RejectsValuesOverTheConfiguredJsonLimit) {
  ExtractorOptions options;
  options.max_json_bytes = 16;
  auto x = IdentityExtractor::create("json:/id", {}, options);
  ASSERT_TRUE(x);
  EXPECT_EQ(id_of(*x, value_record(R"({"id":"short"})")), "short");
  auto got = x->extract(value_record(R"({"id":"much longer than sixteen"})"));
  ASSERT_FALSE(got);
  EXPECT_EQ(got.error().reason, Reason::kTooLarge);
  // The limit does not apply to parts that do not parse JSON.
  auto v = IdentityExtractor::create("value", {}, options);
  EXPECT_EQ(id_of(*v, value_record(std::string(100, 'x'))), std::string(100, 'x'));
}

TEST(Extractor, HandlesValuesOverOneMebibyte) {
  std::string big = R"({"pad":")" + std::string(3 << 20, 'p') + R"(","id":"deep-inside"})";
  auto x = make("json:/id");
  EXPECT_EQ(id_of(x, value_record(big)), "deep-inside");
  auto pad = make("json:/pad");
  EXPECT_EQ(id_of(pad, value_record(big)).size(), 3u << 20);
  // A small record after a large one still works (buffers are reused).
  EXPECT_EQ(id_of(x, value_record(R"({"id":"small"})")), "small");
}

// ---- composites -----------------------------------------------------------

TEST(Extractor, CompositePartsAreLengthPrefixed) {
  auto x = make("json:/a,json:/b");
  const std::string ab_c = id_of(x, value_record(R"({"a":"ab","b":"c"})"));
  const std::string a_bc = id_of(x, value_record(R"({"a":"a","b":"bc"})"));
  EXPECT_NE(ab_c, a_bc);
  EXPECT_EQ(ab_c, composite({"ab", "c"}));
  EXPECT_EQ(a_bc, composite({"a", "bc"}));
  EXPECT_EQ(id_of(x, value_record(R"({"a":"","b":""})")), composite({"", ""}));
  EXPECT_EQ(id_of(x, value_record(R"({"b":2,"a":1,"z":0})")), composite({"1", "2"}));
  // Order of the spec matters, order of the fields in the document does not.
  auto swapped = make("json:/b,json:/a");
  EXPECT_EQ(id_of(swapped, value_record(R"({"a":1,"b":2})")), composite({"2", "1"}));
}

TEST(Extractor, CompositeReportsTheFirstFailingPart) {
  auto x = make("json:/a,json:/b");
  auto got = x.extract(value_record(R"({"a":"x"})"));
  ASSERT_FALSE(got);
  EXPECT_EQ(got.error().reason, Reason::kMissingField);
  EXPECT_NE(got.error().message.find("/b"), std::string::npos);
  got = x.extract(value_record(R"({"a":null,"b":"y"})"));
  ASSERT_FALSE(got);
  EXPECT_EQ(got.error().reason, Reason::kNullField);
  EXPECT_NE(got.error().message.find("/a"), std::string::npos);
}

TEST(Extractor, MixedCompositeOfHeaderKeyAndJson) {
  auto x = make("header:tenant,key,json:/id");
  std::vector<RecordHeader> headers{{"tenant", "t1"sv}};
  EXPECT_EQ(id_of(x, RecordView{"k"sv, R"({"id":5})"sv, headers}), composite({"t1", "k", "5"}));
  EXPECT_EQ(reason_of(x, RecordView{std::nullopt, R"({"id":5})"sv, headers}), Reason::kMissingKey);
  EXPECT_EQ(reason_of(x, RecordView{"k"sv, std::nullopt, headers}), Reason::kNullValue);
}

TEST(LengthPrefix, UsesVarintsForLongParts) {
  std::string out;
  append_length_prefixed(out, std::string(300, 'x'));
  ASSERT_EQ(out.size(), 302u);
  EXPECT_EQ(static_cast<unsigned char>(out[0]), 0xAC);  // 300 = 0b10'0101100
  EXPECT_EQ(static_cast<unsigned char>(out[1]), 0x02);
}

// ---- time -----------------------------------------------------------------

TEST(Extractor, TimeIsNonNegativeIntegerMilliseconds) {
  auto x = make("json:/id", "json:/ts");
  auto got = x.extract(value_record(R"({"id":"a","ts":1700000000123})"));
  ASSERT_TRUE(got) << got.error().message;
  EXPECT_EQ(got->identity, "a");
  EXPECT_EQ(got->time_ms, 1700000000123);
  got = x.extract(value_record(R"({"id":"a","ts":0})"));
  ASSERT_TRUE(got);
  EXPECT_EQ(got->time_ms, 0);

  auto check = [&](std::string_view value, Reason reason, std::string_view needle) {
    auto r = x.extract(value_record(value));
    ASSERT_FALSE(r) << value;
    EXPECT_EQ(r.error().reason, reason) << value << ": " << r.error().message;
    EXPECT_NE(r.error().message.find(needle), std::string::npos) << r.error().message;
  };
  check(R"({"id":"a","ts":-1})", Reason::kBadTime, "negative");
  check(R"({"id":"a","ts":1.5})", Reason::kBadTime, "fractional");
  check(R"({"id":"a","ts":1.0})", Reason::kBadTime, "fractional");
  check(R"({"id":"a","ts":"1700000000000"})", Reason::kBadTime, "a string");
  check(R"({"id":"a","ts":18446744073709551615})", Reason::kBadTime, "over 2^63-1");
  check(R"({"id":"a","ts":true})", Reason::kBadTime, "boolean");
  check(R"({"id":"a"})", Reason::kMissingField, "time field /ts is missing");
  check(R"({"id":"a","ts":null})", Reason::kNullField, "time field /ts is null");
  // Identity failures are reported before time failures.
  check(R"({"ts":"bad"})", Reason::kMissingField, "field /id is missing");
}

TEST(Extractor, TimeWithALineIdentityStillNeedsJson) {
  auto x = make("value", "json:/ts");
  auto got = x.extract(value_record(R"({"ts":5})"));
  ASSERT_TRUE(got);
  EXPECT_EQ(got->identity, R"({"ts":5})");
  EXPECT_EQ(reason_of(x, value_record("plain text")), Reason::kNotJson);
}

TEST(Extractor, IsMovableAndKeepsWorking) {
  auto x = make("json:/id");
  IdentityExtractor moved = std::move(x);
  EXPECT_EQ(id_of(moved, value_record(R"({"id":"m"})")), "m");
}

}  // namespace
}  // namespace kdedup::identity
