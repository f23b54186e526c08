// One `kdedup run` of an e2e test that lasts until the output topic holds
// what the test waits for: the tests that read the instance's log afterwards
// (librdkafka's lines, the salt warning, the prefetch bound) share it.

#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <string>
#include <thread>
#include <vector>

#include "broker.h"
#include "kdedup/testbroker/child_process.h"
#include "process.h"

namespace kdedup::testing {

/// Runs `kdedup run --config CONFIG [extra_args...]` with its stderr in
/// `log_file` until topic `out` holds `expected_out` records or `limit`
/// passed, then SIGTERM; expects a clean exit and returns the log.
inline std::string run_until_output(TestBroker& broker, const std::string& config,
                                    const std::string& log_file, std::size_t expected_out,
                                    const std::vector<std::string>& extra_args = {},
                                    std::chrono::seconds limit = std::chrono::seconds(40)) {
  using namespace std::chrono_literals;
  std::vector<std::string> argv{KDEDUP_BINARY, "run", "--config", config};
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  testbroker::ChildOptions o;
  o.stderr_file = log_file;
  auto p = testbroker::ChildProcess::spawn(argv, o);
  EXPECT_TRUE(p) << p.error().message;
  if (!p) return "";
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    auto out = broker.read_topic("out", 5s);
    if (out && out->size() >= expected_out) break;
    std::this_thread::sleep_for(200ms);
  }
  (*p)->signal(SIGTERM);
  EXPECT_EQ((*p)->wait(30s), 0) << read_file(log_file);
  return read_file(log_file);
}

}  // namespace kdedup::testing
