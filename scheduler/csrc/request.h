// Request lifecycle as a state machine. Each state owns exactly the resources that are valid
// in it; an event consumes the old state (by rvalue) and returns the new one, so every move of
// a page or a running slot is visible in the types, and dropping a state returns its pages.
//
//   Waiting --Admit--> Prefilling --Compute--> Prefilling --StartDecode--> Decoding
//   Retracted --Admit--> Prefilling            Decoding --DecodeStep--> Decoding
//   Prefilling|Decoding --Retract--> Retracted Decoding --Finish--> Finished
//   Waiting|Prefilling|Decoding|Retracted --Abort--> Aborted
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "page_allocator.h"

namespace sched {

// A place in the running batch (max_running of them). Move-only; gives the place back when
// destroyed, so "running" can never be counted wrong.
class RunSlots {
 public:
  explicit RunSlots(int32_t capacity) : capacity_(capacity) {}
  int32_t used() const { return used_; }
  int32_t free() const { return capacity_ - used_; }

 private:
  friend class RunSlot;
  int32_t capacity_, used_ = 0;
};

class RunSlot {
 public:
  RunSlot() = default;
  explicit RunSlot(RunSlots* pool) : pool_(pool) { ++pool_->used_; }
  RunSlot(RunSlot&& o) noexcept : pool_(std::exchange(o.pool_, nullptr)) {}
  RunSlot& operator=(RunSlot&& o) noexcept {
    if (this != &o) {
      reset();
      pool_ = std::exchange(o.pool_, nullptr);
    }
    return *this;
  }
  RunSlot(const RunSlot&) = delete;
  RunSlot& operator=(const RunSlot&) = delete;
  ~RunSlot() { reset(); }

 private:
  void reset() {
    if (pool_) --pool_->used_;
    pool_ = nullptr;
  }
  RunSlots* pool_ = nullptr;
};

enum class FinishReason : int8_t { None, Stop, Length, Abort };
const char* finish_reason_name(FinishReason r);

// ---- states -------------------------------------------------------------------------------
struct Waiting {  // submitted, queued; holds nothing
  static constexpr const char* name = "Waiting";
};
struct Prefilling {  // computing prompt (or recomputing prompt + outputs) chunk by chunk
  static constexpr const char* name = "Prefilling";
  PageList pages;
  RunSlot slot;
  int32_t cached_len;  // tokens whose K/V is in `pages`
};
struct Decoding {  // one token per step; cached_len == tokens.size() - 1
  static constexpr const char* name = "Decoding";
  PageList pages;
  RunSlot slot;
  int32_t cached_len;
};
struct Retracted {  // preempted for pages; queued to recompute; holds nothing
  static constexpr const char* name = "Retracted";
};
struct Finished {
  static constexpr const char* name = "Finished";
  FinishReason reason;
};
struct Aborted {
  static constexpr const char* name = "Aborted";
};
using State = std::variant<Waiting, Prefilling, Decoding, Retracted, Finished, Aborted>;

// ---- events -------------------------------------------------------------------------------
struct Admit {
  static constexpr const char* name = "Admit";
  PageList pages;  // prefix-cache hits plus fresh pages for the first chunk
  RunSlot slot;
  int32_t cached_len;  // prefix-cache hit length
  Prefilling operator()(Waiting&&) { return {std::move(pages), std::move(slot), cached_len}; }
  Prefilling operator()(Retracted&&) { return {std::move(pages), std::move(slot), cached_len}; }
};
struct Compute {  // a prefill chunk that is not the last one
  static constexpr const char* name = "Compute";
  int32_t num_tokens;
  Prefilling operator()(Prefilling&& s) const {
    s.cached_len += num_tokens;
    return std::move(s);
  }
};
struct StartDecode {  // the last prefill chunk: the request sampled its next token
  static constexpr const char* name = "StartDecode";
  int32_t num_tokens;
  Decoding operator()(Prefilling&& s) const {
    return {std::move(s.pages), std::move(s.slot), s.cached_len + num_tokens};
  }
};
struct DecodeStep {
  static constexpr const char* name = "DecodeStep";
  Decoding operator()(Decoding&& s) const {
    s.cached_len += 1;
    return std::move(s);
  }
};
struct Finish {
  static constexpr const char* name = "Finish";
  FinishReason reason;
  Finished operator()(Decoding&& s) const {
    [[maybe_unused]] Decoding released = std::move(s);  // pages and slot go back here
    return {reason};
  }
};
struct Retract {
  static constexpr const char* name = "Retract";
  Retracted operator()(Prefilling&& s) const {
    [[maybe_unused]] Prefilling released = std::move(s);
    return {};
  }
  Retracted operator()(Decoding&& s) const {
    [[maybe_unused]] Decoding released = std::move(s);
    return {};
  }
};
struct Abort {
  static constexpr const char* name = "Abort";
  template <class S, class = std::enable_if_t<!std::is_same_v<S, Finished> &&
                                               !std::is_same_v<S, Aborted>>>
  Aborted operator()(S&& s) const {
    [[maybe_unused]] S released = std::move(s);
    return {};
  }
};

class InvalidEvent : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

// ---- request ------------------------------------------------------------------------------
struct Request {
  int64_t id = 0;
  uint64_t arrival = 0;     // submit order; retraction picks the largest (youngest)
  uint32_t generation = 0;  // bumped when the slab slot is reused; plans carry it
  bool in_use = false;
  std::vector<int32_t> tokens;  // prompt followed by generated tokens
  int32_t prompt_len = 0;
  int32_t max_new_tokens = 0;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  uint64_t salt = 0;
  std::vector<uint64_t> page_hashes;  // chained hashes of the full pages of `tokens`, lazily
  int32_t num_registered = 0;         // leading pages known to be in the prefix cache
  int32_t pending_end = 0;            // pages [num_registered, pending_end) are in flight
  uint64_t pages_epoch = 0;           // set at admission: identifies the current PageList
  State state = Waiting{};

  int32_t num_generated() const { return static_cast<int32_t>(tokens.size()) - prompt_len; }
  const char* state_name() const {
    return std::visit([](const auto& s) { return std::decay_t<decltype(s)>::name; }, state);
  }
  bool running() const {
    return std::holds_alternative<Prefilling>(state) || std::holds_alternative<Decoding>(state);
  }
  bool terminal() const {
    return std::holds_alternative<Finished>(state) || std::holds_alternative<Aborted>(state);
  }

  // Applies `event` to the current state. An event with no overload for the current state is
  // a caller bug (e.g. aborting a finished request): it throws and leaves the state as it was.
  template <class Event>
  void apply(Event&& event) {
    std::visit(
        [&](auto& s) {
          using S = std::decay_t<decltype(s)>;
          if constexpr (!std::is_invocable_v<Event&, S&&>) {
            throw InvalidEvent("request " + std::to_string(id) + ": event " +
                               std::decay_t<Event>::name + " is invalid in state " + S::name);
          } else if constexpr (std::is_same_v<std::invoke_result_t<Event&, S&&>, S>) {
            s = event(std::move(s));  // a self-loop (Compute, DecodeStep) stays in place
          } else {
            state = event(std::move(s));  // `s` is consumed; not touched after this
          }
        },
        state);
  }
};

}  // namespace sched
