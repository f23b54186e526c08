#include "kdedup/testbroker/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <fmt/format.h>

extern char** environ;

namespace kdedup::testbroker {

Result<std::string> find_program(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = std::getenv("PATH");
  std::string_view rest = path ? path : "/usr/local/bin:/usr/bin:/bin";
  while (true) {
    auto colon = rest.find(':');
    std::string dir(rest.substr(0, colon));
    std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
    if (colon == std::string_view::npos) break;
    rest.remove_prefix(colon + 1);
  }
  return fail(fmt::format("program '{}' not found in PATH", name));
}

Result<std::unique_ptr<ChildProcess>> ChildProcess::spawn(const std::vector<std::string>& argv,
                                                          const ChildOptions& options) {
  if (argv.empty()) return fail("spawn: empty command line");
  auto program = find_program(argv[0]);
  if (!program) return tl::unexpected(program.error());

  int in[2] = {-1, -1}, out[2] = {-1, -1};
  if (options.pipe_stdin && pipe2(in, O_CLOEXEC) != 0) {
    return fail(fmt::format("spawn {}: pipe: {}", argv[0], std::strerror(errno)));
  }
  if (options.pipe_stdout && pipe2(out, O_CLOEXEC) != 0) {
    if (in[0] >= 0) close(in[0]), close(in[1]);
    return fail(fmt::format("spawn {}: pipe: {}", argv[0], std::strerror(errno)));
  }
  // Everything the child needs is prepared before fork: only async-signal-safe
  // calls happen between fork and exec.
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args[0] = program->data();
  args.push_back(nullptr);
  std::vector<std::string> env_store;
  for (char** e = environ; *e; ++e) env_store.emplace_back(*e);
  for (const auto& e : options.env) env_store.push_back(e);
  std::vector<char*> envp;
  for (auto& e : env_store) envp.push_back(e.data());
  envp.push_back(nullptr);
  const pid_t parent = getpid();

  pid_t pid = fork();
  if (pid < 0) return fail(fmt::format("spawn {}: fork: {}", argv[0], std::strerror(errno)));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(127);  // parent died before prctl took effect
    if (options.pipe_stdin) {
      dup2(in[0], 0);
    } else {
      int devnull = open("/dev/null", O_RDONLY);
      if (devnull >= 0) dup2(devnull, 0);
    }
    if (options.pipe_stdout) dup2(out[1], 1);
    if (!options.stderr_file.empty()) {
      int fd = open(options.stderr_file.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) dup2(fd, 2);
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    ::signal(SIGPIPE, SIG_DFL);
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    execve(args[0], args.data(), envp.data());
    _exit(127);
  }
  auto child = std::unique_ptr<ChildProcess>(new ChildProcess());
  child->pid_ = pid;
  child->name_ = argv.size() > 1 ? argv[0] + " " + argv[1] : argv[0];
  if (options.pipe_stdin) {
    close(in[0]);
    child->stdin_fd_ = in[1];
  }
  if (options.pipe_stdout) {
    close(out[1]);
    child->stdout_fd_ = out[0];
  }
  return child;
}

ChildProcess::~ChildProcess() {
  if (!status_) stop(std::chrono::seconds(10));
  if (stdin_fd_ >= 0) close(stdin_fd_);
  if (stdout_fd_ >= 0) close(stdout_fd_);
}

Status ChildProcess::write_stdin(std::string_view text) {
  if (stdin_fd_ < 0) return fail(name_ + ": stdin is not a pipe or was closed");
  while (!text.empty()) {
    ssize_t n = ::write(stdin_fd_, text.data(), text.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail(fmt::format("{}: write to stdin: {}", name_, std::strerror(errno)));
    }
    text.remove_prefix(static_cast<std::size_t>(n));
  }
  return {};
}

void ChildProcess::close_stdin() {
  if (stdin_fd_ >= 0) close(stdin_fd_);
  stdin_fd_ = -1;
}

Result<std::string> ChildProcess::read_line(std::chrono::milliseconds timeout) {
  if (stdout_fd_ < 0) return fail(name_ + ": stdout is not a pipe");
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    auto nl = stdout_buf_.find('\n');
    if (nl != std::string::npos) {
      std::string line = stdout_buf_.substr(0, nl);
      stdout_buf_.erase(0, nl + 1);
      return line;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      return fail(fmt::format("{}: no line on stdout within {} ms", name_, timeout.count()));
    }
    pollfd p{stdout_fd_, POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>(left.count()));
    if (r < 0 && errno != EINTR)
      return fail(fmt::format("{}: poll: {}", name_, std::strerror(errno)));
    if (r <= 0) continue;
    char buf[4096];
    ssize_t n = ::read(stdout_fd_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return fail(name_ + ": closed stdout (exited?)");
    stdout_buf_.append(buf, static_cast<std::size_t>(n));
  }
}

void ChildProcess::signal(int sig) {
  if (!status_ && pid_ > 0) ::kill(pid_, sig);
}

std::optional<int> ChildProcess::poll_exit() {
  if (status_) return status_;
  int st = 0;
  pid_t r = waitpid(pid_, &st, WNOHANG);
  if (r == pid_) status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return status_;
}

std::optional<int> ChildProcess::wait(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!poll_exit()) {
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return status_;
}

int ChildProcess::stop(std::chrono::milliseconds grace) {
  if (poll_exit()) return *status_;
  signal(SIGTERM);
  if (auto st = wait(grace)) return *st;
  signal(SIGKILL);
  int st = 0;
  waitpid(pid_, &st, 0);
  status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return *status_;
}

}  // namespace kdedup::testbroker
