#include "kdedup/metrics/server.h"

#include <CivetServer.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <charconv>
#include <chrono>
#include <exception>
#include <thread>

namespace kdedup::metrics {
namespace {

void respond(mg_connection* conn, int status, const char* reason, const char* content_type,
             const std::string& body) {
  mg_printf(conn,
            "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
            "Cache-Control: no-store\r\nConnection: close\r\n\r\n",
            status, reason, content_type, body.size());
  mg_write(conn, body.data(), body.size());
}

void respond_probe(mg_connection* conn, const Probe& p) {
  respond(conn, p.status, p.status == 200 ? "OK" : "Service Unavailable",
          "text/plain; charset=utf-8", p.body);
}

}  // namespace

// Each handler answers GET; civetweb answers other methods with 405.
struct MetricsServer::Handlers {
  struct MetricsPage : CivetHandler {
    explicit MetricsPage(Metrics& m) : metrics(m) {}
    using CivetHandler::handleGet;
    bool handleGet(CivetServer*, mg_connection* conn) override {
      respond(conn, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", metrics.scrape());
      return true;
    }
    Metrics& metrics;
  };
  struct Liveness : CivetHandler {
    explicit Liveness(Metrics& m) : metrics(m) {}
    using CivetHandler::handleGet;
    bool handleGet(CivetServer*, mg_connection* conn) override {
      respond_probe(conn, metrics.health().liveness());
      return true;
    }
    Metrics& metrics;
  };
  struct Readiness : CivetHandler {
    explicit Readiness(Metrics& m) : metrics(m) {}
    using CivetHandler::handleGet;
    bool handleGet(CivetServer*, mg_connection* conn) override {
      respond_probe(conn, metrics.health().readiness());
      return true;
    }
    Metrics& metrics;
  };

  explicit Handlers(Metrics& m) : page(m), live(m), ready(m) {}
  MetricsPage page;
  Liveness live;
  Readiness ready;
};

Status check_listen_address(std::string_view address) {
  const std::string where = "metrics address '" + std::string(address) + "'";
  const std::size_t colon = address.rfind(':');
  if (colon == std::string_view::npos || colon == 0) {
    return fail(where + ": expected host:port, e.g. 0.0.0.0:9464");
  }
  const std::string_view host = address.substr(0, colon);
  const std::string_view port = address.substr(colon + 1);
  if (host.find(':') != std::string_view::npos && (host.front() != '[' || host.back() != ']')) {
    return fail(where + ": write IPv6 hosts in brackets, e.g. [::]:9464");
  }
  unsigned value = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (port.empty() || ec != std::errc() || end != port.data() + port.size() || value > 65535) {
    return fail(where + ": port must be a number from 0 to 65535");
  }
  return {};
}

Result<std::unique_ptr<MetricsServer>> MetricsServer::start(std::string_view address,
                                                            Metrics& metrics) {
  if (auto ok = check_listen_address(address); !ok) return tl::unexpected(ok.error());
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  server->handlers_ = std::make_unique<Handlers>(metrics);
  const std::vector<std::string> options{"listening_ports", std::string(address), "num_threads",
                                         "2"};
  try {
    // CivetServer reports a failed bind by throwing; translate it here.
    server->server_ = std::make_unique<CivetServer>(options);
  } catch (const std::exception& e) {
    return fail("metrics address '" + std::string(address) +
                "': cannot listen (in use, or not an address of this host): " + e.what());
  }
  server->server_->addHandler("/metrics", server->handlers_->page);
  server->server_->addHandler("/healthz", server->handlers_->live);
  server->server_->addHandler("/readyz", server->handlers_->ready);
  const std::vector<int> ports = server->server_->getListeningPorts();
  server->port_ = ports.empty() ? 0 : ports.front();
  const std::string_view host = address.substr(0, address.rfind(':'));
  server->wake_host_ = host == "0.0.0.0" ? "127.0.0.1" : std::string(host);
  return server;
}

MetricsServer::~MetricsServer() {
  if (!server_) return;
  // civetweb's accept loop only looks at its stop flag between polls of two
  // seconds; an incoming connection wakes it. Knock on the port while
  // close() waits, so stopping takes milliseconds (when the listener is
  // reachable over IPv4 from here; otherwise it still stops, just slower).
  std::atomic<bool> closed{false};
  std::thread knocker([this, &closed] {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<std::uint16_t>(port_));
    if (inet_pton(AF_INET, wake_host_.c_str(), &addr.sin_addr) != 1) return;
    while (!closed.load()) {
      const int fd = socket(AF_INET, SOCK_STREAM, 0);
      if (fd < 0) return;
      connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
      ::close(fd);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  server_->close();
  closed.store(true);
  knocker.join();
}

}  // namespace kdedup::metrics
