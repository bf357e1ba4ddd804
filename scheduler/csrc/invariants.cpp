// check_invariants(): the whole-state audit the tests run after every step.
#include <algorithm>
#include <string>

#include "scheduler.h"

namespace sched {
namespace {

[[noreturn]] void fail(const std::string& what) {
  throw std::logic_error("scheduler invariant broken: " + what);
}
std::string str(int64_t v) { return std::to_string(v); }

}  // namespace

void Scheduler::check_invariants() const {
  const int32_t N = cfg_.num_pages, ps = cfg_.page_size;
  std::vector<int32_t> owners(N, 0);
  int32_t running = 0, waiting = 0;
  for (size_t slot = 0; slot < slab_.size(); ++slot) {
    const Request& r = slab_[slot];
    if (!r.in_use) continue;
    const std::string who = "request " + str(r.id) + " (" + r.state_name() + "): ";
    auto it = slot_of_.find(r.id);
    if (it == slot_of_.end() || it->second != static_cast<int32_t>(slot)) fail(who + "id map");
    const int32_t len = static_cast<int32_t>(r.tokens.size());
    if (r.prompt_len < 1 || len > max_context_ || r.num_generated() > r.max_new_tokens)
      fail(who + "token counts out of bounds");
    const PageList* pages = nullptr;
    int32_t cached = 0;
    if (auto* p = std::get_if<Prefilling>(&r.state)) {
      pages = &p->pages;
      cached = p->cached_len;
      if (cached >= len) fail(who + "prefill has nothing left to compute");
    } else if (auto* d = std::get_if<Decoding>(&r.state)) {
      pages = &d->pages;
      cached = d->cached_len;
      if (cached != len - 1) fail(who + "decode cached_len != tokens - 1");
    } else if (std::holds_alternative<Waiting>(r.state) ||
               std::holds_alternative<Retracted>(r.state)) {
      ++waiting;
    }
    if (pages == nullptr) continue;
    ++running;
    if (pages->size() * int64_t(ps) < cached) fail(who + "pages do not cover cached_len");
    if (pages->size() > (max_context_ + ps - 1) / ps) fail(who + "more pages than max_context");
    // A prefill holds the pages of its tokens; a decode at most decode_reserve_tokens more.
    const int32_t extra = std::holds_alternative<Decoding>(r.state) ? reserve_bound_ : 0;
    if (pages->size() > (int64_t(len) + extra + ps - 1) / ps)
      fail(who + "holds " + str(pages->size()) + " pages for " + str(len) + " tokens");
    // Pages past the computed K/V (a chunk's, a reserved next page) are this request's alone.
    for (int32_t k = (cached + ps - 1) / ps; k < pages->size(); ++k) {
      int32_t page = pages->pages()[k];
      if (page > 0 && page < N && (alloc_.refcount(page) != 1 || alloc_.is_cached(page)))
        fail(who + "page " + str(page) + " holds no K/V yet but is shared or cached");
    }
    for (int32_t page : pages->pages()) {
      if (page <= 0 || page >= N) fail(who + "holds page id " + str(page));
      ++owners[page];
    }
    // The pages a request got from the prefix cache (or registered) must hold its tokens.
    if (cfg_.enable_prefix_cache) {
      for (int32_t k = 0; k < r.num_registered; ++k) {
        int32_t page = pages->pages()[k];
        if (alloc_.is_cached(page) && cache_.page_hash(page) != r.page_hashes[k])
          fail(who + "cached page " + str(page) + " has another chain hash");
      }
    }
  }
  if (running != num_running() || running != slots_.used())
    fail("running count " + str(running) + " vs running_ " + str(num_running()) + " vs slots " +
         str(slots_.used()));
  for (size_t i = 0; i < running_.size(); ++i) {
    if (!slab_[running_[i]].running()) fail("running_ holds a request that is not running");
    if (i > 0 && slab_[running_[i - 1]].arrival >= slab_[running_[i]].arrival)
      fail("running_ is not ordered by arrival");
  }
  if (waiting != num_waiting_) fail("waiting count " + str(waiting) + " vs " + str(num_waiting_));
  int32_t queued = 0;
  for (auto [slot, generation] : waiting_) {
    const Request& r = slab_[slot];
    queued += r.in_use && r.generation == generation &&
              (std::holds_alternative<Waiting>(r.state) || std::holds_alternative<Retracted>(r.state));
  }
  if (queued != num_waiting_) fail("a waiting request is missing from the queue (or twice in it)");

  // Pages: refcount == owners; each page exactly one of free / cached (unreferenced) / used.
  std::vector<uint8_t> seen(N, 0);
  if (alloc_.refcount(0) != 0 || alloc_.is_cached(0)) fail("null page 0 was handed out");
  for (int32_t page : alloc_.free_pages()) {
    if (page <= 0 || seen[page]++) fail("free list: bad or repeated page " + str(page));
    if (alloc_.refcount(page) != 0 || alloc_.is_cached(page)) fail("free page " + str(page) + " in use");
  }
  for (int32_t page : alloc_.lru_pages()) {
    if (page <= 0 || seen[page]++) fail("LRU: bad page or page also free " + str(page));
    if (alloc_.refcount(page) != 0 || !alloc_.is_cached(page)) fail("LRU page " + str(page));
  }
  int32_t cached_flags = 0;
  for (int32_t page = 1; page < N; ++page) {
    if (alloc_.refcount(page) != owners[page])
      fail("page " + str(page) + " refcount " + str(alloc_.refcount(page)) + " but " +
           str(owners[page]) + " owner(s)");
    if (owners[page] > 0 && seen[page]++) fail("page " + str(page) + " owned and free/cached");
    if (!seen[page]) fail("page " + str(page) + " leaked: not free, cached nor owned");
    if (alloc_.is_cached(page)) {
      ++cached_flags;
      if (cache_.find(cache_.page_hash(page)) != page) fail("cached page " + str(page) + " unmapped");
    }
  }
  if (cached_flags != cache_.num_entries()) fail("prefix map size != cached pages");
  for (auto [hash, slot] : pending_) {
    if (!slab_[slot].in_use || !std::holds_alternative<Prefilling>(slab_[slot].state))
      fail("in-flight page owned by a request that is not prefilling");
  }
  if (hit_tokens_ > query_tokens_) fail("prefix hit tokens exceed query tokens");
}

}  // namespace sched
