#include "message_view.h"

namespace kdedup::pipeline {

const identity::RecordView& MessageView::of(RdKafka::Message& m) {
  copies_.clear();
  names_.clear();
  headers_.clear();
  if (const RdKafka::Headers* hs = m.headers(); hs != nullptr && hs->size() > 0) {
    copies_ = hs->get_all();
    names_.reserve(copies_.size());
    for (const auto& h : copies_) names_.push_back(h.key());
    for (std::size_t h = 0; h < copies_.size(); ++h) {
      identity::RecordHeader rh{};
      rh.name = names_[h];
      if (copies_[h].value() != nullptr) {
        rh.value =
            std::string_view(static_cast<const char*>(copies_[h].value()), copies_[h].value_size());
      }
      headers_.push_back(rh);
    }
  }
  view_ = identity::RecordView{};
  if (m.key_pointer() != nullptr) {
    view_.key = std::string_view(static_cast<const char*>(m.key_pointer()), m.key_len());
  }
  if (m.payload() != nullptr) {
    view_.value = std::string_view(static_cast<const char*>(m.payload()), m.len());
  }
  view_.headers = headers_;
  return view_;
}

}  // namespace kdedup::pipeline
