// One `kdedup run` of the memory e2e tests (memory_test.cc, park_test.cc),
// with metrics on a free loopback port, and the records and checks they
// share.

#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "broker.h"
#include "http_get.h"
#include "kdedup/testbroker/child_process.h"
#include "metrics_doc.h"
#include "process.h"
#include "prometheus_query.h"

namespace kdedup::testing {

inline std::int64_t wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

/// Resident memory of a process, in bytes (VmRSS).
inline double rss_bytes(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtod(line.c_str() + 6, nullptr) * 1024.0;
  }
  return 0;
}

/// One `kdedup run` with metrics on a free loopback port and its log in `dir`.
class Instance {
 public:
  /// `extra`: more top-level config; `metrics`: more keys of the metrics
  /// section (indented by two spaces); `threads`: worker threads.
  Instance(const TempDir& dir, const std::string& name, const std::string& bootstrap,
           const std::string& extra, const std::string& metrics = "", int threads = 2)
      : log_(dir.file(name + ".log")), port_(free_port()) {
    const std::string path = dir.file(name + ".yaml");
    write_file(path,
               "group_id: memory-e2e\n"
               "input:\n  topics: [in]\n"
               "output:\n  topic: out\n"
               "identity:\n  extractor: key\n  salt: memory-salt\n"
               "threads: " +
                   std::to_string(threads) +
                   "\n"
                   "on_invalid: drop\n"
                   "commit_interval: 200ms\n"
                   "shutdown_timeout: 20s\n"
                   "kafka:\n  bootstrap.servers: \"" +
                   bootstrap +
                   "\"\n"
                   "consumer:\n  session.timeout.ms: \"6000\"\n"
                   "  heartbeat.interval.ms: \"500\"\n"
                   "metrics:\n  address: \"127.0.0.1:" +
                   std::to_string(port_) + "\"\n" + metrics + extra);
    testbroker::ChildOptions o;
    o.stderr_file = log_;
    auto p = testbroker::ChildProcess::spawn({KDEDUP_BINARY, "run", "--config", path}, o);
    EXPECT_TRUE(p) << p.error().message;
    if (p) process_ = std::move(*p);
  }

  [[nodiscard]] bool running() const { return process_ && !process_->poll_exit(); }
  [[nodiscard]] std::string log() const { return read_file(log_); }
  [[nodiscard]] pid_t pid() const { return process_->pid(); }
  testbroker::ChildProcess& process() { return *process_; }

  /// The current /metrics text ("" when it does not answer).
  [[nodiscard]] std::string scrape() const {
    auto r = http_get(port_, "/metrics");
    return r.status == 200 ? r.body : std::string();
  }
  [[nodiscard]] double sum(const std::string& name,
                           const std::vector<std::string>& labels = {}) const {
    return exposition_sum(scrape(), name, labels).value_or(-1.0);
  }
  /// The value of each series of `name`, in the order scraped.
  [[nodiscard]] std::vector<double> values(const std::string& name) const {
    std::vector<double> out;
    std::istringstream in(scrape());
    for (std::string line; std::getline(in, line);) {
      if (line.rfind(name, 0) != 0 || line.size() <= name.size()) continue;
      if (line[name.size()] != '{' && line[name.size()] != ' ') continue;
      out.push_back(std::strtod(line.c_str() + line.rfind(' ') + 1, nullptr));
    }
    return out;
  }
  [[nodiscard]] double max(const std::string& name) const {
    const std::vector<double> all = values(name);
    return all.empty() ? -1 : *std::max_element(all.begin(), all.end());
  }

  /// Waits until `done()` holds (polled every 100 ms) or `limit` passes.
  bool wait_for(const std::function<bool()>& done, std::chrono::seconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      if (!running()) return false;
      if (done()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }
  /// Waits until the sum of `name` over its series is `value` (wait_for()).
  bool wait_for_sum(const std::string& name, double value, std::chrono::seconds limit) {
    return wait_for([&] { return sum(name) == value; }, limit);
  }

 private:
  std::string log_;
  int port_;
  std::unique_ptr<testbroker::ChildProcess> process_;
};

inline std::size_t count_lines(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) {
    ++n;
  }
  return n;
}

/// Keys "<prefix><i>" for i in [from, to), stamped `at` (0: now), by key
/// partitioner.
inline std::vector<TestRecord> keys(const std::string& prefix, int from, int to,
                                    std::int64_t at = 0) {
  std::vector<TestRecord> out;
  const std::int64_t now = at != 0 ? at : wall_ms();
  for (int i = from; i < to; ++i) {
    TestRecord r;
    r.key = prefix + std::to_string(i);
    r.value = "v";
    r.timestamp_ms = now;
    out.push_back(std::move(r));
  }
  return out;
}

/// Keys "<prefix><i>" for i in [0, per_second * seconds), a tenth of a
/// second's worth per stamp, stamped from `from_ms` on (event time).
inline std::vector<TestRecord> stamped(const std::string& prefix, int per_second,
                                       std::int64_t from_ms, int seconds) {
  std::vector<TestRecord> records;
  const int step = per_second / 10;
  for (int i = 0; i < seconds * 10; ++i) {
    auto part = keys(prefix, i * step, (i + 1) * step, from_ms + i * 100LL);
    records.insert(records.end(), part.begin(), part.end());
  }
  return records;
}

/// Every output key at most once (the filter never lets a duplicate
/// through inside the window); returns the number of outputs.
inline std::size_t expect_each_key_once(TestBroker& b) {
  auto out = b.read_topic("out");
  EXPECT_TRUE(out) << out.error().message;
  if (!out) return 0;
  std::map<std::string, int> seen;
  for (const auto& r : *out) {
    if (r.key && ++seen[*r.key] == 2) ADD_FAILURE() << *r.key << " emitted twice";
  }
  return out->size();
}

}  // namespace kdedup::testing
