// `kdedup demo`: the whole service on one machine. Starts the test broker,
// two `kdedup run` instances in one consumer group, produces a click stream
// full of duplicates, reads the output with an independent consumer and
// checks it against the exact semantics (kdedup::testbroker::audit_dedup).
// Exit status 0 only if the check holds.

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "command.h"
#include "kdedup/common/duration.h"
#include "kdedup/config/config.h"
#include "kdedup/pipeline/provenance.h"
#include "kdedup/testbroker/click_stream.h"
#include "kdedup/testbroker/dedup_audit.h"
#include "kdedup/testbroker/kafka_io.h"
#include "kdedup/testbroker/pipeline_rig.h"

namespace {

namespace tb = kdedup::testbroker;
using Clock = std::chrono::steady_clock;

std::atomic<bool> g_interrupted{false};
void on_interrupt(int) { g_interrupted = true; }

constexpr const char* kInternalTopic = "clicks-by-id";

// Used when config/local.yaml is not where the demo runs from: the same
// settings, so `kdedup demo` works from any directory.
constexpr const char* kFallbackConfig = R"(group_id: kdedup-demo
input:
  topics: [clicks]
output:
  topic: clicks-distinct
identity:
  extractor: key
  salt: demo-salt-not-a-secret
window: 1m
max_future_skew: 10s
filter:
  type: timer
  fpp: 0.01
  capacity: 100000
threads: 2
on_invalid: dlq
dlq_topic: clicks-dlq
commit_interval: 500ms
shutdown_timeout: 10s
kafka:
  bootstrap.servers: ${KDEDUP_BOOTSTRAP}
state:
  dir: /tmp/kdedup-demo-state
log_level: info
)";

// Progress on stderr: rewritten in place on a terminal, a plain line every
// few seconds otherwise (logs, CI).
class ProgressLine {
 public:
  ProgressLine() : tty_(isatty(STDERR_FILENO) == 1) {}
  void update(const std::string& text) {
    auto now = Clock::now();
    if (tty_) {
      if (now - last_ < std::chrono::milliseconds(200)) return;
      std::fprintf(stderr, "\r\033[K%s", text.c_str());
    } else {
      if (now - last_ < std::chrono::seconds(3)) return;
      std::fprintf(stderr, "%s\n", text.c_str());
    }
    last_ = now;
  }
  void done() {
    if (tty_) std::fprintf(stderr, "\r\033[K");
  }

 private:
  bool tty_;
  Clock::time_point last_{};
};

std::string self_binary() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("kdedup") : p.string();
}

/// --unkeyed: what the dedup stage read is the internal topic. Its records
/// become the audit's input (identities are partitioned by H_S there, so
/// the per-partition replay is the exact semantics over the whole input),
/// after checking that it holds every input record (kdedup-origin-*).
kdedup::Result<std::vector<tb::AuditInput>> internal_topic_inputs(const std::string& bootstrap,
                                                                  const std::string& topic,
                                                                  std::uint64_t records) {
  auto internal = tb::read_topic(bootstrap, topic, std::chrono::seconds(60));
  if (!internal) return kdedup::fail(internal.error().message);
  std::set<std::pair<std::string, std::string>> origins;
  std::vector<tb::AuditInput> inputs;
  inputs.reserve(internal->size());
  for (const auto& rec : *internal) {
    auto p = rec.header(kdedup::pipeline::kOriginPartitionHeader);
    auto off = rec.header(kdedup::pipeline::kOriginOffsetHeader);
    if (!p || !off) {
      return kdedup::fail(fmt::format("internal topic record {}[{}]@{} has no origin headers",
                                      topic, rec.partition, rec.offset));
    }
    origins.emplace(*p, *off);
    inputs.push_back({rec.partition, rec.offset, rec.key.value_or(""), rec.timestamp_ms});
  }
  if (origins.size() != records) {
    return kdedup::fail(fmt::format(
        "the internal topic holds {} of the {} input records: the repartition stage lost some",
        origins.size(), records));
  }
  return inputs;
}

int fail_with(const std::string& message) {
  std::fprintf(stderr, "kdedup demo: %s\n", message.c_str());
  return 1;
}

int demo_main(int argc, char** argv) {
  CLI::App app{
      "Runs kdedup end to end on this machine: a test broker, N `kdedup run` instances in one "
      "consumer group, a generated click stream with duplicates (Zipf users and ads, retries, "
      "re-posts, click-fraud bursts), then checks the output against the exact semantics. Exit "
      "status 0 only if no duplicate got through, nothing was emitted twice and false positives "
      "stay within the configured rate.",
      "kdedup demo"};
  std::uint64_t records = 100'000;
  int partitions = 4;
  int instances = 2;
  std::uint64_t seed = 1;
  std::string config_path = "config/local.yaml";
  std::string filter_type;
  int timeout_s = 120;
  bool keep_going = false;
  bool unkeyed = false;
  app.add_option("--records", records, "Records to produce")->check(CLI::Range(1, 2'000'000));
  app.add_option("--partitions", partitions, "Input (and output) partitions")
      ->check(CLI::Range(1, 64));
  app.add_option("--instances", instances, "kdedup run instances in the group")
      ->check(CLI::Range(1, 8));
  app.add_option("--seed", seed, "Stream generator seed");
  app.add_option("--config", config_path,
                 "Base config for the instances (a built-in equivalent of config/local.yaml is "
                 "used if the file does not exist)");
  std::vector<std::string> sets;
  app.add_option("--filter", filter_type, "Override filter.type (timer, aging, exact, compact)");
  app.add_option("--set", sets, "Extra config override key.path=value for every instance");
  app.add_option("--timeout", timeout_s, "Seconds to wait for the group to catch up")
      ->check(CLI::Range(5, 3600));
  app.add_flag("--unkeyed", unkeyed,
               "Produce the clicks with random partitioning (copies of one click land in "
               "different partitions) and run with the repartition stage, which re-keys them by "
               "identity into the internal topic '" +
                   std::string(kInternalTopic) + "' first");
  app.add_flag("--keep-going", keep_going,
               "After the summary keep broker and instances running until Ctrl-C (explore with "
               "kcat at the printed bootstrap address)");
  if (auto code = kdedup::app::parse_command_line(app, argc, argv)) return *code;

  struct sigaction sa {};
  sa.sa_handler = on_interrupt;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  // Work dir for logs, state and (if needed) the config.
  const char* tmp = std::getenv("TMPDIR");
  std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/kdedup-demo-XXXXXX";
  if (!mkdtemp(tmpl.data())) return fail_with("cannot create a temporary directory");
  const std::string work = tmpl;
  bool keep_work = false;
  struct WorkDirCleanup {
    const std::string& dir;
    const bool& keep;
    ~WorkDirCleanup() {
      std::error_code ec;
      if (!keep) std::filesystem::remove_all(dir, ec);
    }
  } cleanup{work, keep_work};

  if (!std::filesystem::exists(config_path)) {
    config_path = work + "/demo.yaml";
    std::ofstream(config_path) << kFallbackConfig;
  }
  std::vector<std::string> overrides;
  if (!filter_type.empty()) overrides.push_back("filter.type=" + filter_type);
  overrides.insert(overrides.end(), sets.begin(), sets.end());

  // Validate the config up front and learn the rules the audit must apply.
  auto env = [](const std::string& name) -> std::optional<std::string> {
    if (name == "KDEDUP_BOOTSTRAP") return std::string("127.0.0.1:9092");
    return kdedup::config::process_env()(name);
  };
  auto checked = kdedup::config::check_config_file(config_path, overrides, env);
  if (!checked.ok()) {
    std::string msg = "config " + config_path + " is not valid:";
    for (const auto& i : checked.errors) msg += "\n  " + kdedup::config::to_string(i);
    return fail_with(msg);
  }
  const auto& cfg = *checked.config;
  tb::AuditRules rules;
  rules.scale = cfg.tick_scale();
  rules.fpp = cfg.filter_enabled ? cfg.filter.fpp : 0.0;
  if (cfg.identity.extractor != "key") {
    return fail_with(
        "the demo's stream carries the identity in the record key; the config uses "
        "identity.extractor '" +
        cfg.identity.extractor + "'");
  }

  std::fprintf(stderr,
               "kdedup demo: %llu records, %d partitions, %d instances, window %s, filter %s "
               "(fpp %g), work dir %s\n",
               static_cast<unsigned long long>(records), partitions, instances,
               kdedup::format_duration_ms(cfg.window_ms()).c_str(),
               cfg.filter_enabled ? kdedup::filter::to_string(cfg.filter.type) : "off",
               cfg.filter.fpp, work.c_str());

  tb::RigOptions ro;
  ro.kdedup_binary = self_binary();
  ro.config_path = config_path;
  ro.overrides = overrides;
  ro.work_dir = work;
  ro.partitions = partitions;
  ro.instances = instances;
  if (unkeyed) {
    ro.repartition_topic = kInternalTopic;
    // Two consumer groups per instance: the test broker holds each join
    // phase for session.timeout.ms - 1 s, so the default (45 s) would make a
    // late joiner of either group wait that long, twice.
    ro.overrides.insert(ro.overrides.begin(), "consumer.session.timeout.ms=6000");
  }
  auto rig = tb::PipelineRig::start(ro);
  if (!rig) return fail_with(rig.error().message);
  auto& r = **rig;
  std::fprintf(stderr, "kdedup demo: test broker at %s\n", r.bootstrap().c_str());

  // Produce the stream; delivery reports fill in where each record landed.
  auto producer = tb::RecordProducer::create(r.bootstrap());
  if (!producer) return fail_with(producer.error().message);
  std::vector<tb::AuditInput> inputs(records);
  (*producer)->on_delivery([&](std::uint64_t tag, std::int32_t partition, std::int64_t offset) {
    inputs[tag].partition = partition;
    inputs[tag].offset = offset;
  });
  const auto wall_now = std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
  tb::ClickStreamOptions so;
  so.records = records;
  so.seed = seed;
  so.span_ms = std::max<std::int64_t>(cfg.window_ms() * 5, 60'000);
  so.start_ms = wall_now - so.span_ms - 200'000;  // every timestamp is in the past
  tb::ClickStream stream(so);
  std::uint64_t fraud = 0, retries = 0, reposts = 0;
  ProgressLine progress;
  const auto t0 = Clock::now();
  tb::Click click;
  std::mt19937_64 partition_rng(seed);
  for (std::uint64_t i = 0; stream.next(click); ++i) {
    if (g_interrupted) break;
    fraud += click.kind == tb::Click::Kind::kFraud;
    retries += click.kind == tb::Click::Kind::kRetry;
    reposts += click.kind == tb::Click::Kind::kRepost;
    inputs[i].identity = click.key;
    inputs[i].timestamp_ms = click.timestamp_ms;
    inputs[i].partition = -1;
    const std::int32_t partition =
        unkeyed
            ? static_cast<std::int32_t>(partition_rng() % static_cast<std::uint64_t>(partitions))
            : -1;  // the producer's partitioner on the key
    if (auto ok = (*producer)->produce(ro.input_topic, partition, click.key, click.value,
                                       click.timestamp_ms, {}, i);
        !ok) {
      return fail_with(ok.error().message);
    }
    if (i % 1024 == 0) {
      progress.update(fmt::format("producing: {}/{} records", i, records));
      if (auto ok = r.check_instances(); !ok) return fail_with(ok.error().message);
    }
  }
  if (g_interrupted) return fail_with("interrupted; stopping everything started");
  if (auto ok = (*producer)->flush(std::chrono::seconds(60)); !ok) {
    return fail_with(ok.error().message);
  }
  const auto produced_at = Clock::now();
  producer->reset();  // no client of ours may outlive the broker

  // Wait until the group has committed everything (output is delivered
  // before offsets are committed).
  const auto deadline = Clock::now() + std::chrono::seconds(timeout_s);
  tb::GroupProgress gp;
  while (true) {
    if (g_interrupted) return fail_with("interrupted; stopping everything started");
    if (auto ok = r.check_instances(); !ok) return fail_with(ok.error().message);
    auto p = r.progress();
    if (p) {
      gp = *p;
      const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
      progress.update(fmt::format("deduplicating: {}/{} records committed ({:.0f} records/s)",
                                  gp.committed, gp.end, static_cast<double>(gp.committed) / secs));
      if (gp.caught_up) break;
    }
    if (Clock::now() > deadline) {
      progress.done();
      keep_work = true;
      return fail_with(
          fmt::format("the group committed {} of {} records within {} s; logs kept in {}",
                      gp.committed, gp.end, timeout_s, work));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  const auto caught_up_at = Clock::now();
  progress.done();

  // Nothing truncated by the broker's per-partition limit.
  auto marks = tb::query_watermarks(r.bootstrap(), ro.input_topic);
  if (!marks) return fail_with(marks.error().message);
  std::int64_t stored = 0;
  for (const auto& m : *marks) {
    if (m.low != 0) {
      return fail_with(
          fmt::format("input partition {} was truncated by the test broker (low "
                      "watermark {}); use fewer --records or more --partitions",
                      m.partition, m.low));
    }
    stored += m.high;
  }
  if (static_cast<std::uint64_t>(stored) != records) {
    return fail_with(fmt::format("produced {} records but the input holds {}", records, stored));
  }

  // Independent read of the output and the dead-letter topic.
  auto output = tb::read_topic(r.bootstrap(), ro.output_topic, std::chrono::seconds(60));
  if (!output) return fail_with(output.error().message);
  auto dlq = tb::query_watermarks(r.bootstrap(), ro.dlq_topic);
  std::int64_t dlq_count = 0;
  if (dlq) {
    for (const auto& m : *dlq) dlq_count += m.high - m.low;
  }
  std::vector<tb::AuditOutput> outs;
  outs.reserve(output->size());
  for (const auto& rec : *output) {
    tb::AuditOutput o;
    o.identity = rec.key.value_or("");
    const auto topic = rec.header(kdedup::pipeline::kProvenanceTopicHeader);
    const auto p = rec.header(kdedup::pipeline::kProvenancePartitionHeader);
    const auto off = rec.header(kdedup::pipeline::kProvenanceOffsetHeader);
    kdedup::pipeline::ProvenanceHeaders found;
    if (topic) found.topic = *topic;
    if (p) found.partition = *p;
    if (off) found.offset = *off;
    const auto parsed = kdedup::pipeline::parse_provenance(found);
    if (parsed.provenance) {
      o.source_partition = parsed.provenance->source.partition;
      o.source_offset = parsed.provenance->offset;
    } else if (parsed.malformed) {
      o.source_partition = -1;  // unreadable provenance counts as unknown
    }
    outs.push_back(std::move(o));
  }
  std::uint64_t spread = 0;  // identities whose copies are in more than one input partition
  if (unkeyed) {
    std::map<std::string, std::set<std::int32_t>> partitions_of;
    for (const auto& in : inputs) partitions_of[in.identity].insert(in.partition);
    for (const auto& [id, ps] : partitions_of) spread += ps.size() > 1;
    auto internal = internal_topic_inputs(r.bootstrap(), kInternalTopic, records);
    if (!internal) return fail_with(internal.error().message);
    inputs = std::move(*internal);
  }
  auto report = tb::audit_dedup(inputs, outs, rules);

  const double process_secs = std::chrono::duration<double>(caught_up_at - t0).count();
  const double produce_secs = std::chrono::duration<double>(produced_at - t0).count();
  const std::uint64_t dropped = report.inputs - report.distinct_outputs;
  auto row = [](const char* name, const std::string& value) {
    std::printf("  %-34s %s\n", name, value.c_str());
  };
  std::printf("\nkdedup demo summary\n");
  row("records in", fmt::format("{} ({} retries, {} re-posts, {} click-fraud)", report.inputs,
                                retries, reposts, fraud));
  row("distinct (exact replay)", std::to_string(report.exact_distinct));
  row("distinct out",
      report.outputs == report.distinct_outputs
          ? std::to_string(report.outputs)
          : fmt::format("{} ({} records in total)", report.distinct_outputs, report.outputs));
  row("duplicates dropped", std::to_string(dropped));
  if (unkeyed) {
    row("unkeyed input",
        fmt::format("{} identities have copies in several of the {} partitions; the repartition "
                    "stage re-keyed all {} records into '{}'",
                    spread, partitions, records, kInternalTopic));
  }
  row("false positives observed", fmt::format("{} of {} new records = {:.4f} (configured fpp "
                                              "{:g}, accepted up to {})",
                                              report.false_positives, report.new_candidates,
                                              report.observed_fpp, rules.fpp, report.fp_bound));
  row("false negatives (duplicates out)", std::to_string(report.false_negatives));
  row("emitted twice", std::to_string(report.emitted_twice));
  row("unknown provenance / wrong key", std::to_string(report.unknown_outputs));
  row("dead-lettered", std::to_string(dlq_count));
  row("produce rate", fmt::format("{:.0f} records/s", static_cast<double>(records) / produce_secs));
  row("end-to-end throughput",
      fmt::format("{:.0f} records/s ({} instances, {:.1f} s)",
                  static_cast<double>(records) / process_secs, instances, process_secs));
  for (const auto& p : report.problems) std::printf("  problem: %s\n", p.c_str());
  const bool ok = report.ok() && dlq_count == 0;
  std::printf("  %-34s %s\n\n", "result", ok ? "PASS" : "FAIL");
  std::fflush(stdout);

  if (keep_going && !g_interrupted) {
    std::fprintf(
        stderr,
        "kdedup demo: still running; try\n  kcat -b %s -C -t %s -e -f '%%k %%h\\n' | head\n"
        "Ctrl-C stops everything.\n",
        r.bootstrap().c_str(), ro.output_topic.c_str());
    while (!g_interrupted) {
      if (auto st = r.check_instances(); !st) {
        std::fprintf(stderr, "kdedup demo: %s\n", st.error().message.c_str());
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }
  auto stopped = r.stop_instances();
  r.stop();
  if (!stopped) {
    keep_work = true;
    std::fprintf(stderr, "kdedup demo: %s", stopped.error().message.c_str());
    return 1;
  }
  if (!ok) keep_work = true;
  if (!ok) std::fprintf(stderr, "kdedup demo: logs kept in %s\n", work.c_str());
  return ok ? 0 : 1;
}

const kdedup::app::CommandRegistration kRegistration{
    "demo", "End-to-end demo: test broker, two instances, click stream, exact check", demo_main};

}  // namespace
