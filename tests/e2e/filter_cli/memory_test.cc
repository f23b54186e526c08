// How `kdedup filter`'s memory follows the load, through the binary: the
// filters shrink after the rate of new identities falls and after bursts,
// and the timer filter grows in place when the rate climbs.

#include <gtest/gtest.h>

#include <simdjson.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "judge.h"
#include "kdedup/filter/sliding_filter.h"
#include "process.h"
#include "streams.h"

namespace kdedup::testing {
namespace {

/// What the stats file says of a compact filter's memory, and the judge's verdict.
struct CompactRun {
  std::uint64_t bytes_final = 0, bytes_peak = 0, subfilters_final = 0;
  Verdict verdict;
};

/// Runs `input` ({"id","ts"} records) through `kdedup filter --filter
/// compact` at `fpp` under a window of `window_ms` (10 ticks), judges the
/// output and checks that no record was a false negative.
CompactRun run_compact(const std::string& input, double fpp, std::int64_t window_ms) {
  TempDir dir;
  auto r = run_kdedup({"filter", "--key", "json:/id", "--time", "json:/ts", "--window",
                       std::to_string(window_ms) + "ms", "--filter", "compact", "--fpp",
                       fmt_double(fpp), "--stats", dir.file("stats.json")},
                      input);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  CompactRun run;
  run.verdict = judge(input, r.out, window_ms, 10);
  EXPECT_EQ(run.verdict.false_negatives, 0u);
  simdjson::dom::parser parser;
  auto doc = parser.parse(read_file(dir.file("stats.json")));
  EXPECT_FALSE(doc.error());
  simdjson::dom::element f = doc.value()["filter"].value();
  run.bytes_final = f["bytes_final"].get_uint64().value();
  run.bytes_peak = f["bytes_peak"].get_uint64().value();
  run.subfilters_final = f["subfilters_final"].get_uint64().value();
  return run;
}

// New identities at phases[i].first a millisecond for phases[i].second
// milliseconds, one phase after the other; each sent once more 3 s later (a
// duplicate inside a 10 s window) when `echo`.
std::string phased_stream(const std::vector<std::pair<double, std::int64_t>>& phases,
                          bool echo = true) {
  std::vector<std::pair<std::int64_t, std::int64_t>> sends;  // (ts, id)
  std::int64_t id = 0, ms = 0;
  double due = 0;
  for (const auto& [rate, span] : phases) {
    for (const std::int64_t end = ms + span; ms < end; ++ms) {
      for (due += rate; due >= 1; due -= 1, ++id) {
        sends.emplace_back(ms, id);
        if (echo) sends.emplace_back(ms + 3'000, id);
      }
    }
  }
  std::stable_sort(sends.begin(), sends.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::string input;
  for (const auto& [ts, i] : sends) {
    input += "{\"id\":" + std::to_string(i) + ",\"ts\":" + std::to_string(ts) + "}\n";
  }
  return input;
}

// New identities at `first` a millisecond for two 10 s windows, then at
// `then` for four.
std::string stepped_stream(double first, double then) {
  return phased_stream({{first, 20'000}, {then, 40'000}});
}

/// What the stats file says of a timer filter's memory.
struct TimerMemory {
  std::uint64_t peak = 0, final = 0;
};

/// A run of `kdedup filter`: its memory, the judge's verdict and what it
/// emitted.
struct FilterRun {
  TimerMemory memory;
  Verdict verdict;
  std::string out;
};

/// Runs `input` ({"id","ts"} records) through `kdedup filter` with
/// `filter_args` (the filter's type and shape) and `ticks` ticks in a window
/// of `window_ms` at fpp 1%, and judges the output (no false negative).
FilterRun run_filter_on(const std::string& input, std::vector<std::string> filter_args,
                        std::int64_t ticks, std::int64_t window_ms) {
  TempDir dir;
  std::vector<std::string> args = {"filter",
                                   "--key",
                                   "json:/id",
                                   "--time",
                                   "json:/ts",
                                   "--window",
                                   std::to_string(window_ms) + "ms",
                                   "--ticks-per-window",
                                   std::to_string(ticks),
                                   "--fpp",
                                   "0.01",
                                   "--stats",
                                   dir.file("stats.json")};
  args.insert(args.end(), filter_args.begin(), filter_args.end());
  auto r = run_kdedup(args, input);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  FilterRun run;
  run.verdict = judge(input, r.out, window_ms, ticks);
  EXPECT_EQ(run.verdict.false_negatives, 0u);
  simdjson::dom::parser parser;
  auto doc = parser.parse(read_file(dir.file("stats.json")));
  EXPECT_FALSE(doc.error());
  simdjson::dom::element f = doc.value()["filter"].value();
  run.memory = {f["bytes_peak"].get_uint64().value(), f["bytes_final"].get_uint64().value()};
  run.out = std::move(r.out);
  return run;
}

/// run_filter_on() with `bits`-bit timers.
FilterRun run_timer_on(const std::string& input, const std::string& bits, std::int64_t ticks,
                       std::int64_t window_ms = 10'000) {
  return run_filter_on(input, {"--filter", "timer", "--timer-bits", bits}, ticks, window_ms);
}

/// run_timer_on, with false positives within 1.2x the target, and the
/// memory its stats file reports.
TimerMemory run_timer(const std::string& input, const std::string& bits, std::int64_t ticks) {
  const FilterRun run = run_timer_on(input, bits, ticks);
  const Verdict& v = run.verdict;
  EXPECT_LE(static_cast<double>(v.false_positives),
            1.2 * 0.01 * static_cast<double>(v.not_delivered) + 5)
      << v.false_positives << " false positives of " << v.not_delivered;
  return run.memory;
}

/// The "ts" of every record `kdedup filter` emitted, in order.
std::vector<std::int64_t> emitted_stamps(const std::string& out) {
  std::vector<std::int64_t> stamps;
  simdjson::dom::parser parser;
  for (std::size_t at = 0, next = 0; at < out.size(); at = next + 1) {
    next = out.find('\n', at);
    if (next == std::string::npos) next = out.size();
    auto ts = parser.parse(out.substr(at, next - at))["ts"].get_int64();
    EXPECT_FALSE(ts.error()) << out.substr(at, next - at);
    if (!ts.error()) stamps.push_back(ts.value());
  }
  return stamps;
}

/// Bytes of a timer filter with `bits`-bit timers and `ticks` ticks a
/// window at fpp 1%, pre-sized for `ids` identities a window.
double presized_timer_bytes(const std::string& bits, std::int64_t ticks, std::uint64_t ids) {
  filter::FilterConfig c;
  c.type = filter::FilterType::kTimer;
  c.timer_bits = static_cast<std::uint8_t>(std::stoi(bits));
  c.ticks_per_window = static_cast<std::uint32_t>(ticks);
  c.fpp = 0.01;
  return static_cast<double>(presized_bytes(c, ids));
}

/// For each (timer bits, ticks per window): the memory of a run of
/// `climbing_input`, at its peak and at its end, within 1.25x of what a run
/// of `steady_input` (the higher rate from the start) ends at.
void expect_climb_held(const std::string& climbing_input, const std::string& steady_input,
                       const std::vector<std::pair<std::string, std::int64_t>>& widths) {
  for (const auto& [bits, ticks] : widths) {
    SCOPED_TRACE(bits);
    const TimerMemory climbing = run_timer(climbing_input, bits, ticks);
    const TimerMemory steady = run_timer(steady_input, bits, ticks);
    EXPECT_LE(static_cast<double>(climbing.peak), 1.25 * static_cast<double>(steady.final))
        << climbing.peak << " bytes at the peak of the climb, " << steady.final << " steady";
    EXPECT_LE(static_cast<double>(climbing.final), 1.25 * static_cast<double>(steady.final))
        << climbing.final << " bytes after the climb, " << steady.final << " steady";
  }
}

TEST(FilterCli, TimerFilterShrinksInPlaceWhenTheRateFalls) {
  // The rate of new identities falls by 30% after two windows: too little
  // for a fold by an integer factor, so the filter merges line pairs. Four
  // windows later it holds about what a filter that saw the lower rate from
  // the start holds (it kept the sub-filter sized for the higher rate
  // before: 1.4-1.5x), with no false negative and false positives within
  // the target.
  const std::string falling_input = stepped_stream(2.0, 1.4),
                    steady_input = stepped_stream(1.4, 1.4);
  for (const auto& [bits, ticks] :
       {std::pair<std::string, std::int64_t>{"4", 8}, {"8", 100}, {"16", 1000}}) {
    SCOPED_TRACE(bits);
    const std::uint64_t falling = run_timer(falling_input, bits, ticks).final;
    const std::uint64_t steady = run_timer(steady_input, bits, ticks).final;
    EXPECT_LE(static_cast<double>(falling), 1.2 * static_cast<double>(steady))
        << falling << " bytes after the fall, " << steady << " steady";
  }
}

TEST(FilterCli, TimerFilterGrowsInPlaceWhenTheRateClimbs) {
  // The rate of new identities doubles after two windows. Where the filter
  // sealed its full sub-filter and added one sized for the new rate, it
  // held both for a window (its peak 1.57-1.63x what a run that saw the
  // higher rate from the start ends at); it now copies its lines into twice
  // as many, every live entry kept, and its peak stays within 1.25x of that
  // (1.00-1.02x), with no false negative and false positives within the
  // target.
  const std::string climbing_input = stepped_stream(1.0, 2.0),
                    steady_input = stepped_stream(2.0, 2.0);
  expect_climb_held(climbing_input, steady_input, {{"4", 8}, {"8", 100}, {"16", 1000}});
}

TEST(FilterCli, TimerFilterShrunkGrowsInPlaceWhenTheRateClimbsBack) {
  // The rate of new identities falls by 30% after two windows (the filter
  // merges line pairs), then doubles for three. The shrunk filter grows in
  // place too, keeping its shape, where it was sealed beside a new
  // sub-filter before: the climb's peak is within 1.25x of what a run at the
  // higher rate from the start ends at (1.06-1.08x; the build before held
  // both: 1.57-1.61x), and it ends within 1.25x of that, with no false
  // negative and false positives within the target. (A 4-bit filter's tick
  // is an eighth of the window: the step fills it within one tick, and it
  // is sealed, 1.42x either way.)
  const std::string climbing_input = phased_stream({{1.0, 20'000}, {0.7, 20'000}, {1.4, 30'000}}),
                    steady_input = phased_stream({{1.4, 70'000}});
  expect_climb_held(climbing_input, steady_input, {{"8", 100}, {"16", 1000}});
}

TEST(FilterCli, TimerFilterSizedInTheFirstWindowShrinksOnceTheRateIsKnown) {
  // family_bench's "zipf1 steady" stream: 196,608 identities a 10 s window
  // drawn Zipf(1) from a domain ten times that. The rate of new identities
  // falls through the first window as the popular ones recur, and the
  // sub-filter sized from its first ticks is too large for what the window
  // comes to hold. Memory is read from the binary's final figure on
  // prefixes that end 1/16 .. 4/16 of a window after the first: at most 2x
  // the pre-sized figure for the most the window held (8-bit 1.82x; it kept
  // its size until it had lived a window before: 2.20x; 16-bit 1.12x either
  // way), with no false negative and false positives on first queries
  // within the target (one false positive on a popular identity repeats at
  // each of its records).
  StreamSpec spec;
  spec.distribution = Distribution::kZipf;
  constexpr std::uint64_t kFine = kFineTicksPerWindow;
  spec.base_rate = 48;
  spec.domain = 10 * 48 * kFine;
  spec.ticks = kFine * 5 / 4;
  spec.seed = 7;
  const std::vector<Event> events = generate_stream(spec);
  for (const auto& [bits, ticks] : {std::pair<std::string, std::int64_t>{"8", 192}, {"16", 4096}}) {
    SCOPED_TRACE(bits);
    std::uint64_t most_bytes = 0;
    std::size_t most_in_window = 0;
    for (std::int64_t cut = 1; cut <= 4; ++cut) {
      const std::int64_t end_ms = 10'000 + cut * 10'000 / 16;
      std::string input;
      for (const Event& e : events) {
        const auto ts = static_cast<std::int64_t>(e.tick * 10'000 / kFine);
        if (ts >= end_ms) break;
        // Ids below 2^63: the judge reads them as signed numbers.
        input +=
            "{\"id\":" + std::to_string(e.fp.hi >> 1) + ",\"ts\":" + std::to_string(ts) + "}\n";
      }
      const FilterRun run = run_timer_on(input, bits, ticks);
      const Verdict& v = run.verdict;
      EXPECT_LE(static_cast<double>(v.first_query_false_positives),
                1.2 * 0.01 * static_cast<double>(v.first_queries) + 5)
          << v.first_query_false_positives << " of " << v.first_queries << " first queries";
      most_bytes = std::max(most_bytes, run.memory.final);
      // What the window holds at the end: the records emitted in its last
      // 10 s (each a distinct identity).
      const std::vector<std::int64_t> emitted = emitted_stamps(run.out);
      const auto in_window = static_cast<std::size_t>(
          std::count_if(emitted.begin(), emitted.end(),
                        [&](std::int64_t ts) { return ts > end_ms - 1 - 10'000; }));
      most_in_window = std::max(most_in_window, in_window);
    }
    const double presized = presized_timer_bytes(bits, ticks, most_in_window);
    EXPECT_LE(static_cast<double>(most_bytes), 2.0 * presized)
        << static_cast<double>(most_bytes) / presized << "x the pre-sized figure for "
        << most_in_window;
  }
}

TEST(FilterCli, CompactFilterMemoryFollowsABurst) {
  // 5 new identities a millisecond (50,000 a 10 s window: 100-130 KiB, over
  // the 64 KiB floor), then a burst: 2x for a window, or 5x for half a
  // window, then 5 again. Two windows after the burst, and the quarter
  // window over which the rate of new identities is measured, the filter
  // is back within 1.5x of what the steady stream holds (one table: the
  // burst's tables are folded, or replaced and drained), with no false
  // negative, and identities falsely dropped within 1.2x the target (per
  // record up to twice that: an identity whose fingerprint matched a live
  // entry matches it again when it is sent 3 s later).
  const std::string steady = phased_stream({{5.0, 55'000}});
  const std::string doubled = phased_stream({{5.0, 20'000}, {10.0, 10'000}, {5.0, 25'000}});
  const std::string fivefold = phased_stream({{5.0, 20'000}, {25.0, 5'000}, {5.0, 25'000}});
  for (const double fpp : {0.01, 0.001}) {
    SCOPED_TRACE(fpp);
    // Each identity is new once: identities falsely dropped within 1.2x the
    // target (per record up to twice that: an identity whose fingerprint
    // matched a live entry matches it again when it is sent 3 s later).
    auto expect_within_target = [fpp](const Verdict& v) {
      EXPECT_LE(static_cast<double>(v.identities_dropped),
                1.2 * fpp * static_cast<double>(v.identities_new) + 5)
          << v.identities_dropped << " identities falsely dropped of " << v.identities_new;
      EXPECT_LE(static_cast<double>(v.false_positives),
                2 * 1.2 * fpp * static_cast<double>(v.not_delivered) + 5)
          << v.false_positives << " false positives of " << v.not_delivered;
    };
    const CompactRun held = run_compact(steady, fpp, 10'000);
    expect_within_target(held.verdict);
    EXPECT_GT(held.bytes_final, 64u * 1024) << "the steady stream must need more than the floor";
    for (const std::string* input : {&doubled, &fivefold}) {
      const CompactRun after = run_compact(*input, fpp, 10'000);
      expect_within_target(after.verdict);
      EXPECT_GT(after.bytes_peak, 2 * held.bytes_peak) << "the burst must have grown the filter";
      EXPECT_LE(static_cast<double>(after.bytes_final), 1.5 * static_cast<double>(held.bytes_final))
          << after.bytes_final << " bytes after the burst, " << held.bytes_final << " steady";
    }
  }
}

// family_bench's streams (streams.h) as records: 48 events every 10 ms,
// six windows of 40.96 s with `factor` times the rate in the middle two;
// uniform draws over a domain of one window's events (196,608 identities),
// or Zipf draws over ten times that; `scale` times as many events and
// identities (family_bench --scale).
std::string stream_records(Distribution dist, double factor, double scale = 1.0) {
  StreamSpec spec;
  spec.distribution = dist;
  spec.base_rate = 48 * scale;
  spec.domain = static_cast<std::uint64_t>((dist == Distribution::kUniform ? 1 : 10) *
                                           spec.base_rate * kFineTicksPerWindow);
  spec.ticks = 6 * kFineTicksPerWindow;
  spec.burst_factor = factor;
  spec.seed = 7;
  std::string input;
  EventStream events(spec);
  for (Event e; events.next(e);) {
    input += "{\"id\":" + std::to_string(e.fp.lo >> 2) + ",\"ts\":" + std::to_string(e.tick * 10) +
             "}\n";
  }
  return input;
}

// The most records of `out` emitted within one window of `window_ms` (each
// a distinct identity).
std::size_t most_emitted_within(const std::string& out, std::int64_t window_ms) {
  return most_within(emitted_stamps(out), window_ms);
}

// The most records of `out` emitted within `ticks` consecutive ticks of
// `tick_ms` (from stamp 0).
std::size_t most_emitted_in_ticks(const std::string& out, std::int64_t tick_ms,
                                  std::int64_t ticks) {
  std::map<std::int64_t, std::size_t> per_tick;
  for (const std::int64_t at : emitted_stamps(out)) ++per_tick[at / tick_ms];
  std::size_t most = 0;
  for (const auto& [tick, n] : per_tick) {
    std::size_t sum = 0;
    for (auto it = per_tick.lower_bound(tick - ticks + 1); it->first <= tick; ++it)
      sum += it->second;
    most = std::max(most, sum);
  }
  return most;
}

// family_bench's uniform 5x burst at `scale` through `kdedup filter` with 8-
// and 16-bit timers: false positives on first queries within the target,
// and memory at its peak (the stats file) above and within 2x of the
// pre-sized figure for the most records emitted within a window.
void expect_repeats_burst_held(double scale) {
  const std::string input = stream_records(Distribution::kUniform, 5, scale);
  for (const auto& [bits, ticks] : {std::pair<std::string, std::int64_t>{"8", 192}, {"16", 4096}}) {
    SCOPED_TRACE(bits);
    const FilterRun run = run_timer_on(input, bits, ticks, 40'960);
    const Verdict& v = run.verdict;
    EXPECT_LE(static_cast<double>(v.first_query_false_positives),
              1.2 * 0.01 * static_cast<double>(v.first_queries) + 5)
        << v.first_query_false_positives << " of " << v.first_queries << " first queries";
    const std::size_t most_in_window = most_emitted_within(run.out, 40'960);
    const double presized = presized_timer_bytes(bits, ticks, most_in_window);
    std::printf("%s-bit: peak %.2fx the pre-sized figure for %zu\n", bits.c_str(),
                static_cast<double>(run.memory.peak) / presized, most_in_window);
    EXPECT_GT(static_cast<double>(run.memory.peak), presized) << "the burst must grow the filter";
    EXPECT_LE(static_cast<double>(run.memory.peak), 2.0 * presized)
        << static_cast<double>(run.memory.peak) / presized << "x the pre-sized figure for "
        << most_in_window;
  }
}

TEST(FilterCli, CompactFilterMemoryFollowsABurstOfRepeats) {
  // A burst of repeats, through the binary: the uniform stream's identities
  // come back again and again, 5x as often during the burst. When it ends,
  // the rate of new identities dips (the burst's identities are still in
  // the window, so they come back as duplicates) and climbs back over a
  // window as they leave it. Two windows after the burst the filter holds
  // one table within 1.5x of what the steady stream holds at its end, with
  // no false negative and false positives within the target. (The library's
  // test AfterAUniformBurstItEndsOnOneTable runs the same stream.)
  const std::string steady = stream_records(Distribution::kUniform, 1),
                    burst = stream_records(Distribution::kUniform, 5);
  for (const double fpp : {0.01, 0.1}) {
    SCOPED_TRACE(fpp);
    const CompactRun held = run_compact(steady, fpp, 40'960);
    EXPECT_GT(held.bytes_final, 64u * 1024) << "the steady stream must need more than the floor";
    EXPECT_EQ(held.subfilters_final, 1u);
    const CompactRun after = run_compact(burst, fpp, 40'960);
    // Identities come back new many times: false positives per first query
    // (the first record of an identity not delivered within the window).
    for (const CompactRun* run : {&held, &after}) {
      const Verdict& v = run->verdict;
      EXPECT_LE(static_cast<double>(v.first_query_false_positives),
                1.2 * fpp * static_cast<double>(v.first_queries) + 5)
          << v.first_query_false_positives << " false positives of " << v.first_queries
          << " first queries";
    }
    // Against the steady stream's end: its peak is its first window's,
    // whose first tick brings only new identities (docs/performance.md).
    EXPECT_GT(after.bytes_peak, 2 * held.bytes_final) << "the burst must have grown the filter";
    EXPECT_EQ(after.subfilters_final, 1u);
    EXPECT_LE(static_cast<double>(after.bytes_final), 1.5 * static_cast<double>(held.bytes_final))
        << after.bytes_final << " bytes after the burst, " << held.bytes_final << " steady";
  }
}

TEST(FilterCli, TimerFilterHoldsABurstOfRepeatsWithinTwiceWhatItsPeakNeeds) {
  // The same burst of repeats on the timer filter (family_bench's "uniform
  // 5x burst"). New identities arrive fast at the burst's start and fewer
  // as the domain fills; the filter expands for what the share of repeats
  // says the window can hold, and keeps its size through the echo a window
  // later. Memory at its peak (the stats file) within 2x of the pre-sized
  // figure for the most the window held (the records emitted within any
  // window): 8-bit 1.62x, 16-bit 1.81x, where it expanded by 4 for the
  // burst's first rate before (2.93x and 2.98x); no false negative, false
  // positives on first queries within the target.
  expect_repeats_burst_held(1.0);
}

TEST(FilterCli, TimerFilterHoldsABurstOfRepeatsWithOneExpansionAtAFifthOfTheScale) {
  // The same burst at a fifth of its size (39k draws a window from a
  // domain of as many identities). The burst's first expansion by 2 is
  // enough once the copied entries leave and the domain fills; the filter
  // expanded by 2 again a few ticks later, and held twice the memory the
  // burst needed (2.86x at both widths, where family_bench's own scale
  // held by a few percent of room). Now 1.59x at 8 bits and 1.76x at 16
  // against the most records emitted within a window (the stats file's
  // peak counts the first window too); no false negative, false positives
  // on first queries within the target.
  expect_repeats_burst_held(0.2);
}

// The records of `input` (stream_records(): stamps in order) stamped at
// most `last_ms`.
std::string records_through(const std::string& input, std::int64_t last_ms) {
  std::size_t end = 0;
  while (end < input.size()) {
    const std::size_t ts = input.find("\"ts\":", end);
    if (std::stoll(input.substr(ts + 5)) > last_ms) break;
    end = input.find('\n', ts) + 1;
  }
  return input.substr(0, end);
}

TEST(FilterCli, TimerFilterShrinksItsFirstSubFilterWithTheFirstRecordAfterTheFirstWindow) {
  // family_bench's "zipf1 steady" at a tenth of its size (about 8k
  // identities a window of 40.96 s) on 16-bit timers (4,096 ticks of
  // 10 ms). The sub-filter added at 3.3 s is sized from the rate of the
  // stream's first seconds, twice what the window reaches as the popular
  // identities recur. Up to the window's last tick the filter keeps it
  // (everything in it is alive); the first record after the window finds
  // it shrunk to what the window holds (the library's test
  // AYoungSubFilterShrinksInTheTickTheStreamHasLivedAWindow), where it was
  // held a few seconds longer beside the first window's probe (2.2x the
  // pre-sized figure). No false negative, false positives on first queries
  // within the target.
  const std::string all = stream_records(Distribution::kZipf, 1, 0.1);
  const FilterRun last_tick = run_timer_on(records_through(all, 40'960), "16", 4096, 40'960);
  const FilterRun next_tick = run_timer_on(records_through(all, 40'970), "16", 4096, 40'960);
  const std::size_t most_in_window = most_emitted_within(next_tick.out, 40'960);
  const double presized = presized_timer_bytes("16", 4096, most_in_window);
  std::printf("window's last tick: %.2fx, the next: %.2fx the pre-sized figure for %zu\n",
              static_cast<double>(last_tick.memory.final) / presized,
              static_cast<double>(next_tick.memory.final) / presized, most_in_window);
  EXPECT_GT(static_cast<double>(last_tick.memory.final), 2.0 * presized)
      << "the first window's sub-filters are all alive at its last tick";
  EXPECT_LE(static_cast<double>(next_tick.memory.final), 2.0 * presized);
  for (const FilterRun* run : {&last_tick, &next_tick}) {
    const Verdict& v = run->verdict;
    EXPECT_LE(static_cast<double>(v.first_query_false_positives),
              1.2 * 0.01 * static_cast<double>(v.first_queries) + 5)
        << v.first_query_false_positives << " of " << v.first_queries << " first queries";
  }
}

TEST(FilterCli, TimerFilterFoldsItsSealedPartWhenItExpandsOnASkewedBurst) {
  // family_bench's "zipf1 5x burst" on a 4-bit timer filter (a tick is an
  // eighth of the 40.96 s window): the step seals the active within a
  // tick; its successor expands in place a few ticks later, while the
  // sealed one still drains, and the sealed one folds in the same tick
  // (the library's test ASealedSubFilterFoldsInTheTickTheActiveExpands).
  // Memory at its peak within 2x of the pre-sized figure for the most
  // records emitted within the ticks an entry lives (the window's 8 ticks
  // of 5.12 s and the current one: a fifth of the window more than 40.96 s
  // here); no false negative, false positives on first queries within the
  // target.
  const std::string input = stream_records(Distribution::kZipf, 5);
  const FilterRun run = run_timer_on(input, "4", 8, 40'960);
  const Verdict& v = run.verdict;
  EXPECT_LE(static_cast<double>(v.first_query_false_positives),
            1.2 * 0.01 * static_cast<double>(v.first_queries) + 5)
      << v.first_query_false_positives << " of " << v.first_queries << " first queries";
  const std::size_t most_in_window = most_emitted_in_ticks(run.out, 5'120, 8 + 1);
  const double presized = presized_timer_bytes("4", 8, most_in_window);
  EXPECT_GT(static_cast<double>(run.memory.peak), presized) << "the burst must grow the filter";
  EXPECT_LE(static_cast<double>(run.memory.peak), 2.0 * presized)
      << static_cast<double>(run.memory.peak) / presized << "x the pre-sized figure for "
      << most_in_window;
}

// run_filter_on() over 40.96 s windows (no false negative), false
// positives within the target.
FilterRun run_long_window(const std::string& input, std::vector<std::string> filter_args,
                          std::int64_t ticks) {
  FilterRun run = run_filter_on(input, std::move(filter_args), ticks, 40'960);
  const Verdict& v = run.verdict;
  EXPECT_LE(static_cast<double>(v.false_positives),
            1.2 * 0.01 * static_cast<double>(v.not_delivered) + 5)
      << v.false_positives << " false positives of " << v.not_delivered;
  return run;
}

// run_long_window() with `bits`-bit timers.
FilterRun run_long_window(const std::string& input, const std::string& bits, std::int64_t ticks) {
  return run_long_window(input, {"--filter", "timer", "--timer-bits", bits}, ticks);
}

// family_bench's "step sustained for two windows" at a quarter of its
// size (`per_window` 24k) or at its size (96k): `per_window` new
// identities a 40.96 s window for three windows, then `factor` times that
// for two, then `per_window` again, every identity sent once.
std::string step_stream(double factor, double per_window = 24'000) {
  const double per_ms = per_window / 40'960;
  return phased_stream({{per_ms, 3 * 40'960}, {factor * per_ms, 2 * 40'960}, {per_ms, 40'960}},
                       false);
}

// run_long_window() at 8 bits (192 ticks) and 16 (4,096): memory at its
// peak (the stats file) within `bound` x (issue 14's 2x unless given) the
// pre-sized figure for the most records emitted within a window.
void expect_held(const std::string& input, double bound = 2.0) {
  for (const auto& [bits, ticks] : {std::pair<std::string, std::int64_t>{"8", 192}, {"16", 4096}}) {
    SCOPED_TRACE(bits);
    const FilterRun run = run_long_window(input, bits, ticks);
    const std::size_t most_in_window = most_emitted_within(run.out, 40'960);
    const double presized = presized_timer_bytes(bits, ticks, most_in_window);
    std::printf("%s-bit: peak %.2fx the pre-sized figure for %zu\n", bits.c_str(),
                static_cast<double>(run.memory.peak) / presized, most_in_window);
    EXPECT_LE(static_cast<double>(run.memory.peak), bound * presized)
        << static_cast<double>(run.memory.peak) / presized << "x the pre-sized figure for "
        << most_in_window;
  }
}

TEST(FilterCli, TimerFilterExpandsForAStepToSixTimesTheLoad) {
  // A 6x step: the active expands in place for it (the library's test
  // AStepToSeveralTimesTheLoadExpandsTheActiveRatherThanSealingIt): 1.31x
  // at 8 bits and 1.10x at 16, where the expansion was judged against a
  // successor capped at 4x the window and the seal it left held two full
  // sub-filters side by side (3.37x and 3.59x).
  expect_held(step_stream(6));
}

TEST(FilterCli, TimerFilterSizesItsThirdSubFilterFromTheRateOnAStepToFortyTimesTheLoad) {
  // A 40x step: the rate outruns 4x the window, and the sub-filter added
  // 4x the window fills within an eighth of a window; its successor is
  // sized from the rate that filled it (the library's test
  // AStepToFortyTimesTheLoadSizesItsThirdSubFilterFromTheRate), where a
  // second 4x one came first: 1.58x at both widths, 2.17x (8 bits) and
  // 2.13x (16) before; 1.49x at both once the one before it holds at most
  // 1.5x the window.
  expect_held(step_stream(40));
}

TEST(FilterCli, TimerFilterAtFourBitsExpandsOnceForAStepToTenTimesTheLoad) {
  // The same stream with a 10x step on 4-bit timers (8 ticks of 5.12 s):
  // the step's first tick seals the active, and its successor, sized from
  // that part of the tick, expands once, by what the window's schedule
  // needs (the library's test
  // ATenfoldStepOnAFourBitFilterExpandsItsSuccessorOnce), where it
  // expanded by 2 twice and was sealed beside a third sub-filter: 3.00x the
  // pre-sized figure for the most records emitted within the ticks an
  // entry lives (the window's 8 and the current one). Now 2.00x: issue
  // 14's 2x is met only just here (2.02x at a third of the size; 1.72x on
  // either build from two thirds of it on), as one expansion by 3, the
  // next factor after 2, of a successor sized from part of a tick gives.
  // The test holds the peak to what that one expansion gives (2.1x), no
  // false negative, false positives within the target.
  const FilterRun run = run_long_window(step_stream(10), "4", 8);
  const std::size_t most_in_window = most_emitted_in_ticks(run.out, 5'120, 8 + 1);
  const double presized = presized_timer_bytes("4", 8, most_in_window);
  std::printf("peak %.2fx the pre-sized figure for %zu\n",
              static_cast<double>(run.memory.peak) / presized, most_in_window);
  EXPECT_LE(static_cast<double>(run.memory.peak), 2.1 * presized)
      << static_cast<double>(run.memory.peak) / presized << "x the pre-sized figure for "
      << most_in_window;
}

// family_bench's "A burst shorter than the window" at a quarter of its
// size (`per_window` 24k) or at its size (96k): `per_window` new
// identities a 40.96 s window, and in the fourth window that many and a
// twenty-fourth more (25k, 100k) within 8 ms.
std::string burst_within_a_tick(double per_window = 24'000) {
  const double per_ms = per_window / 40'960;
  return phased_stream(
      {{per_ms, 3 * 40'960}, {per_ms + per_window * 25 / 24 / 8, 8}, {per_ms, 3 * 40'960}}, false);
}

TEST(FilterCli, TimerFilterSealsBesideASubFilterSizedForTheWindowOnABurstWithinATick) {
  // family_bench's "A burst shorter than the window" at a quarter of its
  // size: 24k new identities a 40.96 s window, and in the fourth window
  // 25k more within 8 ms (within one tick at 8 and 16 bits). The burst
  // seals the active; its successor was sized for the burst's rate over a
  // window, capped at 4x what the window held, and held beside it for a
  // window: 3.5x the pre-sized figure for the most records emitted within
  // a window. It now holds at most 1.5x what the window holds (the
  // library's test
  // ABurstWithinATickSealsBesideASubFilterSizedForTheWindowNotTheBurst).
  expect_held(burst_within_a_tick());
}

TEST(FilterCli, TimerFilterExpandsWhileRoomIsLeftOnAGentleClimb) {
  // family_bench's burst over a whole window at a quarter of its size: 24k
  // new identities a 40.96 s window, and for the fourth window 25k more
  // (about twice the rate). At 16 bits the active expanded with the room
  // of 2 ticks left, and the copies alone had to keep up: by 3 (the
  // library's test AGentleClimbExpandsTheActiveWhileRoomIsLeft). It now
  // expands once its room would last fewer than a quarter of W / 8 ticks,
  // by 2: 1.29x the pre-sized figure for the most records emitted within a
  // window at both widths, where 16 bits read 1.94x (2.01x at
  // family_bench's size). The test holds the peak to 1.5x, what the one
  // expansion by 2 gives.
  constexpr double kPerMs = 24'000.0 / 40'960;
  expect_held(
      phased_stream(
          {{kPerMs, 3 * 40'960}, {kPerMs + 25'000.0 / 40'960, 40'960}, {kPerMs, 3 * 40'960}},
          false),
      1.5);
}

TEST(FilterCli, AgingFilterTakesABurstWithinATickForNoMoreThanItBrings) {
  // The same burst within a tick through the aging filter (192 ticks a
  // window): each slice of the burst's tick was sized for the tick's rate
  // so far over a generation, the last ones for millions of identities
  // (4.63x the pre-sized figure for the most records emitted within a
  // window here, 5.45x at family_bench's size). Past the first window, a
  // generation sized from the tick in progress holds at most 4x the
  // window's share of one (the library's test
  // TheAgingFilterDoesNotTakeABurstWithinATickForAWindowAtItsRate): 1.57x
  // here (1.60x with slices sized at ln 2, before kRunHeadroom). Memory at
  // its peak within issue 14's 2x of the pre-sized figure, no false
  // negative, false positives within the target.
  const FilterRun run =
      run_long_window(burst_within_a_tick(), std::vector<std::string>{"--filter", "aging"}, 192);
  filter::FilterConfig c;
  c.type = filter::FilterType::kAging;
  c.ticks_per_window = 192;
  c.fpp = 0.01;
  const std::size_t most_in_window = most_emitted_within(run.out, 40'960);
  const auto presized = static_cast<double>(presized_bytes(c, most_in_window));
  std::printf("peak %.2fx the pre-sized figure for %zu\n",
              static_cast<double>(run.memory.peak) / presized, most_in_window);
  EXPECT_LE(static_cast<double>(run.memory.peak), 2.0 * presized)
      << static_cast<double>(run.memory.peak) / presized << "x the pre-sized figure for "
      << most_in_window;
}

TEST(FilterCli, AgingFilterHoldsItsTargetAfterABurstWithinATick) {
  // The same stream: every identity is sent once, so each record of it not
  // emitted is a false positive. The burst's tick adds generations to the
  // window (17 at family_bench's size; a query matches k consecutive
  // slices, and each one more is a run of k more), and with slices sized
  // at ln 2 the filter dropped
  // 1.14% of the records of the quarter window from the burst on, at fpp
  // 1% (the library's test TheAgingFilterHoldsItsTargetAlongARisingRate:
  // 1.26% at family_bench's size). Sized for kRunHeadroom more generations:
  // 0.88%, within the target.
  const std::string input = burst_within_a_tick();
  const FilterRun run = run_long_window(input, std::vector<std::string>{"--filter", "aging"}, 192);
  constexpr std::int64_t kBurst = 3 * 40'960, kQuarter = 40'960 / 4;
  auto in_quarter = [&](const std::vector<std::int64_t>& stamps) {
    return static_cast<std::size_t>(std::count_if(stamps.begin(), stamps.end(), [&](auto ts) {
      return ts >= kBurst && ts < kBurst + kQuarter;
    }));
  };
  const std::size_t sent = in_quarter(emitted_stamps(input));
  const std::size_t emitted = in_quarter(emitted_stamps(run.out));
  ASSERT_GT(sent, 25'000U);
  ASSERT_LE(emitted, sent);
  const std::size_t dropped = sent - emitted;
  std::printf("dropped %zu of %zu (%.2f%%) in the quarter window from the burst\n", dropped, sent,
              100.0 * static_cast<double>(dropped) / static_cast<double>(sent));
  EXPECT_LE(static_cast<double>(dropped), 0.01 * static_cast<double>(sent))
      << dropped << " of " << sent;
}

// run_long_window() with the compact filter (10 ticks of 4.096 s): memory at
// its peak (the stats file) over the pre-sized figure for the most records
// emitted within the ticks an entry lives (the window's 10 and the current
// one).
double compact_peak_ratio(const std::string& input) {
  const FilterRun run = run_long_window(input, std::vector<std::string>{"--filter", "compact"}, 10);
  filter::FilterConfig c;
  c.type = filter::FilterType::kCompact;
  c.ticks_per_window = 10;
  c.fpp = 0.01;
  const std::size_t most_in_window = most_emitted_in_ticks(run.out, 4'096, 10 + 1);
  const auto presized = static_cast<double>(presized_bytes(c, most_in_window));
  const double ratio = static_cast<double>(run.memory.peak) / presized;
  std::printf("peak %.2fx the pre-sized figure for %zu\n", ratio, most_in_window);
  return ratio;
}

TEST(FilterCli, CompactFilterSizesATableAddedInASurgeFromWhatItsPredecessorTook) {
  // The burst within a tick through the compact filter: the active fills
  // within the burst's tick, and so does the table added for it; the third
  // was sized for the tick so far over a whole window, and held beside the
  // two for two ticks before it folded: 9.08x the pre-sized figure for the
  // most records emitted within the ticks an entry lives. It now holds at
  // most kMaxGrowthStep (4) x what the second took (the library's test
  // TheCompactFilterSizesATableAddedInASurgeFromWhatItsPredecessorTook):
  // 3.81x. A 6x step that lasts is sized from its whole ticks once seen,
  // and its rate-sized table, one remainder bit finer than the target
  // needs, is no longer replaced for a 2.7% saving (a window with two
  // tables): 2.03x before, 1.50x now. No false negative, false positives
  // within the target.
  // At family_bench's size: at a quarter of it the 64 KiB floor holds the
  // window, and the burst fills only the floor (3.60x on either build).
  EXPECT_LE(compact_peak_ratio(burst_within_a_tick(96'000)), 4.0);
  EXPECT_LE(compact_peak_ratio(step_stream(6, 96'000)), 2.0);
}

}  // namespace
}  // namespace kdedup::testing
