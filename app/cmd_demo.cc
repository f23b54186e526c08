// `kdedup demo`: the whole service on one machine. Starts the test broker,
// two `kdedup run` instances in one consumer group, produces a click stream
// full of duplicates (testbroker::ClickRun, the run bench/pipeline_bench is
// made of too), reads input and output back with an independent consumer
// and judges the output with the output oracle the tests use
// (kdedup/testbroker/output_oracle.h), at the filters' ticks. Exit status 0
// only if the check holds.

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "command.h"
#include "kdedup/common/duration.h"
#include "kdedup/config/config.h"
#include "kdedup/testbroker/click_run.h"
#include "kdedup/testbroker/output_oracle.h"
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

int fail_with(const std::string& message) {
  std::fprintf(stderr, "kdedup demo: %s\n", message.c_str());
  return 1;
}

kdedup::Status interrupted() {
  if (g_interrupted) return kdedup::fail("interrupted; stopping everything started");
  return {};
}

struct DemoOptions {
  std::uint64_t records = 100'000;
  int partitions = 4;
  int instances = 2;
  std::uint64_t seed = 1;
  std::string config_path = "config/local.yaml";
  std::string filter_type;
  std::vector<std::string> sets;
  int timeout_s = 120;
  bool keep_going = false;
  bool unkeyed = false;
};

void add_options(CLI::App& app, DemoOptions& o) {
  app.add_option("--records", o.records, "Records to produce")->check(CLI::Range(1, 2'000'000));
  app.add_option("--partitions", o.partitions, "Input (and output) partitions")
      ->check(CLI::Range(1, 64));
  app.add_option("--instances", o.instances, "kdedup run instances in the group")
      ->check(CLI::Range(1, 8));
  app.add_option("--seed", o.seed, "Stream generator seed");
  app.add_option("--config", o.config_path,
                 "Base config for the instances (a built-in equivalent of config/local.yaml is "
                 "used if the file does not exist)");
  app.add_option("--filter", o.filter_type, "Override filter.type (timer, aging, exact, compact)");
  app.add_option("--set", o.sets, "Extra config override key.path=value for every instance");
  app.add_option("--timeout", o.timeout_s, "Seconds to wait for the group to catch up")
      ->check(CLI::Range(5, 3600));
  app.add_flag("--unkeyed", o.unkeyed,
               "Produce the clicks with random partitioning (copies of one click land in "
               "different partitions) and run with the repartition stage, which re-keys them by "
               "identity into the internal topic '" +
                   std::string(kInternalTopic) + "' first");
  app.add_flag("--keep-going", o.keep_going,
               "After the summary keep broker and instances running until Ctrl-C (explore with "
               "kcat at the printed bootstrap address)");
}

/// The work dir for logs, state and (if needed) the config: removed at the
/// end unless kept (a failure keeps it for its logs).
class WorkDir {
 public:
  static kdedup::Result<std::unique_ptr<WorkDir>> create() {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/kdedup-demo-XXXXXX";
    if (!mkdtemp(tmpl.data())) return kdedup::fail("cannot create a temporary directory");
    return std::unique_ptr<WorkDir>(new WorkDir(tmpl));
  }
  ~WorkDir() {
    std::error_code ec;
    if (!keep_) std::filesystem::remove_all(path_, ec);
  }
  [[nodiscard]] const std::string& path() const { return path_; }
  void keep() { keep_ = true; }

 private:
  explicit WorkDir(std::string path) : path_(std::move(path)) {}
  std::string path_;
  bool keep_ = false;
};

/// One demo run: the rig, the click stream through it, the oracle's verdict
/// and the summary. Main thread only.
class Demo {
 public:
  Demo(const DemoOptions& o, WorkDir& work, const kdedup::config::Config& cfg,
       std::vector<std::string> overrides)
      : o_(o), work_(work), cfg_(cfg), overrides_(std::move(overrides)) {}

  /// Starts everything, runs the stream through, judges and prints; returns
  /// the exit status.
  int run();

 private:
  kdedup::Status start();
  kdedup::Status produce();
  kdedup::Status wait_caught_up();
  kdedup::Result<tb::VerifyReport> judge();
  void print_summary(const tb::VerifyReport& report, bool ok) const;
  void keep_running();
  int stop(bool ok);

  const DemoOptions& o_;
  WorkDir& work_;
  const kdedup::config::Config& cfg_;
  std::vector<std::string> overrides_;
  std::unique_ptr<tb::PipelineRig> rig_;
  std::unique_ptr<tb::ClickRun> run_;
  ProgressLine progress_;
  Clock::time_point t0_, produced_at_, caught_up_at_;
  std::int64_t dead_letters_ = 0;
  std::uint64_t spread_ = 0;  // --unkeyed: identities with copies in several partitions
};

int Demo::run() {
  if (auto ok = start(); !ok) return fail_with(ok.error().message);
  if (auto ok = produce(); !ok) return fail_with(ok.error().message);
  if (auto ok = wait_caught_up(); !ok) {
    if (!g_interrupted) work_.keep();  // the logs say why
    return fail_with(ok.error().message);
  }
  auto report = judge();
  if (!report) return fail_with(report.error().message);
  const bool ok = report->ok() && dead_letters_ == 0;
  print_summary(*report, ok);
  if (o_.keep_going && !g_interrupted) keep_running();
  return stop(ok);
}

kdedup::Status Demo::start() {
  tb::RigOptions ro;
  ro.kdedup_binary = self_binary();
  ro.config_path = o_.config_path;
  ro.overrides = overrides_;
  ro.work_dir = work_.path();
  ro.partitions = o_.partitions;
  ro.instances = o_.instances;
  if (o_.unkeyed) {
    ro.repartition_topic = kInternalTopic;
    // Two consumer groups per instance: the test broker holds each join
    // phase for session.timeout.ms - 1 s, so the default (45 s) would make a
    // late joiner of either group wait that long, twice.
    ro.overrides.insert(ro.overrides.begin(), "consumer.session.timeout.ms=6000");
  }
  auto rig = tb::PipelineRig::start(ro);
  if (!rig) return tl::unexpected(rig.error());
  rig_ = std::move(*rig);
  std::fprintf(stderr, "kdedup demo: test broker at %s\n", rig_->bootstrap().c_str());
  tb::ClickRunOptions co;
  co.records = o_.records;
  co.seed = o_.seed;
  co.span_ms = std::max<std::int64_t>(cfg_.window_ms() * 5, 60'000);
  co.unkeyed = o_.unkeyed;
  auto run = tb::ClickRun::start(*rig_, co);
  if (!run) return tl::unexpected(run.error());
  run_ = std::move(*run);
  return {};
}

kdedup::Status Demo::produce() {
  t0_ = Clock::now();
  auto ok = run_->produce(o_.records, [this](std::uint64_t n) -> kdedup::Status {
    if (auto i = interrupted(); !i) return i;
    progress_.update(fmt::format("producing: {}/{} records", n, o_.records));
    return rig_->check_instances();
  });
  if (!ok) return ok;
  if (auto i = interrupted(); !i) return i;
  produced_at_ = Clock::now();
  run_->close();  // no client of ours may outlive the broker
  return {};
}

kdedup::Status Demo::wait_caught_up() {
  auto ok = run_->wait_caught_up(
      std::chrono::seconds(o_.timeout_s), [this](const tb::GroupProgress& gp) -> kdedup::Status {
        if (auto i = interrupted(); !i) return i;
        const double secs = std::chrono::duration<double>(Clock::now() - t0_).count();
        progress_.update(fmt::format("deduplicating: {}/{} records committed ({:.0f} records/s)",
                                     gp.committed, gp.end,
                                     static_cast<double>(gp.committed) / secs));
        return {};
      });
  progress_.done();
  caught_up_at_ = Clock::now();
  return ok;
}

/// The output against the oracle, the window edge judged in the filters'
/// ticks (the one time -> tick mapping of the config).
kdedup::Result<tb::VerifyReport> Demo::judge() {
  if (auto kept = run_->check_input_kept(); !kept) return tl::unexpected(kept.error());
  auto out = run_->read_back();
  if (!out) return tl::unexpected(out.error());
  dead_letters_ = out->dead_letters;
  if (o_.unkeyed) {
    // Copies of a click in several input partitions: what the stage is for.
    auto input =
        tb::read_topic(rig_->bootstrap(), rig_->options().input_topic, std::chrono::seconds(60));
    if (!input) return tl::unexpected(input.error());
    std::map<std::string, std::set<std::int32_t>> partitions_of;
    for (const auto& in : *input) partitions_of[in.key.value_or("")].insert(in.partition);
    for (const auto& [id, ps] : partitions_of) spread_ += ps.size() > 1;
  }
  tb::VerifySpec spec;
  spec.window_ms = cfg_.window_ms();
  spec.scale = cfg_.tick_scale();
  spec.fpp = cfg_.filter_enabled ? cfg_.filter.fpp : 0.0;
  spec.refresh = cfg_.on_duplicate == kdedup::config::OnDuplicate::kRefresh;
  return tb::verify_output(out->input, out->output, spec);
}

void Demo::print_summary(const tb::VerifyReport& report, bool ok) const {
  const double process_secs = std::chrono::duration<double>(caught_up_at_ - t0_).count();
  const double produce_secs = std::chrono::duration<double>(produced_at_ - t0_).count();
  const auto& counts = run_->counts();
  const double observed = report.oracle_distinct == 0
                              ? 0.0
                              : static_cast<double>(report.false_positives) /
                                    static_cast<double>(report.oracle_distinct);
  auto row = [](const char* name, const std::string& value) {
    std::printf("  %-34s %s\n", name, value.c_str());
  };
  std::printf("\nkdedup demo summary\n");
  row("records in",
      fmt::format("{} ({} retries, {} re-posts, {} click-fraud)", report.input_records,
                  counts.retries, counts.reposts, counts.fraud));
  row("distinct (exact replay)", std::to_string(report.exact_distinct));
  row("distinct out",
      report.output_records == report.emitted_sources
          ? std::to_string(report.output_records)
          : fmt::format("{} ({} records in total)", report.emitted_sources, report.output_records));
  row("duplicates dropped", std::to_string(report.input_records - report.emitted_sources));
  if (o_.unkeyed) {
    row("unkeyed input",
        fmt::format("{} identities have copies in several of the {} partitions; the repartition "
                    "stage re-keyed all {} records into '{}'",
                    spread_, o_.partitions, o_.records, kInternalTopic));
  }
  row("false positives observed",
      fmt::format("{} of {} new records = {:.4f} (configured fpp {:g}, accepted up to {})",
                  report.false_positives, report.oracle_distinct, observed,
                  cfg_.filter_enabled ? cfg_.filter.fpp : 0.0, report.fp_bound));
  row("false negatives (duplicates out)", std::to_string(report.duplicated - report.copies));
  row("emitted twice", std::to_string(report.copies));
  row("unknown provenance / wrong key", std::to_string(report.unexpected));
  if (report.lost + report.out_of_order > 0) {
    row("lost / out of order", fmt::format("{} / {}", report.lost, report.out_of_order));
  }
  row("dead-lettered", std::to_string(dead_letters_));
  row("produce rate",
      fmt::format("{:.0f} records/s", static_cast<double>(o_.records) / produce_secs));
  row("end-to-end throughput",
      fmt::format("{:.0f} records/s ({} instances, {:.1f} s)",
                  static_cast<double>(o_.records) / process_secs, o_.instances, process_secs));
  if (!report.ok()) std::printf("  problem: %s", report.to_string().c_str());
  std::printf("  %-34s %s\n\n", "result", ok ? "PASS" : "FAIL");
  std::fflush(stdout);
}

void Demo::keep_running() {
  std::fprintf(stderr,
               "kdedup demo: still running; try\n  kcat -b %s -C -t %s -e -f '%%k %%h\\n' | "
               "head\nCtrl-C stops everything.\n",
               rig_->bootstrap().c_str(), rig_->options().output_topic.c_str());
  while (!g_interrupted) {
    if (auto st = rig_->check_instances(); !st) {
      std::fprintf(stderr, "kdedup demo: %s\n", st.error().message.c_str());
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

int Demo::stop(bool ok) {
  auto stopped = rig_->stop_instances();
  rig_->stop();
  if (!stopped) {
    work_.keep();
    std::fprintf(stderr, "kdedup demo: %s", stopped.error().message.c_str());
    return 1;
  }
  if (!ok) {
    work_.keep();
    std::fprintf(stderr, "kdedup demo: logs kept in %s\n", work_.path().c_str());
  }
  return ok ? 0 : 1;
}

/// The config the instances run with, validated up front: the rules the
/// oracle applies come from it.
kdedup::Result<kdedup::config::Config> demo_config(const std::string& path,
                                                   const std::vector<std::string>& overrides) {
  auto env = [](const std::string& name) -> std::optional<std::string> {
    if (name == "KDEDUP_BOOTSTRAP") return std::string("127.0.0.1:9092");
    return kdedup::config::process_env()(name);
  };
  auto checked = kdedup::config::check_config_file(path, overrides, env);
  if (!checked.ok()) {
    std::string msg = "config " + path + " is not valid:";
    for (const auto& i : checked.errors) msg += "\n  " + kdedup::config::to_string(i);
    return kdedup::fail(msg);
  }
  if (checked.config->identity.extractor != "key") {
    return kdedup::fail(
        "the demo's stream carries the identity in the record key; the config uses "
        "identity.extractor '" +
        checked.config->identity.extractor + "'");
  }
  return std::move(*checked.config);
}

int demo_main(int argc, char** argv) {
  CLI::App app{
      "Runs kdedup end to end on this machine: a test broker, N `kdedup run` instances in one "
      "consumer group, a generated click stream with duplicates (Zipf users and ads, retries, "
      "re-posts, click-fraud bursts), then checks the output against the exact semantics. Exit "
      "status 0 only if no duplicate got through, nothing was emitted twice and false positives "
      "stay within the configured rate.",
      "kdedup demo"};
  DemoOptions o;
  add_options(app, o);
  if (auto code = kdedup::app::parse_command_line(app, argc, argv)) return *code;

  struct sigaction sa {};
  sa.sa_handler = on_interrupt;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  auto work = WorkDir::create();
  if (!work) return fail_with(work.error().message);
  if (!std::filesystem::exists(o.config_path)) {
    o.config_path = (*work)->path() + "/demo.yaml";
    std::ofstream(o.config_path) << kFallbackConfig;
  }
  std::vector<std::string> overrides;
  if (!o.filter_type.empty()) overrides.push_back("filter.type=" + o.filter_type);
  overrides.insert(overrides.end(), o.sets.begin(), o.sets.end());
  auto cfg = demo_config(o.config_path, overrides);
  if (!cfg) return fail_with(cfg.error().message);

  std::fprintf(stderr,
               "kdedup demo: %llu records, %d partitions, %d instances, window %s, filter %s "
               "(fpp %g), work dir %s\n",
               static_cast<unsigned long long>(o.records), o.partitions, o.instances,
               kdedup::format_duration_ms(cfg->window_ms()).c_str(),
               cfg->filter_enabled ? kdedup::filter::to_string(cfg->filter.type) : "off",
               cfg->filter.fpp, (*work)->path().c_str());
  return Demo(o, **work, *cfg, std::move(overrides)).run();
}

const kdedup::app::CommandRegistration kDemoCommand{
    "demo", "End-to-end demo: test broker, two instances, click stream, exact check", demo_main};

}  // namespace
