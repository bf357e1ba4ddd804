// The scheduler: owns requests, pages and the prefix cache; turns them into one Plan per step.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "page_allocator.h"
#include "prefix_cache.h"
#include "request.h"

namespace sched {

struct SchedulerConfig {
  int32_t num_pages = 4096;  // including the reserved null page 0
  int32_t page_size = 16;
  int32_t max_running = 256;
  int32_t token_budget = 2048;  // tokens per step: decode tokens + prefill chunks
  int32_t max_context = 4096;   // prompt + generated tokens; reaching it finishes with "length"
  bool enable_prefix_cache = true;
  std::vector<int32_t> eos_token_ids;
  int32_t finished_history = 4096;  // finished/aborted requests kept for output_ids()
  // 0 or 1. With 1, a planned decode row also gets the page of its *next* position when that
  // position opens a page and a page is free or evictable (never by retracting anyone), so
  // the step after this one can be launched before this one's ids are back (the serving
  // loop's lookahead). Plan::next_slot_mapping says which rows have it.
  int32_t decode_reserve_tokens = 0;
  void validate() const;            // throws std::invalid_argument naming the field
};

// A plan's page_table [rows, width], padded with the null page 0. Buffers are recycled: when
// no Plan refers to one any more, the next plan rewrites only what changed in each row (a
// decoding request gains a page every page_size steps), not 1,024 x 256 page ids per step.
struct PageTable {
  int32_t width = 0;
  std::vector<int32_t> data;
  struct Row {
    uint64_t epoch = 0;  // the PageList this row was copied from (0: none)
    int32_t num_pages = 0;
  };
  std::vector<Row> rows;
};

// One step's batch as flat arrays (what the model runner needs), plus the private bookkeeping
// advance() uses, so a caller who edits the arrays cannot corrupt the scheduler.
struct Plan {
  uint64_t owner = 0;  // the Scheduler that made it (advance() refuses a foreign plan)
  int64_t step = 0;
  int32_t num_decode = 0;
  std::vector<int64_t> request_ids;   // [R] decodes first, then prefill chunks
  std::vector<int32_t> input_ids;     // [T]
  std::vector<int32_t> positions;     // [T]
  std::vector<int32_t> qo_indptr;     // [R+1]
  std::vector<int32_t> cached_lens;   // [R]
  std::vector<int32_t> seq_lens;      // [R]
  std::shared_ptr<const PageTable> page_table;  // [R, width]
  std::vector<int64_t> slot_mapping;  // [T]
  // [R]: where the K/V of the token this step samples goes in the row's next step (position
  // seq_lens[r]), when the row's pages already hold it; -2 when the row goes on but that
  // position's page is not held yet; -1 when the row has no next step (it ends by length
  // with this token, or this chunk does not sample). The page table rows include the page
  // of every such slot.
  std::vector<int64_t> next_slot_mapping;
  std::vector<uint8_t> sample;        // [R] bool
  std::vector<int64_t> retracted;     // [k]

  struct Entry {
    int32_t slot;
    uint32_t generation;
    int32_t num_tokens;
    bool sample;
  };
  std::vector<Entry> entries;
};

struct Event {
  int64_t request_id;
  int32_t token;  // -1 for an abort
  FinishReason reason;
};

struct Stats {
  int32_t num_pages, free_pages, cached_pages, used_pages, cache_entries, running, waiting;
  int64_t prefix_lookups, prefix_hit_tokens, prefix_query_tokens, prefix_deferrals, evictions,
      retractions, steps;
  int64_t decode_reservations;  // pages handed to decode rows one step early
  int64_t reservation_misses;   // rows that wanted one and found no free or evictable page
};

class UnknownRequest : public std::out_of_range {
 public:
  using std::out_of_range::out_of_range;
};

class Scheduler {
 public:
  explicit Scheduler(SchedulerConfig cfg);
  ~Scheduler();

  void submit(int64_t id, std::span<const int32_t> prompt, int32_t max_new_tokens,
              std::vector<int32_t> stop_token_ids = {}, bool ignore_eos = false,
              uint64_t cache_salt = 0);
  void abort(int64_t id);
  bool has_request(int64_t id) const;  // live: not finished or aborted
  int32_t num_running() const { return static_cast<int32_t>(running_.size()); }
  int32_t num_waiting() const { return num_waiting_; }
  bool has_work() const { return !running_.empty() || num_waiting_ > 0 || !events_.empty(); }

  Plan next_plan();
  std::vector<Event> advance(const Plan& plan, std::span<const int32_t> sampled_ids);

  const std::vector<int32_t>& prompt_and_output(int64_t id) const;
  std::vector<int32_t> output_ids(int64_t id) const;
  const char* request_state(int64_t id) const;
  std::vector<int32_t> request_pages(int64_t id) const;
  Stats stats() const;
  const SchedulerConfig& config() const { return cfg_; }
  // Changes SchedulerConfig::decode_reserve_tokens for the plans made from now on (0 or 1).
  // Pages already reserved stay with their rows and are used by their next step.
  void set_decode_reserve_tokens(int32_t tokens);
  const PageAllocator& allocator() const { return alloc_; }
  // Throws std::logic_error describing the first broken invariant (see invariants.cpp).
  void check_invariants() const;

 private:
  struct Scheduled {
    int32_t slot;
    int32_t num_tokens;
  };
  struct Builder {  // scratch state of one next_plan() call
    Plan plan;
    std::vector<Scheduled> batch;
    int32_t budget;
    bool retracted = false;
  };
  enum class Admission { Admitted, Deferred, NoRoom };
  Request& by_id(int64_t id);
  const Request& by_id(int64_t id) const;
  // planner.cpp
  int32_t max_hit_pages(const Request& r) const;
  void ensure_hashes(Request& r, int32_t num_pages);
  bool reserve(int32_t slot, PageList& pages, int32_t need_tokens, Builder& b);
  void retract_youngest(Builder& b);
  void schedule_prefill(int32_t slot, Prefilling& p, Builder& b);
  void admit_waiting(Builder& b);
  bool continues_after(const Request& r, int32_t seq_len) const;
  void reserve_next_pages(Builder& b);
  Admission admit(int32_t slot, Builder& b);
  void write_plan(Builder& b);
  std::shared_ptr<PageTable> page_table_buffer();
  // scheduler.cpp
  void register_pages(Request& r, int32_t slot, int32_t cached_len, const PageList& pages);
  void clear_pending(Request& r, int32_t slot);
  void free_slot(int32_t slot);
  FinishReason stop_reason(const Request& r, int32_t token) const;
  void trim_history();

  SchedulerConfig cfg_;
  int32_t max_context_;  // min(max_context, KV capacity + 1): a lone request always fits
  int32_t watermark_;    // pages kept free when admitting next to running requests
  // Declaration order matters: requests (slab_) are destroyed before the allocator, so their
  // PageLists return every page before the leak check runs.
  PageAllocator alloc_;
  PrefixCache cache_;
  RunSlots slots_;
  std::vector<Request> slab_;
  std::vector<int32_t> free_slots_;
  std::unordered_map<int64_t, int32_t> slot_of_;
  std::vector<int32_t> running_;  // slots, oldest arrival first
  std::deque<std::pair<int32_t, uint32_t>> waiting_;  // (slot, generation); stale entries skipped
  int32_t num_waiting_ = 0;
  std::deque<std::pair<int32_t, uint32_t>> history_;  // finished/aborted, oldest first
  std::unordered_map<uint64_t, int32_t> pending_;     // page hash -> slot now computing it
  std::vector<Event> events_;                         // aborts not yet reported by advance()
  uint64_t next_arrival_ = 0;
  uint64_t id_;  // unique per instance in this process: stamps the plans it makes
  int64_t step_ = 0, outstanding_step_ = -1;
  std::vector<int32_t> hits_;                         // scratch for admit()
  std::vector<std::shared_ptr<PageTable>> page_tables_;  // recycled plan page tables
  uint64_t next_epoch_ = 1;                           // numbers each admission's PageList
  int64_t lookups_ = 0, hit_tokens_ = 0, query_tokens_ = 0, deferrals_ = 0, retractions_ = 0;
  int64_t reservations_ = 0, reservation_misses_ = 0;
  int32_t reserve_bound_ = 0;  // the largest decode_reserve_tokens ever set (invariants)
};

}  // namespace sched
