#include "message_view.h"

#include <librdkafka/rdkafka.h>

namespace kdedup::pipeline {
namespace {

/// Appends the headers of `m` to `out` (views into the message).
void append_headers(const rd_kafka_message_t& m, std::vector<identity::RecordHeader>& out) {
  rd_kafka_headers_t* headers = nullptr;
  if (rd_kafka_message_headers(&m, &headers) != RD_KAFKA_RESP_ERR_NO_ERROR) return;
  const char* name = nullptr;
  const void* value = nullptr;
  std::size_t size = 0;
  for (std::size_t i = 0;
       rd_kafka_header_get_all(headers, i, &name, &value, &size) == RD_KAFKA_RESP_ERR_NO_ERROR;
       ++i) {
    identity::RecordHeader h{};
    h.name = name;
    if (value != nullptr) h.value = std::string_view(static_cast<const char*>(value), size);
    out.push_back(h);
  }
}

/// Key and value of `m`; headers left empty.
identity::RecordView key_and_value(const rd_kafka_message_t& m) {
  identity::RecordView view;
  if (m.key != nullptr) view.key = std::string_view(static_cast<const char*>(m.key), m.key_len);
  if (m.payload != nullptr) {
    view.value = std::string_view(static_cast<const char*>(m.payload), m.len);
  }
  return view;
}

}  // namespace

const identity::RecordView& MessageView::of(const rd_kafka_message_t& m) {
  headers_.clear();
  append_headers(m, headers_);
  view_ = key_and_value(m);
  view_.headers = headers_;
  return view_;
}

std::span<const RecordIn> BatchView::of(std::span<const MessagePtr> messages, bool headers) {
  records_.resize(messages.size());
  headers_.clear();
  first_.resize(messages.size() + 1);
  for (std::size_t i = 0; i < messages.size(); ++i) {
    first_[i] = headers_.size();
    if (headers) append_headers(*messages[i], headers_);
  }
  first_[messages.size()] = headers_.size();
  // Spans are taken once every header is in place (the vector may move).
  for (std::size_t i = 0; i < messages.size(); ++i) {
    RecordIn& r = records_[i];
    r.offset = messages[i]->offset;
    r.timestamp_ms = timestamp_ms(*messages[i]);
    r.view = key_and_value(*messages[i]);
    r.view.headers = std::span(headers_).subspan(first_[i], first_[i + 1] - first_[i]);
  }
  return records_;
}

}  // namespace kdedup::pipeline
