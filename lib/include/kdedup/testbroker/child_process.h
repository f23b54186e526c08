#pragma once
// ChildProcess: a program started by `kdedup demo`, the benchmarks and the
// test fixtures (the test broker, `kdedup run` instances). The child gets
// SIGTERM if its parent dies (PR_SET_PDEATHSIG) so nothing outlives a crashed
// demo; the destructor sends SIGTERM, waits a grace period, then SIGKILLs.
//
// Owned by one thread; not thread-safe.

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kdedup/common/result.h"

namespace kdedup::testbroker {

struct ChildOptions {
  bool pipe_stdin = false;   ///< else /dev/null
  bool pipe_stdout = false;  ///< else inherited
  /// stderr: inherited when empty, else appended to this file.
  std::string stderr_file;
  /// Extra environment entries "NAME=value" on top of the parent's.
  std::vector<std::string> env;
};

class ChildProcess {
 public:
  /// Starts argv (argv[0] is a path or a name looked up in PATH).
  [[nodiscard]] static Result<std::unique_ptr<ChildProcess>> spawn(
      const std::vector<std::string>& argv, const ChildOptions& options = {});

  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  [[nodiscard]] pid_t pid() const noexcept { return pid_; }
  [[nodiscard]] const std::string& name() const noexcept { return name_; }

  /// Writes `text` to the child's stdin (needs pipe_stdin).
  [[nodiscard]] Status write_stdin(std::string_view text);
  /// Closes the child's stdin (EOF).
  void close_stdin();

  /// Next line of the child's stdout without the newline (needs pipe_stdout).
  /// Fails on timeout or when the child closed stdout.
  [[nodiscard]] Result<std::string> read_line(std::chrono::milliseconds timeout);

  /// Sends a signal (no-op once reaped).
  void signal(int sig);

  /// Exit status if the child has exited (reaps it), else nullopt. The status
  /// is the exit code, or 128 + signal number.
  std::optional<int> poll_exit();

  /// Waits up to `timeout` for exit; nullopt on timeout.
  std::optional<int> wait(std::chrono::milliseconds timeout);

  /// SIGTERM, wait `grace`, then SIGKILL; returns the exit status.
  int stop(std::chrono::milliseconds grace = std::chrono::seconds(10));

 private:
  ChildProcess() = default;

  pid_t pid_ = -1;
  std::string name_;
  int stdin_fd_ = -1;
  int stdout_fd_ = -1;
  std::string stdout_buf_;
  std::optional<int> status_;
};

/// Resolves `name` through PATH (a name with '/' is returned as is).
[[nodiscard]] Result<std::string> find_program(const std::string& name);

}  // namespace kdedup::testbroker
