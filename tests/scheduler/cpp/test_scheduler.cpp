#include <algorithm>
#include <map>
#include <numeric>
#include <random>

#include "harness.h"
#include "scheduler.h"

using namespace sched;
using V = std::vector<int32_t>;

static SchedulerConfig small_config() {
  SchedulerConfig c;
  c.num_pages = 33;  // 32 usable pages of 4 tokens
  c.page_size = 4;
  c.max_running = 4;
  c.token_budget = 16;
  c.max_context = 64;
  c.eos_token_ids = {2};
  return c;
}

static std::vector<int32_t> iota_tokens(int32_t n, int32_t start = 10) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

static std::vector<Event> step(Scheduler& s, Plan& plan, int32_t token = 7) {
  plan = s.next_plan();
  std::vector<int32_t> sampled(plan.entries.size(), token);
  auto events = s.advance(plan, sampled);
  s.check_invariants();
  return events;
}

TEST(chunked_prefill_then_decode) {
  Scheduler s(small_config());
  s.submit(1, iota_tokens(20), 3);
  Plan p;
  step(s, p);
  CHECK(p.entries.size() == 1 && p.input_ids.size() == 16 && !p.sample[0]);  // budget 16
  CHECK(p.page_table->width == 4 && p.slot_mapping[5] == int64_t(p.page_table->data[1]) * 4 + 1);
  auto ev = step(s, p);
  CHECK(p.cached_lens[0] == 16 && p.seq_lens[0] == 20 && p.sample[0] && p.num_decode == 0);
  CHECK(ev.size() == 1 && ev[0].token == 7 && ev[0].reason == FinishReason::None);
  step(s, p);
  CHECK(p.num_decode == 1 && p.positions[0] == 20 && p.input_ids[0] == 7);
  ev = step(s, p);
  CHECK(ev.size() == 1 && ev[0].reason == FinishReason::Length);
  CHECK(s.output_ids(1) == std::vector<int32_t>({7, 7, 7}) && !s.has_work());
}

TEST(decodes_come_first_and_budget_counts_them) {
  Scheduler s(small_config());
  s.submit(1, iota_tokens(3), 10);
  Plan p;
  step(s, p);
  s.submit(2, iota_tokens(30, 100), 10);
  step(s, p);
  CHECK(p.num_decode == 1 && p.request_ids[0] == 1 && p.request_ids[1] == 2);
  CHECK(p.qo_indptr[2] - p.qo_indptr[1] == 15);  // 16 - 1 decode token
}

TEST(prefix_hit_starts_at_cached_length_and_shares_pages) {
  Scheduler s(small_config());
  std::vector<int32_t> prompt = iota_tokens(13);
  s.submit(1, prompt, 1);
  Plan p;
  step(s, p);  // computes 13 tokens: pages 0..2 are full and get cached
  s.submit(2, prompt, 2);
  step(s, p);
  CHECK(p.cached_lens[0] == 12 && p.input_ids.size() == 1);  // 3 pages hit, last token computed
  Stats st = s.stats();
  CHECK(st.prefix_hit_tokens == 12 && st.prefix_query_tokens == 26);
  // Exactly 12 tokens: the last full page is left for computing, so hit = 8.
  s.submit(3, iota_tokens(12), 1);
  step(s, p);
  CHECK(p.request_ids.back() == 3 && p.cached_lens.back() == 8 && p.seq_lens.back() == 12);
}

TEST(concurrent_shared_prefix_is_computed_once) {
  SchedulerConfig c = small_config();
  Scheduler s(c);  // budget 16: the leader's second chunk (14 tokens) leaves room to admit
  std::vector<int32_t> prompt = iota_tokens(30);
  for (int id = 0; id < 3; ++id) s.submit(id, prompt, 1);
  Plan p;
  for (int i = 0; i < 10 && s.has_work(); ++i) step(s, p);
  CHECK(!s.has_work() && s.stats().prefix_deferrals > 0);
  CHECK(s.stats().cache_entries == 7);           // the prompt's 7 full pages, once
  CHECK(s.stats().prefix_hit_tokens == 2 * 28);  // both followers waited, then hit 7 pages
}

TEST(youngest_running_request_is_retracted_and_recomputes) {
  SchedulerConfig c = small_config();
  c.num_pages = 9;  // 8 pages = 32 tokens
  c.enable_prefix_cache = false;
  Scheduler s(c);
  s.submit(1, iota_tokens(12), 20);
  s.submit(2, iota_tokens(12, 50), 20);
  Plan p;
  std::map<int64_t, std::vector<int32_t>> out;
  int retracted = 0;
  for (int i = 0; i < 200 && s.has_work(); ++i) {
    auto ev = step(s, p, 3 + i % 5);
    for (int64_t id : p.retracted) {
      CHECK(id == 2);  // always the younger one
      CHECK(std::string(s.request_state(id)) == "Retracted");
      ++retracted;
    }
    for (auto& e : ev) out[e.request_id].push_back(e.token);
  }
  CHECK(retracted > 0 && !s.has_work());
  CHECK(out[1].size() == 20 && out[2].size() == 20);  // nothing lost or duplicated
  CHECK(s.output_ids(2) == out[2]);
}

TEST(abort_in_every_state_frees_resources) {
  Scheduler s(small_config());
  s.submit(1, iota_tokens(30), 5);  // prefilling after one step
  s.submit(2, iota_tokens(3), 5);   // waiting behind the budget
  Plan p;
  step(s, p);
  CHECK(std::string(s.request_state(1)) == "Prefilling");
  s.abort(1);
  s.abort(2);
  CHECK_THROWS(s.abort(2), InvalidEvent, "request 2: event Abort is invalid in state Aborted");
  CHECK_THROWS(s.abort(99), UnknownRequest, "unknown request id 99");
  auto ev = step(s, p);
  CHECK(ev.size() == 2 && ev[0].reason == FinishReason::Abort && ev[1].token == -1);
  CHECK(s.stats().used_pages == 0 && !s.has_work());
  // Aborted between next_plan() and advance(): the planned entry is skipped.
  s.submit(3, iota_tokens(5), 5);
  p = s.next_plan();
  s.abort(3);
  ev = s.advance(p, std::vector<int32_t>(p.entries.size(), 7));
  CHECK(ev.size() == 1 && ev[0].reason == FinishReason::Abort);
  s.check_invariants();
}

TEST(stop_conditions) {
  SchedulerConfig c = small_config();
  c.max_context = 8;
  Scheduler s(c);
  s.submit(1, iota_tokens(3), 10, {5});
  s.submit(2, iota_tokens(3), 10);
  s.submit(3, iota_tokens(3), 10, {}, /*ignore_eos=*/true);
  s.submit(4, iota_tokens(6), 10);  // max_context 8: two tokens
  Plan p = s.next_plan();
  auto ev = s.advance(p, V{5, 2, 2, 9});
  CHECK(ev[0].reason == FinishReason::Stop && ev[1].reason == FinishReason::Stop);
  CHECK(ev[2].reason == FinishReason::None && ev[3].reason == FinishReason::None);
  p = s.next_plan();
  ev = s.advance(p, V{9, 9});
  CHECK(ev[1].request_id == 4 && ev[1].reason == FinishReason::Length);
}

TEST(bad_input_is_rejected_without_side_effects) {
  SchedulerConfig c = small_config();
  c.token_budget = 0;
  CHECK_THROWS(Scheduler{c}, std::invalid_argument, "token_budget must be > 0");
  c = small_config();
  c.max_running = -1;
  CHECK_THROWS(Scheduler{c}, std::invalid_argument, "max_running");
  c = small_config();
  c.num_pages = 1;
  CHECK_THROWS(Scheduler{c}, std::invalid_argument, "num_pages");
  Scheduler s(small_config());
  CHECK_THROWS(s.submit(1, {}, 5), std::invalid_argument, "empty prompt");
  CHECK_THROWS(s.submit(1, iota_tokens(200), 5), std::invalid_argument, "longer than the whole KV cache");
  CHECK_THROWS(s.submit(1, iota_tokens(64), 5), std::invalid_argument, "max_context");
  CHECK_THROWS(s.submit(1, iota_tokens(4), 0), std::invalid_argument, "max_new_tokens");
  CHECK_THROWS(s.submit(1, V{1, -3}, 4), std::invalid_argument, "prompt_ids[1]");
  s.submit(1, iota_tokens(4), 5);
  CHECK_THROWS(s.submit(1, iota_tokens(4), 5), std::invalid_argument, "duplicate request id");
  Plan p = s.next_plan();
  CHECK_THROWS(s.advance(p, V{}), std::invalid_argument, "sampled_ids has length 0");
  CHECK_THROWS(s.advance(p, V{-1}), std::invalid_argument, "not a token id");
  Plan stale = p;
  s.advance(p, V{7});
  CHECK_THROWS(s.advance(stale, V{7}), std::invalid_argument, "latest next_plan");
  s.check_invariants();
  CHECK(s.num_running() == 1 && s.output_ids(1).size() == 1);
}

// Page tables are recycled between plans; a plan someone still holds must never change.
TEST(page_table_rows_are_recycled_but_held_plans_stay_intact) {
  SchedulerConfig c = small_config();
  c.max_context = 120;
  c.num_pages = 64;
  Scheduler s(c);
  for (int id = 0; id < 3; ++id) s.submit(id, iota_tokens(5 + id, 10 * id), 60);
  Plan held;
  std::vector<int32_t> held_copy;
  for (int i = 0; i < 40; ++i) {
    Plan p = s.next_plan();
    const PageTable& t = *p.page_table;
    for (size_t row = 0; row < p.entries.size(); ++row) {
      std::vector<int32_t> pages = s.request_pages(p.request_ids[row]);
      int32_t n = (p.seq_lens[row] + c.page_size - 1) / c.page_size;
      for (int32_t k = 0; k < t.width; ++k)
        CHECK(t.data[row * t.width + k] == (k < n ? pages[k] : 0));
    }
    if (i == 10) {
      held = p;
      held_copy = held.page_table->data;
    }
    s.advance(p, std::vector<int32_t>(p.entries.size(), 9));
    if (i == 25) s.abort(1);  // rows shift: a recycled row now belongs to another request
  }
  CHECK(held.page_table->data == held_copy);
}

TEST(random_workload_keeps_invariants) {
  for (uint64_t seed = 0; seed < 8; ++seed) {
    std::mt19937_64 rng(seed);
    SchedulerConfig c = small_config();
    c.decode_reserve_tokens = static_cast<int32_t>(seed % 2);  // next-page reservation too
    c.num_pages = 12 + static_cast<int32_t>(rng() % 20);
    c.max_running = 1 + static_cast<int32_t>(rng() % 6);
    c.token_budget = 1 + static_cast<int32_t>(rng() % 24);
    c.max_context = 40;
    c.finished_history = 1000000;
    Scheduler s(c);
    std::vector<std::vector<int32_t>> prefixes = {iota_tokens(12), iota_tokens(9, 40), {}};
    int64_t next_id = 0;
    std::map<int64_t, std::vector<int32_t>> out;
    for (int i = 0; i < 1500; ++i) {
      uint64_t dice = rng() % 10;
      if (dice < 3) {
        std::vector<int32_t> prompt = prefixes[rng() % 3];
        for (uint64_t k = 1 + rng() % 10; k > 0; --k) prompt.push_back(3 + rng() % 5);
        s.submit(next_id++, prompt, 1 + rng() % 12, {}, false, rng() % 4 == 0);
      } else if (dice == 3 && next_id > 0) {
        int64_t id = static_cast<int64_t>(rng() % next_id);
        if (s.has_request(id)) s.abort(id);
      } else {
        Plan p = s.next_plan();
        std::vector<int32_t> sampled(p.entries.size());
        for (auto& t : sampled) t = rng() % 20 == 0 ? 2 : 3 + rng() % 50;
        for (auto& e : s.advance(p, sampled)) {
          if (e.token >= 0) out[e.request_id].push_back(e.token);
        }
      }
      s.check_invariants();
    }
    for (int i = 0; i < 5000 && s.has_work(); ++i) {
      Plan p = s.next_plan();
      for (auto& e : s.advance(p, std::vector<int32_t>(p.entries.size(), 9))) {
        if (e.token >= 0) out[e.request_id].push_back(e.token);
      }
    }
    REQUIRE(!s.has_work());
    s.check_invariants();
    CHECK(s.stats().used_pages == 0);
    for (int64_t id = 0; id < next_id; ++id) {
      std::string state = s.request_state(id);
      CHECK(state == "Finished" || state == "Aborted");
      CHECK(s.output_ids(id) == out[id]);
    }
  }
}

TEST(decode_reserves_its_next_page) {
  SchedulerConfig c = small_config();
  c.decode_reserve_tokens = 1;
  Scheduler s(c);
  s.submit(1, iota_tokens(6), 20);  // pages of 4: positions 6, 7 fill page 2, 8 opens page 3
  Plan p;
  step(s, p);  // prefill: next position 6 is in page 2
  CHECK(p.next_slot_mapping.size() == 1 && p.next_slot_mapping[0] == p.page_table->data[1] * 4 + 2);
  step(s, p);  // decode at 6
  CHECK(s.request_pages(1).size() == 2 && p.page_table->width == 2);
  step(s, p);  // decode at 7: the page of position 8 is taken now
  std::vector<int32_t> pages = s.request_pages(1);
  REQUIRE(pages.size() == 3);
  CHECK(p.page_table->width == 3 && p.page_table->data[2] == pages[2]);
  CHECK(p.next_slot_mapping[0] == int64_t(pages[2]) * 4);
  CHECK(s.stats().decode_reservations == 1 && s.stats().used_pages == 3);
  step(s, p);  // decode at 8 writes into the reserved page: nothing new
  CHECK(s.request_pages(1) == pages && p.slot_mapping[0] == int64_t(pages[2]) * 4);
  s.abort(1);
  CHECK(s.stats().used_pages == 0);
  s.check_invariants();
  CHECK_THROWS(s.set_decode_reserve_tokens(3), std::invalid_argument, "decode_reserve_tokens");
}

HARNESS_MAIN
