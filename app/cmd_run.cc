// `kdedup run --config FILE [--set key.path=value]...`: the deduplication
// service. Loads the config, opens the snapshot store in state.dir (unless
// empty), checks the topics, runs the pipeline until SIGTERM/SIGINT
// (graceful: finish in-flight, flush, commit, snapshot, leave the group;
// exit 0) or a fatal error (exit 1; a snapshot write error is one).
// Configuration errors, including a state dir that cannot be used, exit 2.

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "command.h"
#include "kdedup/common/byte_size.h"
#include "kdedup/common/duration.h"
#include "kdedup/config/config.h"
#include "kdedup/filter/simd.h"
#include "kdedup/metrics/server.h"
#include "kdedup/pipeline/instrumentation.h"
#include "kdedup/pipeline/pipeline.h"
#include "kdedup/pipeline/repartition.h"
#include "kdedup/state/snapshot_store.h"

namespace {

std::atomic<bool> g_stop{false};

void on_stop_signal(int sig) {
  if (g_stop.exchange(true)) {
    // A second signal: the operator wants out now.
    std::signal(sig, SIG_DFL);
    std::raise(sig);
  }
}

void install_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

void setup_logging(const std::string& level) {
  auto logger = spdlog::stderr_color_mt("kdedup");
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%-5l%$ %v");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(level));
  spdlog::flush_on(spdlog::level::info);
}

/// The confirm store's settings for `config`: RocksDB's caches stay small
/// and fixed (docs/operations.md "Confirmed mode" sizes them), and files
/// are compacted at least once a window (at least hourly, at most every 30
/// days) so expired entries of idle partitions go too.
kdedup::state::ConfirmOptions confirm_options(const kdedup::config::Config& config) {
  kdedup::state::ConfirmOptions o;
  const std::int64_t window_s = config.window_ms() / 1000;
  o.periodic_compaction =
      std::chrono::seconds(std::clamp<std::int64_t>(window_s, 3600, 30 * 86400));
  return o;
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : ",") + s;
  return out;
}

void log_summary(const kdedup::config::Config& c) {
  using kdedup::format_duration_ms;
  auto bootstrap = c.kafka.find("bootstrap.servers");
  spdlog::info("kdedup run: group '{}', input [{}] -> output '{}' (partitioning: {})", c.group_id,
               join(c.input.topics), c.output.topic,
               kdedup::config::to_string(c.output.partitioning));
  if (c.repartition.enabled()) {
    spdlog::info(
        "repartition stage: group '{}' re-keys input [{}] by identity into '{}' ({} "
        "partitions); the dedup stage reads '{}'",
        kdedup::config::repartition_group(c), join(c.input.topics), c.repartition.topic,
        c.repartition.partitions, c.repartition.topic);
  }
  if (c.filter_enabled) {
    spdlog::info(
        "identity '{}', window {} (precision one tick = {}), filter {} fpp {} capacity hint {} "
        "per partition, max_future_skew {}, vector instructions {}",
        c.identity.extractor, format_duration_ms(c.window_ms()), c.tick_scale().describe_tick(),
        kdedup::filter::to_string(c.filter.type), c.filter.fpp, c.filter.capacity,
        format_duration_ms(c.max_future_skew.count()),
        kdedup::filter::to_string(kdedup::filter::simd_in_use()));
    if (c.memory.max_bytes != 0) {
      spdlog::info(
          "memory budget {} for the filters of every partition together (floor {} each); past "
          "it the effective fpp rises instead",
          kdedup::format_bytes(c.memory.max_bytes), kdedup::format_bytes(c.filter.min_bytes));
    }
  } else {
    spdlog::info(
        "identity '{}', filter disabled: passthrough (every identifiable record is "
        "distinct)",
        c.identity.extractor);
  }
  spdlog::info(
      "threads {}, batch_size {}, on_invalid {}{}, on_duplicate {}, duplicates {}, commit every "
      "{}, bootstrap {}",
      c.threads, c.batch_size, kdedup::config::to_string(c.on_invalid),
      c.on_invalid == kdedup::config::OnInvalid::kDlq ? " -> '" + c.dlq_topic + "'" : "",
      kdedup::config::to_string(c.on_duplicate),
      c.duplicates_topic.empty() ? "dropped" : "-> '" + c.duplicates_topic + "'",
      format_duration_ms(c.commit_interval.count()),
      bootstrap == c.kafka.end() ? "(unset)" : bootstrap->second);
}

/// Metrics, /healthz and /readyz of one `kdedup run` (docs/metrics.md); all
/// null when metrics.address is empty. Members are destroyed bottom-up:
/// the bridge (reads the pipeline) must be reset before the pipeline goes,
/// the server stops last.
struct Observability {
  std::unique_ptr<kdedup::metrics::Metrics> metrics;
  std::unique_ptr<kdedup::pipeline::Instrumentation> instruments;
  std::unique_ptr<kdedup::metrics::MetricsServer> server;
  std::unique_ptr<kdedup::pipeline::StatsBridge> bridge;

  kdedup::Status start(const kdedup::config::Config& c) {
    if (c.metrics.address.empty()) return {};
    kdedup::metrics::MetricsOptions o;
    o.per_partition = c.metrics.per_partition;
    o.fpp_target = c.filter.fpp;
    auto m = kdedup::metrics::Metrics::create(o);
    if (!m) return kdedup::fail("metrics: " + m.error().message);
    metrics = std::move(*m);
    instruments = std::make_unique<kdedup::pipeline::Instrumentation>(*metrics, c);
    auto s = kdedup::metrics::MetricsServer::start(c.metrics.address, *metrics);
    if (!s) return kdedup::fail("metrics.address: " + s.error().message);
    server = std::move(*s);
    spdlog::info("serving /metrics, /healthz and /readyz on http://{} (port {})", c.metrics.address,
                 server->port());
    return {};
  }
  kdedup::pipeline::SliceHooks hooks() {
    return instruments ? instruments->hooks() : kdedup::pipeline::SliceHooks{};
  }
  void watch(const kdedup::pipeline::Pipeline& p, const kdedup::config::Config& c,
             const kdedup::pipeline::Repartitioner* r) {
    if (!instruments) return;
    bridge = std::make_unique<kdedup::pipeline::StatsBridge>(
        *instruments, [&p] { return p.stats(); }, c.output.topic);
    if (r != nullptr) {
      bridge->watch_repartition([r] { return r->stats(); }, c.repartition.topic);
    }
    bridge->start();
  }
  void stop_watching() {
    if (!metrics) return;
    bridge.reset();  // one last round, then joined
    metrics->health().set_not_ready("shutting down");
  }
};

/// Runs the dedup pipeline on this thread and, when configured, the
/// repartition stage on its own. A SIGTERM stops both; a fatal error of
/// either stops the other cleanly (its in-flight records are committed).
/// True when both stopped cleanly.
bool run_stages(kdedup::pipeline::Pipeline& pipeline,
                kdedup::pipeline::Repartitioner* repartitioner) {
  if (repartitioner == nullptr) {
    auto status = pipeline.run(g_stop);
    if (!status) spdlog::error("kdedup run stopped: {}", status.error().message);
    return static_cast<bool>(status);
  }
  std::atomic<bool> stop{false};
  std::atomic<bool> stages_done{false};
  // The signal handler only sets g_stop; this forwards it to both stages.
  std::thread relay([&] {
    while (!stages_done.load()) {
      if (g_stop.load()) stop.store(true);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  kdedup::Status repartitioned;
  std::thread stage([&] {
    repartitioned = repartitioner->run(stop);
    if (!repartitioned) stop.store(true);
  });
  auto deduplicated = pipeline.run(stop);
  if (!deduplicated) stop.store(true);
  stage.join();
  stages_done.store(true);
  relay.join();
  if (!repartitioned) {
    spdlog::error("kdedup run stopped: repartition stage: {}", repartitioned.error().message);
  }
  if (!deduplicated) spdlog::error("kdedup run stopped: {}", deduplicated.error().message);
  return repartitioned && deduplicated;
}

int run_main(int argc, char** argv) {
  CLI::App cli{
      "Runs the deduplication service: a consumer-group member that copies the input "
      "topics to the output topic without duplicates.",
      "kdedup run"};
  std::string path;
  std::vector<std::string> overrides;
  cli.add_option("-c,--config", path, "YAML config file")->type_name("FILE")->required();
  cli.add_option("--set", overrides,
                 "override a key, e.g. --set filter.fpp=0.001 "
                 "--set kafka.bootstrap.servers=host:9092 (repeatable)")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);
  if (auto code = kdedup::app::parse_command_line(cli, argc, argv)) return *code;

  auto report = kdedup::config::check_config_file(path, overrides);
  for (const auto& w : report.warnings) {
    std::fprintf(stderr, "warning: %s\n", kdedup::config::to_string(w).c_str());
  }
  if (!report.ok()) {
    std::fprintf(stderr, "kdedup run: %s: %zu configuration error%s\n", path.c_str(),
                 report.errors.size(), report.errors.size() == 1 ? "" : "s");
    for (const auto& e : report.errors) {
      std::fprintf(stderr, "error: %s\n", kdedup::config::to_string(e).c_str());
    }
    return 2;
  }
  const kdedup::config::Config& config = *report.config;
  setup_logging(config.log_level);
  // From here a SIGTERM stops cleanly, however long the start takes (the
  // state dir, the salt check, the topics): run() sees the flag at once.
  install_signal_handlers();
  log_summary(config);

  // The snapshot store: before anything joins the group, so a state dir that
  // cannot be used stops the start instead of a rebalance later.
  std::unique_ptr<kdedup::state::SnapshotStore> store;
  if (config.state.dir.empty()) {
    spdlog::info(
        "state.dir is empty: no snapshots, every assigned partition is rebuilt from Kafka");
  } else {
    kdedup::state::StoreOptions so;
    so.min_free_bytes = config.state.min_free_bytes;
    if (config.confirm_store && config.filter_enabled) so.confirm = confirm_options(config);
    auto opened = kdedup::state::SnapshotStore::open(config.state.dir, so);
    if (!opened) {
      spdlog::error("state.dir: {}", opened.error().message);
      return 2;
    }
    store = std::move(*opened);
    if (const auto lost = store->lost(); !lost.empty()) {
      std::vector<kdedup::state::PartitionKey> keys;
      for (const auto& l : lost) keys.push_back(l.key);
      spdlog::warn(
          "state.dir {}: the last snapshot of {} partition(s) is lost ({}); they are refused as "
          "corrupt and rebuilt from Kafka when assigned. {}",
          config.state.dir, lost.size(), kdedup::state::summarize(keys), lost.front().message);
    }
    spdlog::info("snapshots in {} every {} or {} records per partition", config.state.dir,
                 kdedup::format_duration_ms(config.state.snapshot_interval.count()),
                 config.state.snapshot_records);
    if (const auto* confirm = store->confirm(); confirm != nullptr) {
      const auto& o = confirm->options();
      spdlog::info(
          "confirmed mode: the filter's duplicates are confirmed in {} ({:.0f} MiB on disk now; "
          "RocksDB block cache {} MiB, memtables {} x {} MiB; deliveries since each partition's "
          "last snapshot are held in memory until the next)",
          confirm->dir(), static_cast<double>(confirm->approximate_bytes()) / 1048576.0,
          o.block_cache_bytes >> 20, o.write_buffers, o.write_buffer_bytes >> 20);
    }
  }

  // With the repartition stage the dedup stage reads the internal topic.
  const kdedup::config::Config dedup = kdedup::config::dedup_stage(config);
  std::unique_ptr<kdedup::pipeline::Repartitioner> repartitioner;
  if (config.repartition.enabled()) {
    auto r = kdedup::pipeline::Repartitioner::create(config);
    if (!r) {
      spdlog::error("configuration error: {}", r.error().message);
      return 2;
    }
    if (auto topics = (*r)->prepare_topics(); !topics) {
      spdlog::error("the topics do not match the configuration:\n{}", topics.error().message);
      return 2;
    }
    repartitioner = std::move(*r);
  }
  Observability observability;
  if (auto started = observability.start(dedup); !started) {
    spdlog::error("configuration error: {}", started.error().message);
    return 2;
  }
  auto pipeline = kdedup::pipeline::Pipeline::create(dedup, observability.hooks(), store.get());
  if (!pipeline) {
    spdlog::error("configuration error: {}", pipeline.error().message);
    return 2;
  }
  if (auto topics = (*pipeline)->check_topics(); !topics) {
    spdlog::error("the topics do not match the configuration:\n{}", topics.error().message);
    return 2;
  }
  observability.watch(**pipeline, dedup, repartitioner.get());
  const bool ok = run_stages(**pipeline, repartitioner.get());
  observability.stop_watching();
  return ok ? 0 : 1;
}

const kdedup::app::CommandRegistration kRunCommand{
    "run", "run the deduplication service (consumer group member)", run_main};

}  // namespace
