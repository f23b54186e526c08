// `kdedup testbroker`: a standalone Kafka-protocol cluster (librdkafka's mock
// cluster) on loopback for tests, the demo and benchmarks, with a line-based
// control channel for fault injection on stdin and, optionally, a loopback
// TCP port. Prints the bootstrap servers as its first stdout line.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "command.h"
#include "kdedup/testbroker/control.h"
#include "kdedup/testbroker/mock_cluster.h"

namespace {

using kdedup::testbroker::ControlChannel;
using kdedup::testbroker::MockCluster;

// Closes a file descriptor when it goes out of scope.
struct Fd {
  int fd = -1;
  explicit Fd(int f = -1) : fd(f) {}
  Fd(Fd&& o) noexcept : fd(o.fd) { o.fd = -1; }
  Fd& operator=(Fd&& o) noexcept {
    std::swap(fd, o.fd);
    return *this;
  }
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

// One control input: stdin or a TCP client; buffers partial lines.
struct ControlInput {
  Fd in;
  int out = -1;  // where replies go (stdout for stdin, the socket otherwise)
  std::string buffer;
};

bool write_all(int fd, const std::string& text) {
  std::size_t done = 0;
  while (done < text.size()) {
    ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

struct TopicSpec {
  std::string name;
  int partitions = 1;
  int replication = 0;
};

kdedup::Result<TopicSpec> parse_topic_spec(const std::string& spec) {
  TopicSpec t;
  auto c1 = spec.find(':');
  if (c1 == std::string::npos || c1 == 0) {
    return kdedup::fail(fmt::format("--topic '{}': expected NAME:PARTITIONS[:REPLICATION]", spec));
  }
  t.name = spec.substr(0, c1);
  auto c2 = spec.find(':', c1 + 1);
  try {
    std::size_t used = 0;
    std::string parts =
        spec.substr(c1 + 1, c2 == std::string::npos ? std::string::npos : c2 - c1 - 1);
    t.partitions = std::stoi(parts, &used);
    if (used != parts.size()) throw std::invalid_argument(parts);
    if (c2 != std::string::npos) {
      std::string repl = spec.substr(c2 + 1);
      t.replication = std::stoi(repl, &used);
      if (used != repl.size()) throw std::invalid_argument(repl);
    }
  } catch (const std::exception&) {
    return kdedup::fail(
        fmt::format("--topic '{}': PARTITIONS and REPLICATION must be integers", spec));
  }
  return t;
}

kdedup::Result<Fd> listen_loopback(int port, int& bound_port) {
  Fd s(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (s.fd < 0) return kdedup::fail(fmt::format("control port: socket: {}", std::strerror(errno)));
  int one = 1;
  setsockopt(s.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(s.fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    return kdedup::fail(fmt::format("control port {}: bind: {}", port, std::strerror(errno)));
  }
  if (listen(s.fd, 16) != 0) {
    return kdedup::fail(fmt::format("control port {}: listen: {}", port, std::strerror(errno)));
  }
  socklen_t len = sizeof addr;
  getsockname(s.fd, reinterpret_cast<sockaddr*>(&addr), &len);
  bound_port = ntohs(addr.sin_port);
  return s;
}

/// Writes the bootstrap servers to `path` completely (written, then renamed
/// into place) before the stdout line appears, so a reader of either never
/// sees a partial address.
kdedup::Status write_bootstrap_file(const std::string& path, const std::string& bootstrap) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << bootstrap << "\n";
    if (!f.flush()) return kdedup::fail(fmt::format("--bootstrap-file {}: cannot write", path));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return kdedup::fail(fmt::format("--bootstrap-file {}: {}", path, std::strerror(errno)));
  }
  return {};
}

/// Reads what `input` has and executes each complete line, replying on its
/// output; at EOF the input is closed (and later removed).
void read_commands(ControlInput& input, ControlChannel& channel) {
  char buf[4096];
  ssize_t n = read(input.in.fd, buf, sizeof buf);
  if (n < 0 && errno == EINTR) return;
  if (n <= 0) {
    input.in = Fd();  // EOF: stop reading this input, keep serving
    return;
  }
  input.buffer.append(buf, static_cast<std::size_t>(n));
  std::size_t nl;
  while ((nl = input.buffer.find('\n')) != std::string::npos) {
    std::string line = input.buffer.substr(0, nl);
    input.buffer.erase(0, nl + 1);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    std::string reply = channel.execute(line);
    if (reply.empty()) continue;
    std::fprintf(stderr, "kdedup testbroker: %s -> %s\n", line.c_str(), reply.c_str());
    write_all(input.out, reply + "\n");
    if (channel.quit_requested()) break;
  }
}

/// Serves control commands from stdin and the control port (`listener`,
/// fd -1 = none) until SIGTERM or SIGINT is readable on `stop_signal` (a
/// signalfd), a `quit`, or poll fails. Returns the exit status.
int serve_control(ControlChannel& channel, const Fd& stop_signal, const Fd& listener) {
  std::vector<ControlInput> inputs;
  inputs.push_back(ControlInput{Fd(dup(STDIN_FILENO)), STDOUT_FILENO, {}});
  while (!channel.quit_requested()) {
    std::vector<pollfd> fds;
    fds.push_back({stop_signal.fd, POLLIN, 0});
    fds.push_back({listener.fd, POLLIN, 0});  // fd -1 is ignored by poll
    for (const auto& in : inputs) fds.push_back({in.in.fd, POLLIN, 0});
    if (poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      std::fprintf(stderr, "kdedup testbroker: poll: %s\n", std::strerror(errno));
      return 1;
    }
    if (fds[0].revents) break;  // SIGTERM / SIGINT
    // Only the inputs that were polled have an entry in fds: a client
    // accepted below is read from the next turn on.
    const std::size_t polled = inputs.size();
    if (fds[1].revents & POLLIN) {
      int client = accept4(listener.fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (client >= 0) inputs.push_back(ControlInput{Fd(client), client, {}});
    }
    for (std::size_t i = 0; i < polled; ++i) {
      if (!(fds[i + 2].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      read_commands(inputs[i], channel);
    }
    std::erase_if(inputs, [](const ControlInput& in) { return in.in.fd < 0; });
  }
  std::fprintf(stderr, "kdedup testbroker: stopping\n");
  return 0;
}

int fail_with(const std::string& message, int status) {
  std::fprintf(stderr, "kdedup testbroker: %s\n", message.c_str());
  return status;
}

int testbroker_main(int argc, char** argv) {
  CLI::App app{
      "Runs a Kafka-protocol test cluster (librdkafka mock cluster) on 127.0.0.1 until SIGTERM or "
      "SIGINT. Prints the bootstrap servers as the first stdout line. Control commands (one per "
      "line, one 'ok ...'/'error ...' reply line each) are read from stdin and from the control "
      "port: broker <id> down|up; rtt <broker> <ms>; errors <Api> <count> <ErrCode>...; topic "
      "create <name> <partitions> [<replication>]; help; quit. Limits: at most ~5 MiB kept per "
      "partition, no transaction markers.",
      "kdedup testbroker"};
  int brokers = 3;
  std::vector<std::string> topic_specs;
  std::string bootstrap_file;
  int control_port = -1;
  app.add_option("--brokers", brokers, "Number of brokers, ids 1..N (default 3)")
      ->check(CLI::Range(1, 64));
  app.add_option("--topic", topic_specs,
                 "Topic to create, NAME:PARTITIONS[:REPLICATION] (repeatable; replication "
                 "defaults to min(3, brokers))");
  app.add_option("--bootstrap-file", bootstrap_file, "Also write the bootstrap servers here");
  app.add_option("--control-port", control_port,
                 "Loopback TCP port for control commands (0 = pick one; printed as the second "
                 "stdout line 'control 127.0.0.1:PORT')")
      ->check(CLI::Range(0, 65535));
  if (auto code = kdedup::app::parse_command_line(app, argc, argv)) return *code;

  std::vector<TopicSpec> topics;
  for (const auto& s : topic_specs) {
    auto t = parse_topic_spec(s);
    if (!t) return fail_with(t.error().message, 2);
    topics.push_back(*t);
  }

  // SIGTERM and SIGINT are blocked in every thread (the mock cluster's
  // threads inherit the mask) and read from a signalfd by the poll loop: no
  // handler runs on whichever thread the kernel picks, so a stop is never
  // held back by a thread that is busy or a sanitizer's deferred delivery.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  if (int err = pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr); err != 0) {
    return fail_with(std::string("pthread_sigmask: ") + std::strerror(err), 1);
  }
  Fd sig_read(signalfd(-1, &stop_signals, SFD_CLOEXEC));
  if (sig_read.fd < 0) return fail_with(std::string("signalfd: ") + std::strerror(errno), 1);
  signal(SIGPIPE, SIG_IGN);

  auto cluster = MockCluster::start(brokers);
  if (!cluster) return fail_with(cluster.error().message, 1);
  for (const auto& t : topics) {
    if (auto ok = (*cluster)->create_topic(t.name, t.partitions, t.replication); !ok) {
      return fail_with("--topic: " + ok.error().message, 2);
    }
  }

  Fd listener;
  int bound_port = 0;
  if (control_port >= 0) {
    auto l = listen_loopback(control_port, bound_port);
    if (!l) return fail_with(l.error().message, 1);
    listener = std::move(*l);
  }

  const std::string& bootstrap = (*cluster)->bootstrap();
  if (!bootstrap_file.empty()) {
    if (auto ok = write_bootstrap_file(bootstrap_file, bootstrap); !ok) {
      return fail_with(ok.error().message, 1);
    }
  }
  std::printf("%s\n", bootstrap.c_str());
  if (listener.fd >= 0) std::printf("control 127.0.0.1:%d\n", bound_port);
  std::fflush(stdout);
  std::fprintf(stderr, "kdedup testbroker: %d brokers at %s\n", brokers, bootstrap.c_str());

  ControlChannel channel(**cluster);
  return serve_control(channel, sig_read, listener);
}

const kdedup::app::CommandRegistration kTestbrokerCommand{
    "testbroker", "Kafka-protocol test cluster on loopback with fault injection", testbroker_main};

}  // namespace
