#pragma once
// BrokerProcess: `kdedup testbroker` running as a child process, as the demo,
// the benchmarks and the integration tests use it. Reads the bootstrap line,
// then sends control commands on the child's stdin and reads the reply lines
// from its stdout. Stopping sends SIGTERM and waits.
//
// Owned by one thread; not thread-safe.

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kdedup/common/result.h"
#include "kdedup/testbroker/child_process.h"

namespace kdedup::testbroker {

struct BrokerOptions {
  std::string kdedup_binary;        ///< path of the kdedup executable
  int brokers = 3;                  ///< mock brokers in the cluster
  std::vector<std::string> topics;  ///< "NAME:PARTITIONS[:REPLICATION]"
  std::string stderr_file;          ///< broker log; inherited stderr when empty
};

class BrokerProcess {
 public:
  /// Starts the broker and waits (up to 20 s) for its bootstrap line.
  [[nodiscard]] static Result<std::unique_ptr<BrokerProcess>> start(const BrokerOptions& options);

  /// Comma-separated host:port list for `bootstrap.servers`.
  [[nodiscard]] const std::string& bootstrap() const noexcept { return bootstrap_; }

  /// Runs one control command ("broker 1 down"). Returns the text after
  /// "ok " on success, or an error carrying the broker's reason.
  [[nodiscard]] Result<std::string> control(std::string_view command);

  /// SIGTERM and wait; returns the exit status (0 = clean shutdown).
  int stop();

  [[nodiscard]] ChildProcess& process() noexcept { return *child_; }

 private:
  BrokerProcess() = default;
  std::unique_ptr<ChildProcess> child_;
  std::string bootstrap_;
};

}  // namespace kdedup::testbroker
