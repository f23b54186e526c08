// The window's edge through `kdedup run` as a user runs it (DESIGN.md
// "Clock"): an identity delivered at time t is a duplicate for every arrival
// at or before t + window and, with the timer, exact and compact filters, is
// forgotten by t + window + one tick. Pairs of records with the same
// identity at explicit timestamps (ages 1 ms, window - 1 ms, window, and
// window + one tick) go through the binary for windows of 250 ms, 1 s and
// 1 m and every filter type (each at its default ticks per window: one tick
// is a tenth of the window for compact); the same records go through
// `kdedup filter`, which must make the same decisions.

#include <gtest/gtest.h>

#include <chrono>
#include <set>
#include <thread>

#include "broker.h"
#include "kdedup/filter/tick_scale.h"
#include "kdedup/testbroker/child_process.h"

namespace kdedup::testing {
namespace {

using namespace std::chrono_literals;

struct EdgeCase {
  std::string window;  ///< as written in the config
  std::int64_t window_ms;
  std::string filter;
  std::uint32_t ticks_per_window = 192;  ///< the type's default (timer at 8 bits, exact, aging)
};

void PrintTo(const EdgeCase& c, std::ostream* os) {
  *os << c.filter << " filter, window " << c.window;
}

std::string case_name(const ::testing::TestParamInfo<EdgeCase>& info) {
  return info.param.filter + "_" + info.param.window;
}

class WindowEdge : public ::testing::TestWithParam<EdgeCase> {};

constexpr int kPairsPerAge = 6;

TEST_P(WindowEdge, RunAndFilterDropEveryRepeatUpToTheWindowAndForgetWithinOneTick) {
  const EdgeCase& c = GetParam();
  const filter::TickScale scale(c.window_ms, c.ticks_per_window);
  const std::int64_t tick = scale.tick_ms_ceil();
  struct Age {
    std::int64_t ms;
    bool duplicate;  ///< what every filter must decide for the repeat
    bool forgotten;  ///< timer, exact and compact must emit the repeat (the aging edge is soft)
  };
  const std::vector<Age> ages = {{1, true, false},
                                 {c.window_ms - 1, true, false},
                                 {c.window_ms, true, false},
                                 {c.window_ms + tick, false, true}};

  // Pairs far apart (3 windows), all in the past so that no timestamp is
  // capped at wall clock + max_future_skew.
  const std::int64_t spacing = 3 * c.window_ms + 10;
  const auto now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  std::int64_t t = now_ms - static_cast<std::int64_t>(ages.size() * kPairsPerAge + 2) * spacing;
  std::vector<TestRecord> records;
  std::vector<std::string> lines;
  std::vector<std::string> must_drop, must_emit;
  auto add = [&](const std::string& id, std::int64_t ts) {
    const std::string value = R"({"id":")" + id + R"(","ts":)" + std::to_string(ts) + "}";
    records.push_back(TestRecord{.key = id, .value = value, .timestamp_ms = ts, .partition = 0});
    lines.push_back(value);
    return value;
  };
  for (std::size_t a = 0; a < ages.size(); ++a) {
    for (int p = 0; p < kPairsPerAge; ++p) {
      const std::string id = "id-" + std::to_string(a) + "-" + std::to_string(p);
      must_emit.push_back(add(id, t));
      const std::string repeat = add(id, t + ages[a].ms);
      if (ages[a].duplicate) {
        must_drop.push_back(repeat);
      } else if (ages[a].forgotten && c.filter != "aging") {
        must_emit.push_back(repeat);
      }  // else: the aging filter may still drop it (its soft edge)
      t += spacing;
    }
  }
  const std::string sentinel = add("sentinel", t);  // everything before it is decided

  auto broker = TestBroker::start({.brokers = 1, .topics = {"in:1", "out:1", "dlq:1"}});
  ASSERT_TRUE(broker) << broker.error().message;
  ASSERT_TRUE((*broker)->produce("in", records));

  TempDir dir;
  const std::string common_filter = "  type: " + c.filter + "\n  fpp: 0.001\n  capacity: 10000\n";
  write_file(dir.file("edge.yaml"),
             "group_id: edge\ninput:\n  topics: [in]\noutput:\n  topic: out\n"
             "identity:\n  extractor: json:/id\n  salt: edge-salt\n"
             "window: " +
                 c.window + "\nfilter:\n" + common_filter +
                 "on_invalid: dlq\ndlq_topic: dlq\ncommit_interval: 200ms\n"
                 "kafka:\n  bootstrap.servers: \"" +
                 (*broker)->bootstrap() +
                 "\"\nconsumer:\n  session.timeout.ms: \"6000\"\n"
                 "metrics:\n  address: \"\"\nstate:\n  dir: \"\"\n");
  testbroker::ChildOptions o;
  o.stderr_file = dir.file("run.log");
  auto run =
      testbroker::ChildProcess::spawn({KDEDUP_BINARY, "run", "--config", dir.file("edge.yaml")}, o);
  ASSERT_TRUE(run) << run.error().message;

  std::vector<std::string> emitted;
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  for (;;) {
    auto out = (*broker)->read_topic("out", 10s);
    ASSERT_TRUE(out) << out.error().message;
    emitted.clear();
    for (const auto& r : *out) emitted.push_back(r.value);
    if (!emitted.empty() && emitted.back() == sentinel) break;
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the sentinel never came out; log:\n"
                                                          << read_file(dir.file("run.log"));
    std::this_thread::sleep_for(200ms);
  }
  EXPECT_EQ((*run)->stop(), 0) << read_file(dir.file("run.log"));

  const std::set<std::string> out(emitted.begin(), emitted.end());
  for (const auto& v : must_drop) EXPECT_FALSE(out.count(v)) << "emitted inside the window: " << v;
  for (const auto& v : must_emit) EXPECT_TRUE(out.count(v)) << "not emitted: " << v;
  EXPECT_EQ(emitted.size(), out.size()) << "a record was emitted twice";

  // The same records through `kdedup filter`: the same decisions.
  std::string input;
  for (const auto& l : lines) input += l + "\n";
  auto filtered = run_kdedup(
      {"filter", "--key", "json:/id", "--time", "json:/ts", "--window", c.window, "--filter",
       c.filter, "--fpp", "0.001", "--capacity", "10000", "--salt", "edge-salt"},
      input);
  ASSERT_EQ(filtered.exit_code, 0) << filtered.err;
  std::string expected;
  for (const auto& v : emitted) expected += v + "\n";
  EXPECT_EQ(filtered.out, expected) << "kdedup filter and kdedup run decided differently";
}

INSTANTIATE_TEST_SUITE_P(
    EveryFilterAndWindow, WindowEdge,
    ::testing::Values(EdgeCase{"250ms", 250, "timer"}, EdgeCase{"250ms", 250, "exact"},
                      EdgeCase{"250ms", 250, "aging"}, EdgeCase{"1s", 1'000, "timer"},
                      EdgeCase{"1s", 1'000, "exact"}, EdgeCase{"1s", 1'000, "aging"},
                      EdgeCase{"1m", 60'000, "timer"}, EdgeCase{"1m", 60'000, "exact"},
                      EdgeCase{"1m", 60'000, "aging"}, EdgeCase{"250ms", 250, "compact", 10},
                      EdgeCase{"1s", 1'000, "compact", 10}, EdgeCase{"1m", 60'000, "compact", 10}),
    case_name);

}  // namespace
}  // namespace kdedup::testing
