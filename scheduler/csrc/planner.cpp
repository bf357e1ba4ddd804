// next_plan(): decide who runs this step and lay the batch out as flat arrays.
//
// Order of decisions: (1) one decode token for every Decoding request, oldest first;
// (2) the next prefill chunk of every admitted Prefilling request, oldest first; (3) admit
// waiting requests in FIFO order (prefix-cache lookup first). All of it is bounded by
// token_budget (decode tokens count) and max_running.
//
// Retraction policy: when a running request needs a page and none is free or evictable, the
// *youngest* running request (latest arrival) is retracted: its pages are released and it is
// requeued at the head of the waiting queue to recompute prompt + outputs. Youngest because
// (a) it has usually done the least work, so recompute is cheapest, and (b) the oldest request
// is then never retracted, so it always progresses and finishes: no livelock, FIFO fairness.
// A request keeps its arrival number when retracted, so it becomes the oldest in time.
//
// Next-page reservation (decode_reserve_tokens = 1): after everything above, each planned
// decode row whose next position opens a page takes that page now if one is free or
// evictable; otherwise it goes without (no retraction, no effect on this step's batch). It is
// the page the row's next step would take anyway, one step early, so the next step's
// allocations (and retractions) are the same as without it; a row that finishes returns it.
#include <algorithm>

#include "scheduler.h"

namespace sched {
namespace {

constexpr int kMaxDeferredPerPlan = 16;  // bounds the lookups spent on deferred requests

inline int32_t pages_for(int64_t tokens, int32_t page_size) {
  return static_cast<int32_t>((tokens + page_size - 1) / page_size);
}

}  // namespace

int32_t Scheduler::max_hit_pages(const Request& r) const {
  // At least one token is always computed: that step is the one that samples, and the page it
  // writes is then never a shared cached page.
  return (static_cast<int32_t>(r.tokens.size()) - 1) / cfg_.page_size;
}

void Scheduler::ensure_hashes(Request& r, int32_t num_pages) {
  const int32_t ps = cfg_.page_size;
  while (static_cast<int32_t>(r.page_hashes.size()) < num_pages) {
    size_t k = r.page_hashes.size();
    uint64_t prev = k == 0 ? PrefixCache::root_hash(r.salt) : r.page_hashes[k - 1];
    r.page_hashes.push_back(PrefixCache::hash_page(prev, &r.tokens[k * ps], ps));
  }
}

// Grows `pages` to cover need_tokens, retracting the youngest running requests while the
// allocator is short. False if `slot` itself was the youngest and is now retracted.
bool Scheduler::reserve(int32_t slot, PageList& pages, int32_t need_tokens, Builder& b) {
  int32_t missing = pages_for(need_tokens, cfg_.page_size) - pages.size();
  while (missing > alloc_.available()) {
    bool self = running_.back() == slot;
    retract_youngest(b);
    if (self) return false;
  }
  pages.grow(missing);
  return true;
}

void Scheduler::retract_youngest(Builder& b) {
  int32_t slot = running_.back();
  running_.pop_back();
  Request& r = slab_[slot];
  clear_pending(r, slot);
  r.apply(Retract{});
  // Planned earlier in this step (a decode younger than the prefill now short of pages)?
  for (size_t i = b.batch.size(); i-- > 0;) {
    if (b.batch[i].slot == slot) {
      b.budget += b.batch[i].num_tokens;
      b.batch.erase(b.batch.begin() + static_cast<std::ptrdiff_t>(i));
      break;
    }
  }
  waiting_.emplace_front(slot, r.generation);  // youngest retracted first => oldest ends in front
  ++num_waiting_;
  ++retractions_;
  b.retracted = true;
  b.plan.retracted.push_back(r.id);
}

void Scheduler::schedule_prefill(int32_t slot, Prefilling& p, Builder& b) {
  const int32_t ps = cfg_.page_size;
  const int32_t len = static_cast<int32_t>(slab_[slot].tokens.size());
  const int32_t want = std::min(len - p.cached_len, b.budget);
  auto fit = [&] {  // tokens that fit in held pages plus everything the allocator can give
    int64_t room = int64_t(p.pages.size()) * ps - p.cached_len + int64_t(alloc_.available()) * ps;
    return static_cast<int32_t>(std::min<int64_t>(want, room));
  };
  int32_t n = fit();
  if (n <= 0) {
    if (!reserve(slot, p.pages, p.cached_len + 1, b)) return;
    n = fit();
  }
  reserve(slot, p.pages, p.cached_len + n, b);  // fits: no retraction
  b.batch.push_back({slot, n});
  b.budget -= n;
}

Scheduler::Admission Scheduler::admit(int32_t slot, Builder& b) {
  Request& r = slab_[slot];
  const int32_t ps = cfg_.page_size;
  const int32_t len = static_cast<int32_t>(r.tokens.size());
  hits_.clear();
  int32_t hit_max = cfg_.enable_prefix_cache ? max_hit_pages(r) : 0;
  if (hit_max > 0) {
    ensure_hashes(r, hit_max);
    cache_.match(r.page_hashes.data(), hit_max, r.tokens.data(), r.salt, hits_);
    // The first page we miss is being computed by a running prefill: wait for it rather than
    // compute (and allocate) the same page twice.
    int32_t m = static_cast<int32_t>(hits_.size());
    if (m < hit_max) {
      auto it = pending_.find(r.page_hashes[m]);
      if (it != pending_.end() && it->second != slot) {
        ++deferrals_;
        return Admission::Deferred;
      }
    }
  }
  PageList pages(&alloc_);
  for (int32_t page : hits_) pages.share(page);
  const int32_t cached_len = static_cast<int32_t>(hits_.size()) * ps;
  // Next to running requests keep a few pages back, or the newcomer is retracted next step.
  int64_t room = int64_t(alloc_.available() - (running_.empty() ? 0 : watermark_)) * ps;
  int32_t n = static_cast<int32_t>(std::min<int64_t>({len - cached_len, b.budget, room}));
  if (n <= 0) return Admission::NoRoom;  // `pages` hands the hits back to the LRU
  pages.grow(pages_for(cached_len + n, ps) - pages.size());

  const int32_t num_hits = static_cast<int32_t>(hits_.size());
  r.num_registered = r.pending_end = num_hits;
  if (cfg_.enable_prefix_cache) {
    int32_t full = len / ps;
    ensure_hashes(r, full);
    for (int32_t k = num_hits; k < full; ++k) pending_.emplace(r.page_hashes[k], slot);
    r.pending_end = full;
  }
  r.pages_epoch = next_epoch_++;
  ++lookups_;
  query_tokens_ += len;
  hit_tokens_ += cached_len;
  r.apply(Admit{std::move(pages), RunSlot(&slots_), cached_len});
  auto pos = std::upper_bound(running_.begin(), running_.end(), r.arrival,
                              [&](uint64_t a, int32_t s) { return a < slab_[s].arrival; });
  running_.insert(pos, slot);
  --num_waiting_;
  b.batch.push_back({slot, n});
  b.budget -= n;
  return Admission::Admitted;
}

void Scheduler::admit_waiting(Builder& b) {
  std::vector<std::pair<int32_t, uint32_t>> deferred;
  while (!waiting_.empty() && b.budget > 0 && slots_.free() > 0) {
    auto [slot, generation] = waiting_.front();
    const Request& r = slab_[slot];
    bool live = r.in_use && r.generation == generation &&
                (std::holds_alternative<Waiting>(r.state) ||
                 std::holds_alternative<Retracted>(r.state));
    if (!live) {  // aborted (or replaced) while queued
      waiting_.pop_front();
      continue;
    }
    Admission a = admit(slot, b);
    if (a == Admission::NoRoom) break;
    waiting_.pop_front();
    if (a == Admission::Deferred) {
      deferred.emplace_back(slot, generation);
      if (static_cast<int>(deferred.size()) == kMaxDeferredPerPlan) break;
    }
  }
  for (auto it = deferred.rbegin(); it != deferred.rend(); ++it) waiting_.push_front(*it);
}

Plan Scheduler::next_plan() {
  Builder b;
  b.plan.owner = id_;
  b.plan.step = ++step_;
  outstanding_step_ = step_;
  b.budget = cfg_.token_budget;
  for (size_t i = 0; i < running_.size() && b.budget > 0; ++i) {
    int32_t slot = running_[i];
    auto* d = std::get_if<Decoding>(&slab_[slot].state);
    if (d == nullptr || !reserve(slot, d->pages, d->cached_len + 1, b)) continue;
    b.batch.push_back({slot, 1});
    b.budget -= 1;
  }
  for (size_t i = 0; i < running_.size() && b.budget > 0; ++i) {
    int32_t slot = running_[i];
    if (auto* p = std::get_if<Prefilling>(&slab_[slot].state)) schedule_prefill(slot, *p, b);
  }
  // After a retraction the retracted request heads the queue; admitting anything now would
  // only hand back the pages that retraction just freed.
  if (!b.retracted) admit_waiting(b);
  if (cfg_.decode_reserve_tokens > 0) reserve_next_pages(b);
  write_plan(b);
  return std::move(b.plan);
}

// Whether a request whose step computes up to seq_len tokens (and samples the next) can be
// planned again: not when the sampled token ends it by length.
bool Scheduler::continues_after(const Request& r, int32_t seq_len) const {
  return seq_len + 1 < max_context_ && r.num_generated() + 1 < r.max_new_tokens;
}

void Scheduler::reserve_next_pages(Builder& b) {
  const int32_t ps = cfg_.page_size;
  for (const Scheduled& s : b.batch) {
    Request& r = slab_[s.slot];
    auto* d = std::get_if<Decoding>(&r.state);
    if (d == nullptr) continue;  // a prefill chunk: its first decode step reserves
    const int32_t seq = d->cached_len + 1;
    const int32_t want = pages_for(int64_t(seq) + cfg_.decode_reserve_tokens, ps);
    if (want <= d->pages.size() || !continues_after(r, seq)) continue;
    if (alloc_.available() < want - d->pages.size()) {
      ++reservation_misses_;
      continue;
    }
    d->pages.grow(want - d->pages.size());
    reservations_ += 1;
  }
}

void Scheduler::write_plan(Builder& b) {
  const int32_t ps = cfg_.page_size;
  Plan& plan = b.plan;
  const size_t R = b.batch.size();
  size_t T = 0;
  int32_t width = 0;
  for (const Scheduled& s : b.batch) T += s.num_tokens;
  plan.request_ids.reserve(R);
  plan.qo_indptr.reserve(R + 1);
  plan.cached_lens.reserve(R);
  plan.seq_lens.reserve(R);
  plan.sample.reserve(R);
  plan.next_slot_mapping.reserve(R);
  plan.entries.reserve(R);
  plan.input_ids.reserve(T);
  plan.positions.reserve(T);
  plan.slot_mapping.reserve(T);
  plan.qo_indptr.push_back(0);
  std::vector<const PageList*> page_lists(R);
  for (size_t i = 0; i < R; ++i) {
    const Scheduled& s = b.batch[i];
    const Request& r = slab_[s.slot];
    int32_t cached = 0;
    if (auto* d = std::get_if<Decoding>(&r.state)) {
      page_lists[i] = &d->pages;
      cached = d->cached_len;
      ++plan.num_decode;  // decodes were planned first, so they lead the batch
    } else {
      const auto& p = std::get<Prefilling>(r.state);
      page_lists[i] = &p.pages;
      cached = p.cached_len;
    }
    const int32_t seq = cached + s.num_tokens;
    const bool sample = seq == static_cast<int32_t>(r.tokens.size());
    const int32_t* pages = page_lists[i]->pages().data();
    const int32_t held = page_lists[i]->size();  // a decode row may hold its next page too
    width = std::max(width, held);
    int64_t next = -1;  // no step after this one
    if (sample && continues_after(r, seq))
      next = int64_t(held) * ps > seq ? int64_t(pages[seq / ps]) * ps + seq % ps : -2;
    plan.next_slot_mapping.push_back(next);
    plan.request_ids.push_back(r.id);
    plan.qo_indptr.push_back(static_cast<int32_t>(plan.input_ids.size()) + s.num_tokens);
    plan.cached_lens.push_back(cached);
    plan.seq_lens.push_back(seq);
    plan.sample.push_back(sample);
    plan.entries.push_back({s.slot, r.generation, s.num_tokens, sample});
    if (s.num_tokens == 1) {  // decode: skip a memmove call per request
      plan.input_ids.push_back(r.tokens[cached]);
    } else {
      plan.input_ids.insert(plan.input_ids.end(), r.tokens.begin() + cached, r.tokens.begin() + seq);
    }
    for (int32_t pos = cached; pos < seq; ++pos) {
      plan.positions.push_back(pos);
      plan.slot_mapping.push_back(int64_t(pages[pos / ps]) * ps + pos % ps);
    }
  }
  std::shared_ptr<PageTable> table = page_table_buffer();
  if (table->width != width) table->rows.clear();  // new row stride: rewrite every row
  table->width = width;
  table->data.resize(R * width);
  table->rows.resize(R);
  for (size_t i = 0; i < R; ++i) {
    const Request& r = slab_[b.batch[i].slot];
    const int32_t* pages = page_lists[i]->pages().data();
    const int32_t n = page_lists[i]->size();
    int32_t* row = &table->data[i * width];
    PageTable::Row& old = table->rows[i];
    if (old.epoch == r.pages_epoch && old.num_pages <= n) {
      // Same PageList as when this row was written; it only grew since, and the rest of the
      // row is still the zero padding.
      for (int32_t k = old.num_pages; k < n; ++k) row[k] = pages[k];  // usually 0 or 1 page
    } else {
      std::copy(pages, pages + n, row);
      std::fill(row + n, row + width, 0);  // page 0: the null page
    }
    old = {r.pages_epoch, n};
  }
  plan.page_table = std::move(table);
}

std::shared_ptr<PageTable> Scheduler::page_table_buffer() {
  constexpr size_t kPooled = 3;  // the plan in flight, the one before, one spare
  for (auto& t : page_tables_) {
    if (t.use_count() == 1) return t;  // no Plan holds it any more
  }
  auto fresh = std::make_shared<PageTable>();
  if (page_tables_.size() < kPooled) page_tables_.push_back(fresh);
  return fresh;
}

}  // namespace sched
