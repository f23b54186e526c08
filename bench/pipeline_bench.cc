// Pipeline throughput on the test broker: the same harness measures
// `kdedup run` with the filter off (filter.enabled: false, passthrough: every
// record is distinct) and on (timer filter, fpp 0.01), one after the other in
// one run, and prints records/s for both and their ratio (target >= 0.9).
//
// Each measurement: fresh test broker and one `kdedup run` instance; a small
// warm-up batch is produced and fully committed first (group joined,
// partitions assigned), then the timed batch is produced while the instance
// consumes it concurrently; the clock stops when the group has committed
// every input offset (output is delivered before offsets are committed).
// The test broker keeps at most ~5 MiB per partition, so the harness checks
// that every input and output partition still starts at offset 0, that the
// input holds every record and that passthrough emitted every record.
//
// Modes alternate (passthrough, dedup, passthrough, ...) --repeat times and
// the median of each is reported, so load from other processes on the
// machine hits both alike.
//
//   pipeline_bench [--records N] [--partitions P] [--instances I] [--repeat R]

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "kdedup/testbroker/click_stream.h"
#include "kdedup/testbroker/kafka_io.h"
#include "kdedup/testbroker/pipeline_rig.h"

namespace {

namespace tb = kdedup::testbroker;
using Clock = std::chrono::steady_clock;

constexpr const char* kConfig = R"(group_id: kdedup-bench
input:
  topics: [clicks]
output:
  topic: clicks-distinct
identity:
  extractor: key
  salt: bench-salt
window: 1m
max_future_skew: 10s
filter:
  type: timer
  fpp: 0.01
  capacity: 100000
threads: 2
on_invalid: dlq
dlq_topic: clicks-dlq
commit_interval: 200ms
shutdown_timeout: 10s
kafka:
  bootstrap.servers: ${KDEDUP_BOOTSTRAP}
state:
  dir: /tmp/kdedup-bench-state
log_level: warn
)";

struct Options {
  std::uint64_t records = 150'000;
  int partitions = 8;
  int instances = 1;
  int repeat = 3;
};

struct Measurement {
  double records_per_s = 0;
  double seconds = 0;
  double produce_per_s = 0;  ///< the producer's own rate in the timed window
  std::int64_t output = 0;
};

kdedup::Result<Measurement> measure(const Options& opt, const std::string& work,
                                    const std::string& config, bool filter) {
  tb::RigOptions ro;
  ro.kdedup_binary = KDEDUP_BINARY;
  ro.config_path = config;
  ro.work_dir = work + (filter ? "/dedup" : "/passthrough");
  ro.partitions = opt.partitions;
  ro.instances = opt.instances;
  ro.group = "kdedup-bench";
  ro.overrides = {std::string("filter.enabled=") + (filter ? "true" : "false")};
  auto rig = tb::PipelineRig::start(ro);
  if (!rig) return tl::unexpected(rig.error());
  auto& r = **rig;
  auto producer = tb::RecordProducer::create(r.bootstrap(), {{"linger.ms", "20"}});
  if (!producer) return tl::unexpected(producer.error());

  const auto wall = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count();
  tb::ClickStreamOptions so;
  so.records = opt.records + 2'000;
  so.span_ms = 300'000;
  so.start_ms = wall - so.span_ms - 200'000;
  so.seed = 42;  // both modes see the same stream
  tb::ClickStream stream(so);
  tb::Click click;

  auto produce = [&](std::uint64_t n) -> kdedup::Status {
    for (std::uint64_t i = 0; i < n && stream.next(click); ++i) {
      auto ok =
          (*producer)->produce(ro.input_topic, -1, click.key, click.value, click.timestamp_ms);
      if (!ok) return ok;
    }
    return (*producer)->flush(std::chrono::seconds(60));
  };
  auto wait_caught_up = [&](std::chrono::seconds limit) -> kdedup::Status {
    const auto deadline = Clock::now() + limit;
    while (Clock::now() < deadline) {
      if (auto ok = r.check_instances(); !ok) return ok;
      auto p = r.progress();
      if (p && p->caught_up) return {};
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return kdedup::fail("the group did not commit every input offset in time; logs in " +
                        ro.work_dir);
  };

  // Warm-up: the group has joined and every partition is assigned.
  if (auto ok = produce(2'000); !ok) return tl::unexpected(ok.error());
  if (auto ok = wait_caught_up(std::chrono::seconds(90)); !ok) return tl::unexpected(ok.error());

  const auto t0 = Clock::now();
  // Producing on this thread while the instance consumes; progress is checked
  // between produce batches so the timed window ends when all is committed.
  if (auto ok = produce(opt.records); !ok) return tl::unexpected(ok.error());
  const double produce_secs = std::chrono::duration<double>(Clock::now() - t0).count();
  if (auto ok = wait_caught_up(std::chrono::seconds(300)); !ok) return tl::unexpected(ok.error());
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();

  auto marks = tb::query_watermarks(r.bootstrap(), ro.input_topic);
  if (!marks) return tl::unexpected(marks.error());
  std::int64_t stored = 0;
  for (const auto& m : *marks) {
    if (m.low != 0) {
      return kdedup::fail(
          fmt::format("input partition {} was truncated (low watermark {}): "
                      "use fewer records or more partitions",
                      m.partition, m.low));
    }
    stored += m.high;
  }
  if (static_cast<std::uint64_t>(stored) != opt.records + 2'000) {
    return kdedup::fail(
        fmt::format("input holds {} records, produced {}", stored, opt.records + 2'000));
  }
  auto out = tb::query_watermarks(r.bootstrap(), ro.output_topic);
  Measurement m;
  m.seconds = secs;
  m.records_per_s = static_cast<double>(opt.records) / secs;
  m.produce_per_s = static_cast<double>(opt.records) / produce_secs;
  if (!out) return tl::unexpected(out.error());
  for (const auto& w : *out) {
    if (w.low != 0) {
      return kdedup::fail(
          fmt::format("output partition {} was truncated (low watermark {}): "
                      "use fewer records or more partitions",
                      w.partition, w.low));
    }
    m.output += w.high;
  }
  if (!filter && static_cast<std::uint64_t>(m.output) != opt.records + 2'000) {
    return kdedup::fail(
        fmt::format("passthrough emitted {} of {} records", m.output, opt.records + 2'000));
  }
  producer->reset();
  if (auto ok = r.stop_instances(); !ok) return tl::unexpected(ok.error());
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--records")) {
      opt.records = std::strtoull(argv[i + 1], nullptr, 10);
    } else if (!std::strcmp(argv[i], "--partitions")) {
      opt.partitions = std::atoi(argv[i + 1]);
    } else if (!std::strcmp(argv[i], "--instances")) {
      opt.instances = std::atoi(argv[i + 1]);
    } else if (!std::strcmp(argv[i], "--repeat")) {
      opt.repeat = std::max(1, std::atoi(argv[i + 1]));
    } else {
      std::fprintf(
          stderr,
          "usage: pipeline_bench [--records N] [--partitions P] [--instances I] [--repeat R]\n");
      return 2;
    }
  }
  const char* tmp = std::getenv("TMPDIR");
  std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/kdedup-bench-XXXXXX";
  if (!mkdtemp(tmpl.data())) return 1;
  const std::string work = tmpl;
  const std::string config = work + "/bench.yaml";
  std::ofstream(config) << kConfig;

  std::printf(
      "pipeline throughput on the test broker: %llu records, %d partitions, %d "
      "instance(s), producer and pipeline concurrent\n",
      static_cast<unsigned long long>(opt.records), opt.partitions, opt.instances);
  std::vector<Measurement> runs[2];
  for (int round = 0; round < opt.repeat; ++round) {
    for (int mode = 0; mode < 2; ++mode) {
      const bool filter = mode == 1;
      auto m = measure(opt, work + "/" + std::to_string(round), config, filter);
      if (!m) {
        std::fprintf(stderr, "%s: %s\n", filter ? "dedup" : "passthrough",
                     m.error().message.c_str());
        return 1;
      }
      std::printf("  round %d %-18s %10.0f records/s  (%.2f s, %lld out; producer %.0f/s)\n",
                  round + 1, filter ? "dedup" : "passthrough", m->records_per_s, m->seconds,
                  static_cast<long long>(m->output), m->produce_per_s);
      std::fflush(stdout);
      runs[mode].push_back(*m);
    }
  }
  auto median = [](std::vector<Measurement> v) {
    std::sort(v.begin(), v.end(),
              [](auto& a, auto& b) { return a.records_per_s < b.records_per_s; });
    return v[v.size() / 2].records_per_s;
  };
  const double pass = median(runs[0]), dedup = median(runs[1]);
  std::printf("  %-26s %10.0f records/s (median of %d)\n", "passthrough (filter off)", pass,
              opt.repeat);
  std::printf("  %-26s %10.0f records/s (median of %d)\n", "dedup (timer, fpp 0.01)", dedup,
              opt.repeat);
  std::printf("  %-26s %10.3f  (target >= 0.9)\n", "dedup / passthrough", dedup / pass);
  std::error_code ec;
  std::filesystem::remove_all(work, ec);
  return 0;
}
