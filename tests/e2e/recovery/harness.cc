#include "harness.h"

#include <signal.h>

#include <cstdio>
#include <iostream>
#include <random>
#include <sstream>

#include <simdjson.h>

#include "http_get.h"
#include "kdedup/common/duration.h"
#include "kdedup/testbroker/kafka_io.h"
#include "metrics_doc.h"
#include "streams.h"

namespace kdedup::testing {

using namespace std::chrono_literals;

std::string run_config_yaml(const std::string& bootstrap, const RunSettings& s) {
  std::ostringstream y;
  y << "group_id: " << s.group << "\n"
    << "input:\n  topics: [" << s.input << "]\n"
    << "output:\n  topic: " << s.output << "\n  partitioning: " << s.partitioning << "\n"
    << "identity:\n  extractor: key\n  salt: recovery-salt\n"
    << "window: " << s.window << "\n"
    << "filter:\n  type: " << s.filter << "\n";
  if (s.fpp) y << "  fpp: " << *s.fpp << "\n";
  if (s.capacity) y << "  capacity: " << *s.capacity << "\n";
  if (s.min_bytes) y << "  min_bytes: " << *s.min_bytes << "\n";
  if (s.confirm) y << "  confirm_store: true\n";
  y << "threads: " << s.threads << "\n"
    << "batch_size: " << s.batch_size << "\n"
    << "on_invalid: dlq\n"
    << "dlq_topic: dlq\n"
    << "commit_interval: " << s.commit_interval << "\n"
    << "shutdown_timeout: 20s\n"
    << "kafka:\n  bootstrap.servers: \"" << bootstrap
    << "\"\n"
    // The test broker's coordinator waits a session timeout for a member
    // that was killed before it rebalances: keep it short.
    << "consumer:\n  session.timeout.ms: \"" << s.session_timeout_ms << "\"\n"
    << "  heartbeat.interval.ms: \"500\"\n";
  for (const auto& [k, v] : s.consumer_extra) y << "  " << k << ": \"" << v << "\"\n";
  y << "state:\n  dir: \"" << s.state_dir << "\"\n"
    << "  snapshot_interval: " << s.snapshot_interval << "\n";
  if (s.snapshot_records) y << "  snapshot_records: " << *s.snapshot_records << "\n";
  if (s.reconcile_tail_records) {
    y << "  reconcile_tail_records: " << *s.reconcile_tail_records << "\n";
  }
  if (s.min_free_bytes) y << "  min_free_bytes: " << *s.min_free_bytes << "\n";
  y << "metrics:\n  address: \"127.0.0.1:0\"\n"
    << "log_level: " << s.log_level << "\n"
    << (s.refresh ? "on_duplicate: refresh\n" : "") << s.extra_yaml;
  return y.str();
}

Instance::Instance(std::string name, const TempDir& dir, std::string bootstrap,
                   RunSettings settings, std::vector<std::string> extra_env)
    : name_(std::move(name)),
      config_path_(dir.file(name_ + ".yaml")),
      log_path_(dir.file(name_ + ".log")),
      bootstrap_(std::move(bootstrap)),
      settings_(std::move(settings)),
      env_(std::move(extra_env)) {}

Instance::~Instance() {
  if (process_) process_->stop(5s);
}

Status Instance::start() {
  if (process_ && !process_->poll_exit()) return fail(name_ + " is already running");
  write_file(config_path_, run_config_yaml(bootstrap_, settings_));
  run_log_start_ = read_file(log_path_).size();
  port_.reset();
  testbroker::ChildOptions o;
  o.stderr_file = log_path_;
  o.env = env_;
  auto p = testbroker::ChildProcess::spawn({KDEDUP_BINARY, "run", "--config", config_path_}, o);
  if (!p) return fail(name_ + ": " + p.error().message);
  process_ = std::move(*p);
  return {};
}

void Instance::kill9() {
  if (!process_) return;
  process_->signal(SIGKILL);
  process_->wait(10s);
}

int Instance::stop(std::chrono::milliseconds grace) {
  if (!process_) return -1;
  if (auto done = process_->poll_exit()) return *done;
  process_->signal(SIGTERM);
  if (auto s = process_->wait(grace)) return *s;
  process_->signal(SIGKILL);
  process_->wait(10s);
  return -1;
}

std::optional<int> Instance::wait_exit(std::chrono::milliseconds timeout) {
  if (!process_) return std::nullopt;
  return process_->wait(timeout);
}

bool Instance::running() { return process_ && !process_->poll_exit(); }

bool crashed_by_itself(const std::string& name, std::optional<int> exited,
                       const std::string& run_log, const std::string& when) {
  if (exited != 128 + SIGSEGV) return false;
  if (run_log.find("kdedup: fatal signal") != std::string::npos) return false;
  std::cout << name << " had crashed by itself (SIGSEGV in librdkafka) " << when << std::endl;
  return true;
}

std::optional<int> stop_after_kills(Instance& i) {
  const bool ended = !i.running();
  const int status = i.stop();
  if (crashed_by_itself(i.name(), status, i.run_log(),
                        ended ? "after the last kill" : "while stopping")) {
    return std::nullopt;
  }
  return status;
}

std::string Instance::log() const { return read_file(log_path_); }

std::string Instance::run_log() const {
  auto all = log();
  return run_log_start_ <= all.size() ? all.substr(run_log_start_) : all;
}

std::string Instance::log_tail(std::size_t lines) const {
  auto all = log();
  std::size_t at = all.size();
  for (std::size_t n = 0; n <= lines && at > 0; ++n) {
    at = all.rfind('\n', at - 1);
    if (at == std::string::npos) return "[" + name_ + " log]\n" + all;
  }
  return "[" + name_ + " log, last " + std::to_string(lines) + " lines]\n" + all.substr(at + 1);
}

std::optional<int> Instance::metrics_port(std::chrono::milliseconds timeout) {
  if (port_) return port_;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  do {
    auto text = run_log();
    // "serving /metrics, /healthz and /readyz on http://127.0.0.1:0 (port N)"
    auto at = text.find("/readyz on http://");
    if (at != std::string::npos) {
      auto p = text.find("(port ", at);
      if (p != std::string::npos) {
        port_ = std::atoi(text.c_str() + p + 6);
        return port_;
      }
    }
    std::this_thread::sleep_for(50ms);
  } while (std::chrono::steady_clock::now() < deadline);
  return std::nullopt;
}

std::optional<double> Instance::metric(const std::string& name) {
  auto port = metrics_port(5s);
  if (!port) return std::nullopt;
  auto r = http_get(*port, "/metrics");
  if (r.status != 200) return std::nullopt;
  return exposition_sum(r.body, name);
}

int Instance::readyz() {
  auto port = metrics_port(5s);
  return port ? http_get(*port, "/readyz").status : 0;
}

bool Instance::wait_ready(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (readyz() == 200) return true;
    if (!running()) return false;
    std::this_thread::sleep_for(100ms);
  }
  return false;
}

Feeder::Feeder(const std::string& bootstrap, Options options)
    : options_(std::move(options)), thread_([this, bootstrap] { run(bootstrap); }) {}

Feeder::~Feeder() { stop(); }

void Feeder::run(std::string bootstrap) {
  auto producer = testbroker::RecordProducer::create(bootstrap);
  if (!producer) {
    error_ = producer.error().message;
    done_ = true;
    return;
  }
  StreamSpec spec;
  spec.domain = options_.domain;
  spec.seed = options_.seed;
  EventStream draws(spec);
  const std::string padding(options_.value_padding, 'x');
  constexpr int kBatch = 20;
  const auto pause = std::chrono::microseconds(1'000'000LL * kBatch / options_.per_second);
  auto next = std::chrono::steady_clock::now();
  std::uint64_t i = 0;
  bool ok = true;
  std::mt19937_64 partition_rng(options_.seed * 7919 + 1);
  while (!stop_ && (options_.limit == 0 || i < options_.limit)) {
    for (int b = 0; b < kBatch && (options_.limit == 0 || i < options_.limit); ++b, ++i) {
      const auto shift = static_cast<std::uint64_t>(static_cast<double>(i) * options_.drift);
      const std::uint64_t id = shift + draws.draw_identity();
      const auto partition = static_cast<std::int32_t>(
          (options_.random_partitioning ? partition_rng() : id) % options_.partitions);
      std::string value = "{\"id\":" + std::to_string(id) + ",\"seq\":" + std::to_string(i) +
                          (padding.empty() ? "" : ",\"pad\":\"" + padding + "\"") + "}";
      if (auto s =
              (*producer)->produce(options_.topic, partition, "id-" + std::to_string(id), value, 0);
          !s) {
        error_ = s.error().message;
        ok = false;
      }
    }
    if (auto s = (*producer)->flush(30s); !s) {
      error_ = s.error().message;
      ok = false;
    }
    produced_ = i;
    next += pause;
    std::this_thread::sleep_until(next);
  }
  if (auto s = (*producer)->flush(30s); !s) {
    error_ = s.error().message;
    ok = false;
  }
  produced_ = i;
  ok_ = ok;
  done_ = true;
}

bool Feeder::stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  return ok_;
}

bool Feeder::wait_done(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done_ && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(50ms);
  return done_;
}

bool wait_committed_to_end(TestBroker& broker, const std::string& group, const std::string& topic,
                           std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string last;
  for (;;) {
    auto marks = broker.watermarks(topic);
    auto committed = broker.committed(group, topic);
    if (marks && committed) {
      bool done = true;
      std::ostringstream lag;
      for (const auto& m : *marks) {
        const auto c = (*committed)[static_cast<std::size_t>(m.partition)];
        if (c != m.high) {
          done = false;
          lag << " " << topic << "[" << m.partition << "] committed " << c << " of " << m.high;
        }
      }
      if (done) return true;
      last = lag.str();
    }
    if (std::chrono::steady_clock::now() > deadline) {
      std::cout << "not committed to the end:" << last << std::endl;
      return false;
    }
    std::this_thread::sleep_for(200ms);
  }
}

Result<VerifyReport> verify_topics(TestBroker& broker, const RunSettings& settings) {
  auto window = parse_duration_ms(settings.window);
  if (!window) return fail("window '" + settings.window + "': " + window.error().message);
  const double fpp =
      settings.filter == "exact" || settings.confirm ? 0.0 : settings.fpp.value_or(0.01);
  return verify_topics(broker, settings.input, settings.output, *window, fpp, settings.refresh);
}

Result<VerifyReport> verify_topics(TestBroker& broker, const std::string& input,
                                   const std::string& output, std::int64_t window_ms, double fpp,
                                   bool refresh) {
  auto marks = broker.watermarks(input);
  if (!marks) return fail(marks.error().message);
  for (const auto& m : *marks) {
    if (m.low != 0) {
      return fail("input " + input + "[" + std::to_string(m.partition) +
                  "] was truncated by the broker (low watermark " + std::to_string(m.low) +
                  "): the oracle needs the whole input");
    }
  }
  auto in = broker.read_topic(input, 60s);
  if (!in) return fail(in.error().message);
  auto out = broker.read_topic(output, 60s);
  if (!out) return fail(out.error().message);
  auto inputs = to_input_records(*in, "key");
  if (!inputs) return fail(inputs.error().message);
  VerifyReport report = verify_output(
      *inputs, to_output_records(*out),
      VerifySpec{.window_ms = window_ms, .tick_ms = 0, .fpp = fpp, .refresh = refresh});
  std::cout << report.to_string() << std::flush;
  return report;
}

Result<VerifyReport> verify_topics_by_identity(TestBroker& broker, const std::string& input,
                                               const std::string& output, std::int64_t window_ms,
                                               const pipeline::ProvenanceNames& provenance) {
  auto marks = broker.watermarks(input);
  if (!marks) return fail(marks.error().message);
  for (const auto& m : *marks) {
    if (m.low != 0) return fail("input " + input + " was truncated by the broker");
  }
  auto in = broker.read_topic(input, 60s);
  if (!in) return fail(in.error().message);
  auto out = broker.read_topic(output, 60s);
  if (!out) return fail(out.error().message);
  auto inputs = to_input_records(*in, "key");
  if (!inputs) return fail(inputs.error().message);
  VerifyReport report =
      verify_by_identity(*inputs, to_output_records(*out, provenance),
                         VerifySpec{.window_ms = window_ms, .tick_ms = 0, .fpp = 0.0});
  std::cout << report.to_string() << std::flush;
  return report;
}

Status run_batch(TestBroker& broker, Instance& instance, Feeder::Options feed,
                 std::chrono::milliseconds timeout) {
  if (auto s = instance.start(); !s) return s;
  Feeder feeder(broker.bootstrap(), feed);
  if (!feeder.wait_done(timeout) || !feeder.stop()) {
    return fail("feeder did not finish: " + feeder.error());
  }
  if (!wait_committed_to_end(broker, instance.settings().group, feed.topic, timeout)) {
    return fail(instance.name() + " did not commit the whole input\n" + instance.log_tail());
  }
  if (int code = instance.stop(); code != 0) {
    return fail(instance.name() + " exited " + std::to_string(code) + " on SIGTERM\n" +
                instance.log_tail());
  }
  std::cout << instance.name() << ": processed " << feeder.produced()
            << " more records and stopped cleanly" << std::endl;
  return {};
}

Inspection inspect_snapshots(const std::string& state_dir, bool verify) {
  std::vector<std::string> args{"snapshot", "inspect", "--state-dir", state_dir, "--json"};
  if (verify) args.push_back("--verify");
  auto r = run_kdedup(args);
  Inspection out;
  out.exit_code = r.exit_code;
  out.text = r.out + r.err;
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (parser.parse(r.out).get(doc) != simdjson::SUCCESS) return out;
  simdjson::dom::array rows;
  if (doc["snapshots"].get_array().get(rows) != simdjson::SUCCESS) return out;
  for (auto row : rows) {
    InspectedSnapshot s;
    std::string_view text;
    if (row["topic"].get_string().get(text) == simdjson::SUCCESS) s.topic = std::string(text);
    std::int64_t n = 0;
    if (row["partition"].get_int64().get(n) == simdjson::SUCCESS) {
      s.partition = static_cast<std::int32_t>(n);
    }
    if (row["status"].get_string().get(text) == simdjson::SUCCESS) s.status = std::string(text);
    if (row["next_offset"].get_int64().get(n) == simdjson::SUCCESS) s.next_offset = n;
    std::uint64_t bytes = 0;
    if (row["logical_bytes"].get_uint64().get(bytes) == simdjson::SUCCESS) s.logical_bytes = bytes;
    out.snapshots.push_back(std::move(s));
  }
  return out;
}

std::string first_line_with(const std::string& log, const std::string& what) {
  const auto at = log.find(what);
  if (at == std::string::npos) return "(no line with '" + what + "')";
  auto begin = log.rfind('\n', at);
  begin = begin == std::string::npos ? 0 : begin + 1;
  return log.substr(begin, log.find('\n', at) - begin);
}

std::optional<std::string> line_with_all(const std::string& log,
                                         const std::vector<std::string>& words) {
  std::istringstream lines(log);
  std::string line;
  while (std::getline(lines, line)) {
    bool all = true;
    for (const auto& w : words) all = all && line.find(w) != std::string::npos;
    if (all) return line;
  }
  return std::nullopt;
}

RecoveryLines recovery_lines(const std::string& log) {
  RecoveryLines out;
  const std::string marker = "recovery done (";
  for (auto at = log.find(marker); at != std::string::npos; at = log.find(marker, at + 1)) {
    const auto begin = at + marker.size();
    const auto end = log.find(')', begin);
    if (end == std::string::npos) break;
    ++out.by_reason[log.substr(begin, end - begin)];
    const auto comma = log.find(", ", end);
    const auto eol = log.find('\n', end);
    if (comma != std::string::npos && comma < eol) {
      out.replayed += std::strtoull(log.c_str() + comma + 2, nullptr, 10);
    }
  }
  return out;
}

std::string RecoveryLines::to_string() const {
  std::string text;
  for (const auto& [reason, n] : by_reason) {
    text += (text.empty() ? "" : ", ") + reason + " " + std::to_string(n);
  }
  return (text.empty() ? "no partition recovered" : text) + "; " + std::to_string(replayed) +
         " records replayed";
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace kdedup::testing
