// Python bindings (nanobind): scheduler._core. Plan arrays reach Python as read-only numpy
// views that keep their Plan alive (read-only: page-table buffers are recycled by later plans,
// so a write would leak into them); no per-token Python objects except the advance() event
// tuples.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <memory>
#include <optional>

#include "scheduler.h"

namespace nb = nanobind;
using namespace nb::literals;
using sched::Plan;
using sched::Scheduler;
using sched::SchedulerConfig;

namespace {

using InIds = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

template <class T>
nb::ndarray<nb::numpy, const T> view(const std::vector<T>& v) {
  static const T empty[1] = {};
  return nb::ndarray<nb::numpy, const T>(v.empty() ? empty : v.data(), {v.size()});
}

std::span<const int32_t> span_of(const InIds& a) { return {a.data(), a.shape(0)}; }

std::vector<int32_t> narrow(const std::vector<int64_t>& ids, const char* arg) {
  std::vector<int32_t> out(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < INT32_MIN || ids[i] > INT32_MAX)
      throw std::invalid_argument(std::string(arg) + "[" + std::to_string(i) + "] = " +
                                  std::to_string(ids[i]) + " does not fit in int32");
    out[i] = static_cast<int32_t>(ids[i]);
  }
  return out;
}

PyObject* reason_object(sched::FinishReason r) {
  static PyObject* names[4] = {Py_None, PyUnicode_InternFromString("stop"),
                               PyUnicode_InternFromString("length"),
                               PyUnicode_InternFromString("abort")};
  return names[static_cast<int>(r)];
}

// Token ids are small and repeat: sharing one int object per id saves an allocation and a
// deallocation per event (about a fifth of a 1,024-request decode step). Never freed.
PyObject* token_object(int32_t token) {
  static std::vector<PyObject*> cache(size_t(1) << 18, nullptr);
  if (token < 0 || static_cast<size_t>(token) >= cache.size()) return PyLong_FromLong(token);
  PyObject*& obj = cache[token];
  if (obj == nullptr) obj = PyLong_FromLong(token);
  Py_XINCREF(obj);
  return obj;
}

// Events as a list of (request_id, token_id, finish_reason | None) tuples, built directly with
// the C API: this is the one per-request Python object cost of a step.
nb::list to_list(const std::vector<sched::Event>& events) {
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(events.size()));
  if (!list) throw nb::python_error();
  for (size_t i = 0; i < events.size(); ++i) {
    PyObject* reason = reason_object(events[i].reason);
    Py_INCREF(reason);
    PyObject* t = PyTuple_New(3);
    PyTuple_SET_ITEM(t, 0, PyLong_FromLongLong(events[i].request_id));
    PyTuple_SET_ITEM(t, 1, token_object(events[i].token));
    PyTuple_SET_ITEM(t, 2, reason);
    PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i), t);
  }
  return nb::steal<nb::list>(list);
}

using OutIds = nb::ndarray<nb::numpy, int32_t, nb::ndim<1>>;

// A list or tuple of token ids as an int32 array, in one pass that creates no Python object
// per token: numpy's conversion of a 50k-token agent turn plus the engine's scan of the entry
// types took ~2.5 ms on the development machine, every turn. nullopt when an entry is not
// exactly an int (a bool, a numpy integer, a float, ...) or lies outside [0, vocab_size): the
// caller's general path then takes it or names the bad entry.
std::optional<OutIds> token_array(nb::handle ids, int64_t vocab_size) {
  PyObject* seq = ids.ptr();
  if (!PyList_Check(seq) && !PyTuple_Check(seq)) return std::nullopt;
  if (vocab_size < 0 || vocab_size > int64_t(INT32_MAX) + 1)
    throw std::invalid_argument("vocab_size must be in [0, 2**31], got " + std::to_string(vocab_size));
  // (no Python code runs in the loop, so the list cannot change under it)
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  PyObject** items = PySequence_Fast_ITEMS(seq);
  // (one entry at least: an empty vector's data() may be null, which numpy refuses)
  auto out = std::make_unique<std::vector<int32_t>>(std::max<size_t>(size_t(n), 1));
  int32_t* dst = out->data();
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* o = items[i];
    if (!PyLong_CheckExact(o)) return std::nullopt;
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow != 0 || v < 0 || v >= vocab_size) return std::nullopt;
    dst[i] = static_cast<int32_t>(v);
  }
  std::vector<int32_t>* raw = out.release();
  nb::capsule owner(raw, [](void* v) noexcept { delete static_cast<std::vector<int32_t>*>(v); });
  return OutIds(raw->data(), {static_cast<size_t>(n)}, owner);
}

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "C++ request scheduler: page allocator, prefix cache, chunked-prefill planning.";
  nb::exception<sched::InvalidEvent>(m, "InvalidEventError", PyExc_RuntimeError);
  nb::exception<sched::UnknownRequest>(m, "UnknownRequestError", PyExc_KeyError);
  m.attr("PAGE_NULL") = 0;
  m.attr("PAGE_FREE") = 1;
  m.attr("PAGE_CACHED") = 2;
  m.attr("PAGE_USED") = 3;

  nb::class_<SchedulerConfig>(m, "SchedulerConfig")
      .def(
          "__init__",
          [](SchedulerConfig* self, int32_t num_pages, int32_t page_size, int32_t max_running,
             int32_t token_budget, int32_t max_context, bool enable_prefix_cache,
             std::vector<int32_t> eos_token_ids, int32_t finished_history,
             int32_t decode_reserve_tokens) {
            SchedulerConfig cfg{num_pages,   page_size,           max_running,
                                token_budget, max_context,        enable_prefix_cache,
                                std::move(eos_token_ids), finished_history,
                                decode_reserve_tokens};
            cfg.validate();
            new (self) SchedulerConfig(std::move(cfg));
          },
          "num_pages"_a = 4096, "page_size"_a = 16, "max_running"_a = 256,
          "token_budget"_a = 2048, "max_context"_a = 4096, "enable_prefix_cache"_a = true,
          "eos_token_ids"_a = std::vector<int32_t>{}, "finished_history"_a = 4096,
          "decode_reserve_tokens"_a = 0)
      .def_rw("num_pages", &SchedulerConfig::num_pages)
      .def_rw("page_size", &SchedulerConfig::page_size)
      .def_rw("max_running", &SchedulerConfig::max_running)
      .def_rw("token_budget", &SchedulerConfig::token_budget)
      .def_rw("max_context", &SchedulerConfig::max_context)
      .def_rw("enable_prefix_cache", &SchedulerConfig::enable_prefix_cache)
      .def_rw("eos_token_ids", &SchedulerConfig::eos_token_ids)
      .def_rw("finished_history", &SchedulerConfig::finished_history)
      .def_rw("decode_reserve_tokens", &SchedulerConfig::decode_reserve_tokens)
      .def("__repr__", [](const SchedulerConfig& c) {
        return "SchedulerConfig(num_pages=" + std::to_string(c.num_pages) +
               ", page_size=" + std::to_string(c.page_size) +
               ", max_running=" + std::to_string(c.max_running) +
               ", token_budget=" + std::to_string(c.token_budget) +
               ", max_context=" + std::to_string(c.max_context) +
               ", decode_reserve_tokens=" + std::to_string(c.decode_reserve_tokens) + ")";
      });

  m.def("token_array", &token_array, "ids"_a.none(), "vocab_size"_a,
        "int32 array of a list / tuple of exact ints in [0, vocab_size), or None (any other "
        "entry).");

  auto ro = nb::rv_policy::reference_internal;  // views keep their Plan alive
  nb::class_<Plan>(m, "Plan")
      .def_ro("step", &Plan::step)
      .def_ro("num_decode", &Plan::num_decode)
      .def_prop_ro("num_requests", [](const Plan& p) { return p.entries.size(); })
      .def_prop_ro("num_tokens", [](const Plan& p) { return p.input_ids.size(); })
      .def_prop_ro("request_ids", [](Plan& p) { return view(p.request_ids); }, ro)
      .def_prop_ro("input_ids", [](Plan& p) { return view(p.input_ids); }, ro)
      .def_prop_ro("positions", [](Plan& p) { return view(p.positions); }, ro)
      .def_prop_ro("qo_indptr", [](Plan& p) { return view(p.qo_indptr); }, ro)
      .def_prop_ro("cached_lens", [](Plan& p) { return view(p.cached_lens); }, ro)
      .def_prop_ro("seq_lens", [](Plan& p) { return view(p.seq_lens); }, ro)
      .def_prop_ro("page_table", [](Plan& p) {
            static const int32_t empty[1] = {};
            const sched::PageTable& t = *p.page_table;
            const int32_t* data = t.data.empty() ? empty : t.data.data();
            return nb::ndarray<nb::numpy, const int32_t>(data, {p.entries.size(), size_t(t.width)});
          }, ro)
      .def_prop_ro("slot_mapping", [](Plan& p) { return view(p.slot_mapping); }, ro)
      .def_prop_ro("next_slot_mapping", [](Plan& p) { return view(p.next_slot_mapping); }, ro)
      .def_prop_ro("sample", [](Plan& p) {
            static const bool empty[1] = {};
            const bool* data =
                p.sample.empty() ? empty : reinterpret_cast<const bool*>(p.sample.data());
            return nb::ndarray<nb::numpy, const bool>(data, {p.sample.size()}); }, ro)
      .def_prop_ro("retracted", [](Plan& p) { return view(p.retracted); }, ro)
      .def("__len__", [](const Plan& p) { return p.entries.size(); })
      .def("__repr__", [](const Plan& p) {
        return "Plan(step=" + std::to_string(p.step) + ", requests=" +
               std::to_string(p.entries.size()) + ", decode=" + std::to_string(p.num_decode) +
               ", tokens=" + std::to_string(p.input_ids.size()) + ")";
      });

  auto submit = [](Scheduler& s, int64_t id, std::span<const int32_t> prompt, int32_t max_new,
                   std::vector<int64_t> stop, bool ignore_eos, int64_t salt) {
    s.submit(id, prompt, max_new, narrow(stop, "stop_token_ids"), ignore_eos,
             static_cast<uint64_t>(salt));
  };
  nb::class_<Scheduler>(m, "Scheduler")
      .def(nb::init<SchedulerConfig>(), "config"_a)
      .def("submit",
           [submit](Scheduler& s, int64_t id, InIds prompt, int32_t max_new,
                    std::vector<int64_t> stop, bool ignore_eos, int64_t salt) {
             submit(s, id, span_of(prompt), max_new, std::move(stop), ignore_eos, salt);
           },
           "request_id"_a, "prompt_ids"_a, "max_new_tokens"_a,
           "stop_token_ids"_a = std::vector<int64_t>{}, "ignore_eos"_a = false, "cache_salt"_a = 0)
      .def("submit",
           [submit](Scheduler& s, int64_t id, std::vector<int64_t> prompt, int32_t max_new,
                    std::vector<int64_t> stop, bool ignore_eos, int64_t salt) {
             std::vector<int32_t> ids = narrow(prompt, "prompt_ids");
             submit(s, id, ids, max_new, std::move(stop), ignore_eos, salt);
           },
           "request_id"_a, "prompt_ids"_a, "max_new_tokens"_a,
           "stop_token_ids"_a = std::vector<int64_t>{}, "ignore_eos"_a = false, "cache_salt"_a = 0)
      .def("abort", &Scheduler::abort, "request_id"_a)
      .def("has_request", &Scheduler::has_request, "request_id"_a)
      .def_prop_ro("num_running", &Scheduler::num_running)
      .def_prop_ro("num_waiting", &Scheduler::num_waiting)
      .def("has_work", &Scheduler::has_work)
      .def("next_plan", &Scheduler::next_plan)
      .def("advance",
           [](Scheduler& s, const Plan& plan, InIds sampled) {
             return to_list(s.advance(plan, span_of(sampled)));
           },
           "plan"_a, "sampled_ids"_a)
      .def("advance",
           [](Scheduler& s, const Plan& plan, std::vector<int64_t> sampled) {
             std::vector<int32_t> ids = narrow(sampled, "sampled_ids");
             return to_list(s.advance(plan, ids));
           },
           "plan"_a, "sampled_ids"_a)
      .def("output_ids", &Scheduler::output_ids, "request_id"_a)
      .def("request_state", &Scheduler::request_state, "request_id"_a)
      .def("request_pages", &Scheduler::request_pages, "request_id"_a)
      .def_prop_ro("config", [](const Scheduler& s) { return s.config(); })  // a copy: read-only
      .def_prop_rw("decode_reserve_tokens",
                   [](const Scheduler& s) { return s.config().decode_reserve_tokens; },
                   &Scheduler::set_decode_reserve_tokens)
      .def("check_invariants", &Scheduler::check_invariants)
      .def("page_refcounts",
           [](const Scheduler& s) {
             const auto& a = s.allocator();
             auto* out = new std::vector<int32_t>(a.num_pages());
             for (int32_t p = 0; p < a.num_pages(); ++p) (*out)[p] = a.refcount(p);
             nb::capsule owner(out, [](void* v) noexcept { delete static_cast<std::vector<int32_t>*>(v); });
             return nb::ndarray<nb::numpy, int32_t>(out->data(), {out->size()}, owner);
           })
      .def("page_states",
           [](const Scheduler& s) {
             const auto& a = s.allocator();
             auto* out = new std::vector<int8_t>(a.num_pages(), 1);
             (*out)[0] = 0;
             for (int32_t p = 1; p < a.num_pages(); ++p)
               (*out)[p] = a.refcount(p) > 0 ? 3 : a.is_cached(p) ? 2 : 1;
             nb::capsule owner(out, [](void* v) noexcept { delete static_cast<std::vector<int8_t>*>(v); });
             return nb::ndarray<nb::numpy, int8_t>(out->data(), {out->size()}, owner);
           })
      .def("stats", [](const Scheduler& s) {
        sched::Stats st = s.stats();
        nb::dict d;
        d["num_pages"] = st.num_pages;
        d["free_pages"] = st.free_pages;
        d["cached_pages"] = st.cached_pages;
        d["used_pages"] = st.used_pages;
        d["cache_entries"] = st.cache_entries;
        d["running"] = st.running;
        d["waiting"] = st.waiting;
        d["prefix_lookups"] = st.prefix_lookups;
        d["prefix_hit_tokens"] = st.prefix_hit_tokens;
        d["prefix_query_tokens"] = st.prefix_query_tokens;
        d["prefix_deferrals"] = st.prefix_deferrals;
        d["evictions"] = st.evictions;
        d["retractions"] = st.retractions;
        d["steps"] = st.steps;
        d["decode_reservations"] = st.decode_reservations;
        d["reservation_misses"] = st.reservation_misses;
        return d;
      });
}
