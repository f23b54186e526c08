#pragma once
// librdkafka's log lines in kdedup's log. Without a log callback librdkafka
// prints "%7|1700000000.123|FAC|rdkafka#consumer-3| ..." straight to stderr,
// past the log format and level; every librdkafka client kdedup creates
// (pipeline, recovery reads, test broker and its clients) hands its lines
// here instead, from an EventCb's EVENT_LOG or a C log callback.

#include <string_view>

namespace kdedup {

/// Logs one line of the librdkafka client `client` at syslog `severity`
/// (0 emergency .. 7 debug) through spdlog's default logger: errors and
/// worse as errors, warnings as warnings, and notice/info/debug at info:
/// debug lines exist only when the operator turned librdkafka `debug`
/// contexts on, so log_level must not hide them. Any thread (librdkafka
/// calls from its own threads).
void log_librdkafka(std::string_view client, int severity, std::string_view facility,
                    std::string_view message);

}  // namespace kdedup
