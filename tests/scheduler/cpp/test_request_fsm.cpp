#include "harness.h"
#include "request.h"

using namespace sched;

static Request make_request(int64_t id) {
  Request r;
  r.id = id;
  r.tokens = {1, 2, 3, 4, 5};
  r.prompt_len = 5;
  return r;
}

TEST(happy_path_moves_pages_and_slot) {
  PageAllocator alloc(8);
  RunSlots slots(2);
  {
    Request r = make_request(1);
    PageList pages(&alloc);
    pages.grow(2);
    r.apply(Admit{std::move(pages), RunSlot(&slots), 0});
    CHECK(std::string(r.state_name()) == "Prefilling" && slots.used() == 1);
    r.apply(Compute{4});
    CHECK(std::get<Prefilling>(r.state).cached_len == 4);
    r.apply(StartDecode{1});
    CHECK(std::get<Decoding>(r.state).cached_len == 5 && std::get<Decoding>(r.state).pages.size() == 2);
    CHECK(alloc.num_used() == 2 && slots.used() == 1);
    r.apply(DecodeStep{});
    CHECK(std::get<Decoding>(r.state).cached_len == 6);
    r.apply(Finish{FinishReason::Stop});
    CHECK(std::string(r.state_name()) == "Finished");
    CHECK(alloc.num_used() == 0 && slots.used() == 0);  // Finish released both
  }
}

TEST(retract_and_abort_release_everything) {
  PageAllocator alloc(8);
  RunSlots slots(4);
  Request a = make_request(1), b = make_request(2);
  for (Request* r : {&a, &b}) {
    PageList pages(&alloc);
    pages.grow(3);
    r->apply(Admit{std::move(pages), RunSlot(&slots), 0});
  }
  CHECK(alloc.num_used() == 6 && slots.used() == 2);
  a.apply(Retract{});
  CHECK(std::string(a.state_name()) == "Retracted" && alloc.num_used() == 3 && slots.used() == 1);
  b.apply(StartDecode{5});
  b.apply(Abort{});
  CHECK(alloc.num_used() == 0 && slots.used() == 0);
  a.apply(Abort{});  // Retracted -> Aborted
  Request w = make_request(3);
  w.apply(Abort{});  // Waiting -> Aborted
  CHECK(std::string(w.state_name()) == "Aborted");
}

TEST(invalid_events_throw_and_name_request_state_event) {
  PageAllocator alloc(8);
  RunSlots slots(1);
  Request r = make_request(42);
  CHECK_THROWS(r.apply(DecodeStep{}), InvalidEvent, "request 42: event DecodeStep is invalid in state Waiting");
  CHECK_THROWS(r.apply(Retract{}), InvalidEvent, "event Retract is invalid in state Waiting");
  CHECK_THROWS(r.apply(Finish{FinishReason::Stop}), InvalidEvent, "state Waiting");
  PageList pages(&alloc);
  pages.grow(1);
  r.apply(Admit{std::move(pages), RunSlot(&slots), 0});
  // A rejected event leaves the state (and the resources it owns) untouched.
  PageList more(&alloc);
  more.grow(1);
  CHECK_THROWS(r.apply(Admit{std::move(more), RunSlot(), 0}), InvalidEvent, "event Admit is invalid in state Prefilling");
  CHECK(std::get<Prefilling>(r.state).pages.size() == 1 && alloc.num_used() == 1);
  CHECK_THROWS(r.apply(DecodeStep{}), InvalidEvent, "in state Prefilling");
  r.apply(Abort{});
  CHECK_THROWS(r.apply(Abort{}), InvalidEvent, "request 42: event Abort is invalid in state Aborted");
  CHECK(alloc.num_used() == 0 && slots.used() == 0);
}

HARNESS_MAIN
