// Requests in and out: submit, abort, advance, and the read-only queries.
#include "scheduler.h"

#include <algorithm>
#include <atomic>

namespace sched {
namespace {

std::invalid_argument bad(const std::string& what) { return std::invalid_argument(what); }

constexpr int32_t kTokensReserved = 1024;  // outputs a request's token vector has room for

uint64_t next_scheduler_id() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Abort: return "abort";
    default: return "";
  }
}

void SchedulerConfig::validate() const {
  auto positive = [](const char* field, int64_t v) {
    if (v <= 0) throw bad(std::string(field) + " must be > 0, got " + std::to_string(v));
  };
  if (num_pages < 2)
    throw bad("num_pages must be >= 2 (page 0 is the reserved null page), got " +
              std::to_string(num_pages));
  positive("page_size", page_size);
  positive("max_running", max_running);
  positive("token_budget", token_budget);
  if (max_context < 2) throw bad("max_context must be >= 2, got " + std::to_string(max_context));
  if (finished_history < 0) throw bad("finished_history must be >= 0");
  if (decode_reserve_tokens < 0 || decode_reserve_tokens > 1)
    throw bad("decode_reserve_tokens must be 0 or 1, got " + std::to_string(decode_reserve_tokens));
  if (int64_t(num_pages) * page_size > INT32_MAX)
    throw bad("num_pages * page_size must fit in int32 (token positions are int32)");
}

Scheduler::Scheduler(SchedulerConfig cfg)
    : cfg_((cfg.validate(), std::move(cfg))),
      max_context_(static_cast<int32_t>(
          std::min<int64_t>(cfg_.max_context, int64_t(cfg_.num_pages - 1) * cfg_.page_size + 1))),
      watermark_(std::max(1, cfg_.num_pages / 100)),
      alloc_(cfg_.num_pages),
      cache_(alloc_, cfg_.page_size),
      slots_(cfg_.max_running),
      id_(next_scheduler_id()),
      reserve_bound_(cfg_.decode_reserve_tokens) {
  alloc_.set_evict_callback([this](int32_t page) { cache_.on_evict(page); });
}

Scheduler::~Scheduler() = default;

void Scheduler::set_decode_reserve_tokens(int32_t tokens) {
  SchedulerConfig cfg = cfg_;
  cfg.decode_reserve_tokens = tokens;
  cfg.validate();
  cfg_.decode_reserve_tokens = tokens;
  reserve_bound_ = std::max(reserve_bound_, tokens);
}

Request& Scheduler::by_id(int64_t id) {
  auto it = slot_of_.find(id);
  if (it == slot_of_.end()) throw UnknownRequest("unknown request id " + std::to_string(id));
  return slab_[it->second];
}

const Request& Scheduler::by_id(int64_t id) const {
  return const_cast<Scheduler*>(this)->by_id(id);
}

void Scheduler::submit(int64_t id, std::span<const int32_t> prompt, int32_t max_new_tokens,
                       std::vector<int32_t> stop_token_ids, bool ignore_eos, uint64_t cache_salt) {
  const std::string who = "request " + std::to_string(id) + ": ";
  auto it = slot_of_.find(id);
  if (it != slot_of_.end() && !slab_[it->second].terminal())
    throw bad(who + "duplicate request id (a live request already has it)");
  const int64_t len = static_cast<int64_t>(prompt.size());
  const int64_t capacity = int64_t(cfg_.num_pages - 1) * cfg_.page_size;
  if (len == 0) throw bad(who + "empty prompt");
  if (len > capacity)
    throw bad(who + "prompt of " + std::to_string(len) + " tokens is longer than the whole KV cache (" +
              std::to_string(capacity) + " tokens)");
  if (len >= cfg_.max_context)
    throw bad(who + "prompt of " + std::to_string(len) + " tokens leaves no room to generate under max_context=" +
              std::to_string(cfg_.max_context));
  if (max_new_tokens < 1)
    throw bad(who + "max_new_tokens must be >= 1, got " + std::to_string(max_new_tokens));
  for (int64_t i = 0; i < len; ++i) {
    if (prompt[i] < 0)
      throw bad(who + "prompt_ids[" + std::to_string(i) + "] = " + std::to_string(prompt[i]) +
                " is not a token id");
  }
  if (it != slot_of_.end()) free_slot(it->second);  // a finished request's id is reused

  int32_t slot;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
  } else {
    slot = static_cast<int32_t>(slab_.size());
    slab_.emplace_back();
  }
  Request& r = slab_[slot];
  r.id = id;
  r.arrival = next_arrival_++;
  r.in_use = true;
  // Room for the first outputs too: the first sampled token otherwise reallocates (and
  // copies) the whole prompt inside advance(), ~0.1 ms for a 50k-token agent turn.
  r.tokens.reserve(static_cast<size_t>(len) +
                   static_cast<size_t>(std::min(max_new_tokens, kTokensReserved)));
  r.tokens.assign(prompt.begin(), prompt.end());
  r.prompt_len = static_cast<int32_t>(len);
  r.max_new_tokens = max_new_tokens;
  r.stop_token_ids = std::move(stop_token_ids);
  r.ignore_eos = ignore_eos;
  r.salt = cache_salt;
  r.state = Waiting{};
  slot_of_[id] = slot;
  waiting_.emplace_back(slot, r.generation);
  ++num_waiting_;
}

void Scheduler::free_slot(int32_t slot) {
  Request& r = slab_[slot];
  slot_of_.erase(r.id);
  uint32_t generation = r.generation + 1;  // stale plan entries and queue entries see this
  r = Request{};
  r.generation = generation;
  free_slots_.push_back(slot);
}

void Scheduler::abort(int64_t id) {
  Request& r = by_id(id);
  const int32_t slot = slot_of_.at(id);
  const bool was_running = r.running();
  const bool was_waiting =
      std::holds_alternative<Waiting>(r.state) || std::holds_alternative<Retracted>(r.state);
  r.apply(Abort{});  // throws (state unchanged) for a finished or already aborted request
  clear_pending(r, slot);
  if (was_running) running_.erase(std::find(running_.begin(), running_.end(), slot));
  if (was_waiting) --num_waiting_;  // its queue entry is now stale and skipped
  events_.push_back({id, -1, FinishReason::Abort});
  history_.emplace_back(slot, r.generation);
  trim_history();
}

bool Scheduler::has_request(int64_t id) const {
  auto it = slot_of_.find(id);
  return it != slot_of_.end() && !slab_[it->second].terminal();
}

FinishReason Scheduler::stop_reason(const Request& r, int32_t token) const {
  auto has = [token](const std::vector<int32_t>& ids) {
    return std::find(ids.begin(), ids.end(), token) != ids.end();
  };
  if (has(r.stop_token_ids) || (!r.ignore_eos && has(cfg_.eos_token_ids)))
    return FinishReason::Stop;
  if (r.num_generated() >= r.max_new_tokens ||
      static_cast<int32_t>(r.tokens.size()) >= max_context_)
    return FinishReason::Length;
  return FinishReason::None;
}

std::vector<Event> Scheduler::advance(const Plan& plan, std::span<const int32_t> sampled_ids) {
  // A plan from another Scheduler (or a default-constructed one) can carry any slot numbers:
  // refuse it before reading its entries, whatever its step number.
  if (plan.owner != id_)
    throw bad("advance() takes a plan made by this Scheduler's next_plan(); this one was made "
              "by another Scheduler");
  for (size_t i = 0; i < plan.entries.size(); ++i) {
    const Plan::Entry& e = plan.entries[i];
    if (e.slot < 0 || static_cast<size_t>(e.slot) >= slab_.size())
      throw bad("plan entry " + std::to_string(i) + " names slot " + std::to_string(e.slot) +
                ", not a slot of this Scheduler");
  }
  if (plan.step != outstanding_step_)
    throw bad("advance() takes the plan returned by the latest next_plan(), once (plan step " +
              std::to_string(plan.step) + ", expected " + std::to_string(outstanding_step_) + ")");
  const size_t R = plan.entries.size();
  if (sampled_ids.size() != R)
    throw bad("sampled_ids has length " + std::to_string(sampled_ids.size()) +
              ", expected one entry per planned request (" + std::to_string(R) + ")");
  for (size_t i = 0; i < R; ++i) {
    if (plan.entries[i].sample && sampled_ids[i] < 0)
      throw bad("sampled_ids[" + std::to_string(i) + "] = " + std::to_string(sampled_ids[i]) +
                " is not a token id");
  }
  outstanding_step_ = -1;
  std::vector<Event> events = std::move(events_);
  events_.clear();
  events.reserve(events.size() + R);
  bool any_finished = false;
  for (size_t i = 0; i < R; ++i) {
    const Plan::Entry& e = plan.entries[i];
    Request& r = slab_[e.slot];
    if (!r.in_use || r.generation != e.generation || !r.running()) continue;  // aborted since
    if (auto* p = std::get_if<Prefilling>(&r.state)) {
      register_pages(r, e.slot, p->cached_len + e.num_tokens, p->pages);
      if (!e.sample) {
        r.apply(Compute{e.num_tokens});
        continue;
      }
      r.apply(StartDecode{e.num_tokens});
    } else {
      auto& d = std::get<Decoding>(r.state);
      register_pages(r, e.slot, d.cached_len + 1, d.pages);
      r.apply(DecodeStep{});
    }
    const int32_t token = sampled_ids[i];
    r.tokens.push_back(token);
    FinishReason reason = stop_reason(r, token);
    if (reason != FinishReason::None) {
      r.apply(Finish{reason});
      history_.emplace_back(e.slot, r.generation);
      any_finished = true;
    }
    events.push_back({r.id, token, reason});
  }
  if (any_finished) {
    running_.erase(std::remove_if(running_.begin(), running_.end(),
                                  [&](int32_t s) { return !slab_[s].running(); }),
                   running_.end());
  }
  trim_history();
  return events;
}

void Scheduler::register_pages(Request& r, int32_t slot, int32_t cached_len,
                               const PageList& pages) {
  const int32_t ps = cfg_.page_size;
  const int32_t full = cached_len / ps;
  if (!cfg_.enable_prefix_cache || full <= r.num_registered) return;
  ensure_hashes(r, full);
  for (int32_t k = r.num_registered; k < full; ++k) {
    uint64_t prev = k == 0 ? PrefixCache::root_hash(r.salt) : r.page_hashes[k - 1];
    cache_.insert(r.page_hashes[k], prev, r.salt, &r.tokens[size_t(k) * ps], pages.pages()[k]);
    if (k >= r.pending_end) continue;  // decode pages were never announced as in flight
    auto it = pending_.find(r.page_hashes[k]);
    if (it != pending_.end() && it->second == slot) pending_.erase(it);
  }
  r.num_registered = full;
  r.pending_end = std::max(r.pending_end, full);
}

void Scheduler::clear_pending(Request& r, int32_t slot) {
  for (int32_t k = r.num_registered; k < r.pending_end; ++k) {
    auto it = pending_.find(r.page_hashes[k]);
    if (it != pending_.end() && it->second == slot) pending_.erase(it);
  }
  r.pending_end = r.num_registered;
}

void Scheduler::trim_history() {
  while (static_cast<int32_t>(history_.size()) > cfg_.finished_history) {
    auto [slot, generation] = history_.front();
    history_.pop_front();
    if (slab_[slot].in_use && slab_[slot].generation == generation) free_slot(slot);
  }
}

const std::vector<int32_t>& Scheduler::prompt_and_output(int64_t id) const {
  return by_id(id).tokens;
}

std::vector<int32_t> Scheduler::output_ids(int64_t id) const {
  const Request& r = by_id(id);
  return {r.tokens.begin() + r.prompt_len, r.tokens.end()};
}

const char* Scheduler::request_state(int64_t id) const { return by_id(id).state_name(); }

std::vector<int32_t> Scheduler::request_pages(int64_t id) const {
  const Request& r = by_id(id);
  if (auto* p = std::get_if<Prefilling>(&r.state)) return p->pages.pages();
  if (auto* d = std::get_if<Decoding>(&r.state)) return d->pages.pages();
  return {};
}

Stats Scheduler::stats() const {
  return Stats{cfg_.num_pages, alloc_.num_free(), alloc_.num_evictable(), alloc_.num_used(),
               cache_.num_entries(), num_running(), num_waiting_, lookups_, hit_tokens_,
               query_tokens_, deferrals_, alloc_.evictions(), retractions_, step_,
               reservations_, reservation_misses_};
}

}  // namespace sched
