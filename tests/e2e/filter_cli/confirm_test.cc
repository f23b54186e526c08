// `kdedup filter --confirm-store DIR` run as a user runs it: on a stream
// with bursts and Zipf keys where the filters alone at fpp 0.05 drop many
// distinct records, confirmed mode writes exactly what the exact filter
// writes, keep_first and refresh, at the window's edge too; --stats reports
// the confirmation; the exact filter is refused.

#include <gtest/gtest.h>

#include <simdjson.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "process.h"

namespace kdedup::testing {
namespace {

/// 200,000 JSON lines {"id":..,"ts":..} over about 100 s of event time (a
/// 10 s window holds ~12,000 identities, more than a 64 KiB filter sizes
/// for at first): a third Zipf-drawn from 3,000 hot identities, the rest from
/// a domain of 30,000 that slides along (a repeat or two within the window),
/// and a 5x burst in the middle third.
std::string stream() {
  std::mt19937_64 rng(2024);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::ostringstream out;
  std::int64_t ts = 1'700'000'000'000;
  constexpr int kRecords = 200'000;
  for (int i = 0; i < kRecords; ++i) {
    const bool burst = i > kRecords / 3 && i < 2 * kRecords / 3;
    if (!burst || u(rng) < 0.2) ts += static_cast<std::int64_t>(u(rng) * 1.2);
    std::uint64_t id;
    if (u(rng) < 0.33) {
      // Zipf(1) over 3,000 ranks by inverting the harmonic CDF roughly.
      id = static_cast<std::uint64_t>(std::exp(u(rng) * std::log(3000.0)));
    } else {
      id = 1'000'000 + static_cast<std::uint64_t>(i / 3) + rng() % 30'000;
    }
    out << "{\"id\":" << id << ",\"ts\":" << ts << "}\n";
  }
  return out.str();
}

std::vector<std::string> args(const std::string& filter, const std::string& in,
                              std::vector<std::string> extra) {
  std::vector<std::string> a{"filter", "--filter", filter,     "--key", "json:/id",
                             "--time", "json:/ts", "--window", "10s",   "--ticks-per-window",
                             "10",     "--input",  in};
  if (filter != "exact") a.insert(a.end(), {"--fpp", "0.05"});
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

std::size_t lines(const std::string& text) {
  return static_cast<std::size_t>(std::count(text.begin(), text.end(), '\n'));
}

struct Confirm {
  std::uint64_t lookups = 0, prevented = 0, store_bytes = 0;
};

Confirm read_stats(const std::string& path) {
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  EXPECT_EQ(parser.load(path).get(doc), simdjson::SUCCESS);
  Confirm c;
  simdjson::dom::element confirm;
  EXPECT_EQ(doc["confirm"].get(confirm), simdjson::SUCCESS) << read_file(path);
  EXPECT_EQ(confirm["lookups"].get(c.lookups), simdjson::SUCCESS);
  EXPECT_EQ(confirm["prevented_false_positives"].get(c.prevented), simdjson::SUCCESS);
  EXPECT_EQ(confirm["store_bytes"].get(c.store_bytes), simdjson::SUCCESS);
  return c;
}

TEST(FilterCliConfirm, ConfirmedOutputIsTheExactFiltersWhereTheFiltersAloneDropDistinctRecords) {
  TempDir dir;
  const std::string in = dir.file("in.jsonl");
  write_file(in, stream());
  for (const char* on_duplicate : {"keep_first", "refresh"}) {
    const std::vector<std::string> mode{"--on-duplicate", on_duplicate};
    auto exact = run_kdedup(args("exact", in, mode));
    ASSERT_EQ(exact.exit_code, 0) << exact.err;
    for (const char* filter : {"timer", "aging", "compact"}) {
      SCOPED_TRACE(std::string(filter) + " " + on_duplicate);
      auto alone = run_kdedup(args(filter, in, mode));
      ASSERT_EQ(alone.exit_code, 0) << alone.err;
      // A directory that does not exist yet, two levels deep.
      const std::string store = dir.file(std::string("stores/") + filter);
      const std::string stats = dir.file("stats.json");
      std::vector<std::string> confirmed_args = mode;
      confirmed_args.insert(confirmed_args.end(), {"--confirm-store", store, "--stats", stats});
      auto confirmed = run_kdedup(args(filter, in, confirmed_args));
      ASSERT_EQ(confirmed.exit_code, 0) << confirmed.err;
      const std::size_t missing = lines(exact.out) - std::min(lines(exact.out), lines(alone.out));
      const Confirm c = read_stats(stats);
      std::printf(
          "%s %s: exact %zu lines, filter alone %zu (%zu fewer), confirmed %zu; %llu "
          "lookups, %llu false positives prevented, store %llu bytes\n",
          filter, on_duplicate, lines(exact.out), lines(alone.out), missing, lines(confirmed.out),
          static_cast<unsigned long long>(c.lookups), static_cast<unsigned long long>(c.prevented),
          static_cast<unsigned long long>(c.store_bytes));
      EXPECT_EQ(confirmed.out, exact.out) << "confirmed mode must decide as the exact filter";
      EXPECT_NE(alone.out, exact.out);
      EXPECT_GT(c.prevented, 100u) << "the filter alone must make many false positives";
      EXPECT_GT(c.lookups, c.prevented);
      EXPECT_GT(c.store_bytes, 0u);
      EXPECT_NE(confirmed.err.find("false positives prevented"), std::string::npos)
          << confirmed.err;
      // The same directory again: the run starts it empty, same output.
      auto again = run_kdedup(args(filter, in, confirmed_args));
      ASSERT_EQ(again.exit_code, 0) << again.err;
      EXPECT_EQ(again.out, exact.out);
    }
  }
}

TEST(FilterCliConfirm, TheWindowsEdgeIsTheExactFilters) {
  // One identity at t, then copies 10 s later (a duplicate: exactly the
  // window) and after the next one-second tick (forgotten), each time with
  // a hot key in between so the filter has positives to confirm.
  const std::int64_t t = 1'700'000'000'000;
  std::ostringstream in;
  auto line = [&](const std::string& id, std::int64_t ts) {
    in << "{\"id\":\"" << id << "\",\"ts\":" << ts << "}\n";
  };
  line("x", t);
  line("hot", t + 1);
  line("x", t + 10'000);    // age = window: duplicate
  line("hot", t + 10'000);  // age 9999 ms: duplicate
  line("x", t + 10'999);    // tick(t + 10999) = tick(t) + 10: still a duplicate
  line("x", t + 11'000);    // tick(t) + 11: forgotten, delivered again
  line("x", t + 11'001);    // duplicate of the delivery just before
  TempDir dir;
  write_file(dir.file("in.jsonl"), in.str());
  auto exact = run_kdedup(args("exact", dir.file("in.jsonl"), {}));
  auto confirmed =
      run_kdedup(args("timer", dir.file("in.jsonl"), {"--confirm-store", dir.file("store")}));
  ASSERT_EQ(exact.exit_code, 0) << exact.err;
  ASSERT_EQ(confirmed.exit_code, 0) << confirmed.err;
  EXPECT_EQ(confirmed.out, exact.out);
  EXPECT_EQ(lines(exact.out), 3u) << exact.out;
}

TEST(FilterCliConfirm, TheExactFilterIsRefused) {
  TempDir dir;
  auto r = run_kdedup(args("exact", "-", {"--confirm-store", dir.file("store")}), "{}\n");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--confirm-store: the exact filter has no false positives to confirm"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir.file("store")));
}

}  // namespace
}  // namespace kdedup::testing
