// python/src/gqa.cpp: multihead.GroupedQueryAttention, multihead.KVCache and
// the position functions (rotary_embedding, sinusoidal_positions), in
// MultiheadAttention's dialect (module.cpp): float32/float64 chosen by the
// input, C-contiguous inputs read in place, outputs not copied, the GIL
// released while the library computes, a double master copy of the
// parameters (float32 values for a float32 module) from which the computing
// module of each dtype is built on first use, errors as ValueError (the
// library's message, naming the tensor) or TypeError (dtypes, types).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "arrays.hpp"
#include "bindings.hpp"
#include "multihead/error.hpp"
#include "multihead/grouped_query_attention.hpp"
#include "multihead/positions.hpp"
#include "options.hpp"
#include "parameters.hpp"

namespace multihead::python {
namespace {

// One dtype's object of a float/double pair (a cache, a context).
template <template <class> class C>
struct PerDtype {
  Precision dtype = Precision::F32;
  std::unique_ptr<C<float>> f32;
  std::unique_ptr<C<double>> f64;
  template <class T>
  C<T>* get() const {
    if constexpr (std::is_same_v<T, double>) return f64.get();
    else return f32.get();
  }
};

// multihead.KVCache: the library's KVCache<T>, T = its dtype. `busy` (read
// and set with the GIL held) refuses a second call using it while one runs
// with the GIL released.
class PyKVCache {
 public:
  PyKVCache(int64_t batch, int64_t kv_heads, int64_t head_dim, int64_t max_len, bool grow, Precision dtype) {
    c_.dtype = dtype;
    if (dtype == Precision::F64) c_.f64 = std::make_unique<KVCache<double>>(batch, kv_heads, head_dim, max_len, grow);
    else c_.f32 = std::make_unique<KVCache<float>>(batch, kv_heads, head_dim, max_len, grow);
  }
  template <class T>
  explicit PyKVCache(KVCache<T>&& c) {
    c_.dtype = std::is_same_v<T, double> ? Precision::F64 : Precision::F32;
    if constexpr (std::is_same_v<T, double>) c_.f64 = std::make_unique<KVCache<double>>(std::move(c));
    else c_.f32 = std::make_unique<KVCache<float>>(std::move(c));
  }
  Precision dtype() const { return c_.dtype; }
  template <class T>
  KVCache<T>& get() {
    return *c_.template get<T>();
  }
  template <class Fn>
  auto visit(Fn&& fn) const {
    return c_.dtype == Precision::F64 ? fn(*c_.f64) : fn(*c_.f32);
  }
  template <class Fn>
  auto visit(Fn&& fn) {
    return c_.dtype == Precision::F64 ? fn(*c_.f64) : fn(*c_.f32);
  }
  // While a call uses it (GIL released).
  class Use {
   public:
    explicit Use(PyKVCache& c) : c_(c) {
      if (c_.busy_) throw Error(Error::Kind::Value, "cache: expected a KVCache no other call is using, got one in use");
      c_.busy_ = true;
    }
    ~Use() { c_.busy_ = false; }
    Use(const Use&) = delete;
    Use& operator=(const Use&) = delete;

   private:
    PyKVCache& c_;
  };

  // key, value (B, Hkv, L, D): appended at positions length() … length() + L − 1.
  void append(const py::object& key, const py::object& value) {
    if (c_.dtype == Precision::F64) append_as<double>(key, value);
    else append_as<float>(key, value);
  }
  // (B, Hkv, length, D) copies of what it holds.
  py::array keys() const { return held(true); }
  py::array values() const { return held(false); }

 private:
  template <class T>
  void append_as(const py::object& key, const py::object& value) {
    HeldTensor<T> k = float_tensor<T>(key, "key"), v = float_tensor<T>(value, "value");
    KVCache<T>& c = get<T>();
    for (const auto* t : {&k, &v}) {
      const char* name = t == &k ? "key" : "value";
      const Shape& s = t->tensor.shape();
      if (s.size() != 4 || s[0] != c.batch() || s[1] != c.kv_heads() || s[3] != c.head_dim())
        throw Error(Error::Kind::Shape, std::string(name) + ": expected (batch " + std::to_string(c.batch()) +
                                            ", kv_heads " + std::to_string(c.kv_heads()) + ", L, head_dim " +
                                            std::to_string(c.head_dim()) + "), got " + shape_to_string(s));
    }
    if (k.tensor.shape() != v.tensor.shape())
      throw Error(Error::Kind::Shape, "value: expected the key's shape " + shape_to_string(k.tensor.shape()) +
                                          ", got " + shape_to_string(v.tensor.shape()));
    const int64_t L = k.tensor.shape()[2], D = c.head_dim();
    Use use(*this);
    py::gil_scoped_release nogil;
    c.reserve_more(L);  // throws naming max_len before anything is written
    const int64_t P = c.length();
    for (int64_t b = 0; b < c.batch(); ++b)
      for (int64_t g = 0; g < c.kv_heads(); ++g)
        for (int64_t i = 0; i < L; ++i) {
          const int64_t src = ((b * c.kv_heads() + g) * L + i) * D;
          std::copy_n(k.tensor.data() + src, D, c.k_row(b, g, P + i));
          std::copy_n(v.tensor.data() + src, D, c.v_row(b, g, P + i));
        }
    c.commit(L);
  }
  py::array held(bool keys) const {
    return visit([&](const auto& c) -> py::array {
      using T = std::remove_const_t<std::remove_pointer_t<decltype(c.k_data())>>;
      Tensor<T> out(Shape{c.batch(), c.kv_heads(), c.length(), c.head_dim()});
      const T* data = keys ? c.k_data() : c.v_data();
      const int64_t D = c.head_dim();
      for (int64_t bg = 0; bg < c.batch() * c.kv_heads(); ++bg)
        std::copy_n(data + bg * c.capacity() * D, c.length() * D, out.data() + bg * c.length() * D);
      return to_numpy(std::move(out));
    });
  }

  PerDtype<KVCache> c_;
  bool busy_ = false;
};

// What GroupedQueryAttention.forward_with_context returns: the library's
// context in the computation's dtype.
struct PyGqaContext {
  PerDtype<GroupedQueryForwardContext> c;
  template <class T>
  GroupedQueryForwardContext<T>& get() {
    auto& slot = [&]() -> auto& {
      if constexpr (std::is_same_v<T, double>) return c.f64;
      else return c.f32;
    }();
    if (!slot) slot = std::make_unique<GroupedQueryForwardContext<T>>();
    return *slot;
  }
  bool empty() const {
    return c.dtype == Precision::F64 ? (!c.f64 || c.f64->empty()) : (!c.f32 || c.f32->empty());
  }
  std::size_t nbytes() const { return (c.f32 ? c.f32->bytes() : 0) + (c.f64 ? c.f64->bytes() : 0); }
  void clear() {
    c.f32.reset();
    c.f64.reset();
  }
};

std::optional<RopeOptions> rope_option(const std::optional<std::string>& rope, double theta) {
  if (!rope) return std::nullopt;
  RopeOptions r;
  r.convention = parse_rope_convention(*rope, "rope");
  r.theta = theta;
  return r;
}

struct GqaTraits {
  using Config = GroupedQueryAttentionConfig;
  template <class T>
  using Params = GroupedQueryAttentionParameters<T>;
  template <class T>
  using Module = GroupedQueryAttention<T>;
  static constexpr const char* name = "GroupedQueryAttention";
  static void validate(const Config& c, const Params<double>& p) {
    c.validate();
    GroupedQueryAttention<double>(c, p);  // checks every parameter's presence and shape
  }
};

// The parameters' glue (state_dict, load_state_dict, update_parameters,
// share_parameters, the computing modules) is ModuleParameters', as
// MultiheadAttention's (parameters.hpp).
class PyGroupedQueryAttention : public ModuleParameters<GqaTraits> {
 public:
  PyGroupedQueryAttention(const GroupedQueryAttentionConfig& config, GroupedQueryAttentionParameters<double> params,
                          double dropout, Precision dtype)
      : ModuleParameters(config, std::move(params), dtype), dropout_(dropout) {
    if (!(dropout_ >= 0.0 && dropout_ < 1.0))
      throw Error(Error::Kind::Value, "dropout: expected a probability in [0, 1), got " + std::to_string(dropout_));
  }

  static PyGroupedQueryAttention create(int64_t embed_dim, int64_t num_heads, std::optional<int64_t> num_kv_heads,
                                        std::optional<int64_t> head_dim, bool bias, double dropout, bool causal,
                                        const std::optional<std::string>& rope, double rope_theta, uint64_t seed,
                                        const py::object& dtype) {
    GroupedQueryAttentionConfig c;
    c.embed_dim = embed_dim;
    c.num_heads = num_heads;
    // None means num_heads / embed_dim // num_heads; 0 is the library's spelling.
    if (num_kv_heads && *num_kv_heads <= 0)
      throw Error(Error::Kind::Value, "num_kv_heads: expected a positive count or None, got " + std::to_string(*num_kv_heads));
    if (head_dim && *head_dim <= 0)
      throw Error(Error::Kind::Value, "head_dim: expected a positive size or None, got " + std::to_string(*head_dim));
    if (num_kv_heads && num_heads > 0 && num_heads % *num_kv_heads != 0)
      throw Error(Error::Kind::Value, "num_kv_heads: expected None (= num_heads) or a divisor of num_heads " +
                                          std::to_string(num_heads) + ", got " + std::to_string(*num_kv_heads));
    if (!(rope_theta > 0.0 && std::isfinite(rope_theta)))
      throw Error(Error::Kind::Value, "rope_theta: expected a finite number > 0, got " +
                                          py::repr(py::float_(rope_theta)).cast<std::string>());
    c.num_kv_heads = num_kv_heads.value_or(0);
    c.head_dim = head_dim.value_or(0);
    c.bias = bias;
    c.causal = causal;
    c.rope = rope_option(rope, rope_theta);
    c.validate();
    const Precision p = parse_dtype(dtype);
    GroupedQueryAttentionParameters<double> params;
    {
      py::gil_scoped_release nogil;
      params = GroupedQueryAttention<double>(c, seed).parameters();
    }
    return PyGroupedQueryAttention(c, std::move(params), dropout, p);
  }

  double dropout() const { return dropout_; }
  bool training = false;

  py::object forward(const py::object& x, const GqaCall& o, const py::object& cache) {
    if (cache.is_none()) {
      const py::array a = as_numpy(x, "x");
      if (precision_of(a, "x") == Precision::F64) return run<double>(a, o, nullptr);
      return run<float>(a, o, nullptr);
    }
    if (!py::isinstance<PyKVCache>(cache))
      throw py::type_error("cache: expected a multihead.KVCache or None, got " + type_name(cache));
    PyKVCache& c = cache.cast<PyKVCache&>();
    // With a cache the computation runs in the cache's dtype (x converted).
    if (c.dtype() == Precision::F64) return run<double>(x, o, &c);
    return run<float>(x, o, &c);
  }

  py::tuple forward_with_context(const py::object& x, const GqaCall& o, const py::object& context) {
    py::object ctx = context.is_none() ? py::cast(PyGqaContext()) : context;
    if (!py::isinstance<PyGqaContext>(ctx))
      throw py::type_error("context: expected a multihead.GroupedQueryContext or None, got " + type_name(ctx));
    PyGqaContext& c = ctx.cast<PyGqaContext&>();
    const py::array a = as_numpy(x, "x");
    py::array out = precision_of(a, "x") == Precision::F64 ? run_with_context<double>(a, o, c)
                                                          : run_with_context<float>(a, o, c);
    return py::make_tuple(out, ctx);
  }

  py::dict backward(PyGqaContext& context, const py::object& d_output) {
    if (context.empty())
      throw Error(Error::Kind::Value,
                  "context: expected a GroupedQueryContext filled by forward_with_context(), got an empty one");
    return context.c.dtype == Precision::F64 ? run_backward<double>(context, d_output)
                                             : run_backward<float>(context, d_output);
  }

  PyKVCache make_cache(int64_t batch, int64_t max_len, bool grow) {
    if (dtype_ == Precision::F64) return PyKVCache(module<double>()->make_cache(batch, max_len, grow));
    return PyKVCache(module<float>()->make_cache(batch, max_len, grow));
  }

 private:
  AttentionOptions options(const GqaCall& o) const { return gqa_options(o, config_.num_heads, training, dropout_); }

  template <class T>
  py::array run(const py::object& x, const GqaCall& o, PyKVCache* cache) {
    HeldTensor<T> in = float_tensor<T>(x, "x");
    const AttentionOptions ao = options(o);
    const std::shared_ptr<const GroupedQueryAttention<T>> m = module<T>();
    Tensor<T> out;
    {
      std::optional<PyKVCache::Use> use;
      if (cache) use.emplace(*cache);
      py::gil_scoped_release nogil;
      out = m->forward(in.tensor, ao, cache ? &cache->get<T>() : nullptr);
    }
    auto& a = last_call_addresses();
    a.clear();
    a["x"] = address(in.tensor);
    a["output"] = address(out);
    return to_numpy(std::move(out));
  }

  template <class T>
  py::array run_with_context(const py::array& x, const GqaCall& o, PyGqaContext& c) {
    HeldTensor<T> in = float_tensor<T>(x, "x");
    const AttentionOptions ao = options(o);
    const std::shared_ptr<const GroupedQueryAttention<T>> m = module<T>();
    GroupedQueryForwardContext<T>& ctx = c.get<T>();
    c.c.dtype = std::is_same_v<T, double> ? Precision::F64 : Precision::F32;
    Tensor<T> out;
    {
      py::gil_scoped_release nogil;
      out = m->forward(in.tensor, ao, ctx);
    }
    return to_numpy(std::move(out));
  }

  template <class T>
  py::dict run_backward(PyGqaContext& c, const py::object& d_output) {
    HeldTensor<T> d = float_tensor<T>(d_output, "d_output");
    const std::shared_ptr<const GroupedQueryAttention<T>> m = module<T>();
    GroupedQueryAttentionGradients<T> g = backward_without_gil([&] { return m->backward(c.get<T>(), d.tensor); });
    py::dict out;
    out["x"] = to_numpy(std::move(g.x));
    for (const std::string& n : expected_names(config_)) out[py::str(n)] = to_numpy(std::move(g.parameters.at(n)));
    return out;
  }

  double dropout_;
};

template <class T>
py::array rope_call(const py::object& x, const std::string& convention, double theta, int64_t position_offset,
                    bool backward) {
  HeldTensor<T> in = float_tensor<T>(x, backward ? "d_y" : "x");
  RopeOptions r;
  r.convention = parse_rope_convention(convention, "convention");
  r.theta = theta;
  r.position_offset = position_offset;
  const Shape& s = in.tensor.shape();
  if (s.size() < 2)
    throw Error(Error::Kind::Shape, std::string(backward ? "d_y" : "x") + ": expected (..., L, D), got " + shape_to_string(s));
  validate_rope(r, s.back(), "", std::string(backward ? "d_y" : "x") + "'s last dimension");
  Tensor<T> out;
  {
    py::gil_scoped_release nogil;
    out = backward ? rotary_embedding_backward(in.tensor, r) : rotary_embedding(in.tensor, r);
  }
  return to_numpy(std::move(out));
}

py::array rope_dispatch(const py::object& x, const std::string& convention, double theta, int64_t position_offset,
                        bool backward) {
  const py::array a = as_numpy(x, backward ? "d_y" : "x");
  if (precision_of(a, backward ? "d_y" : "x") == Precision::F64)
    return rope_call<double>(a, convention, theta, position_offset, backward);
  return rope_call<float>(a, convention, theta, position_offset, backward);
}

const char* const kGqaClassDoc = R"doc(GroupedQueryAttention(embed_dim, num_heads, num_kv_heads=None, head_dim=None, bias=False, dropout=0.0, causal=True, rope=None, rope_theta=10000.0, *, seed=0, dtype=None)

Grouped-query attention (Ainslie et al. 2023), as Llama and Mistral use it:
num_heads query heads share num_kv_heads K/V heads (query head h uses K/V
head h // (num_heads // num_kv_heads)); num_kv_heads=1 is multi-query
attention. Self-attention on x (B, L, E), batch first. Parameters under
Hugging Face LlamaAttention's names: q_proj.weight (H*D, E), k_proj.weight
and v_proj.weight (Hkv*D, E), o_proj.weight (E, H*D), and with bias=True
the four biases.

Args:
    embed_dim: E.
    num_heads: H, the query heads.
    num_kv_heads: Hkv, dividing H. Default: None (= num_heads).
    head_dim: D. Default: None (= embed_dim // num_heads).
    bias: biases on the four projections. Default: False (Llama).
    dropout: dropout on the attention weights, in training mode only.
    causal: causal masking, bottom-right over a KV cache. Default: True.
    rope: None, 'half-split' (Hugging Face Llama) or 'interleaved' (the
        RoFormer paper, Meta's Llama): rotary embedding of q and k.
    rope_theta: RoPE's base. Default: 10000.0.

Keyword-only:
    seed: seed of the initialisation (nn.Linear's default distributions).
    dtype: numpy.float32 (default) or numpy.float64, the parameters' dtype.
        forward() computes in x's dtype (with a cache, in the cache's).

As MultiheadAttention: forward(), forward_with_context() and backward(),
update_parameters(), state_dict() / load_state_dict(), train() / eval()
(a new module is in eval mode); decoding with make_cache() and
forward(x, cache=cache).
)doc";

const char* const kGqaForwardIntro = R"doc(
x (B, L, E) -> (B, L, E). Without a cache: self-attention over positions
0 ... L - 1. With cache=KVCache (make_cache()): x's K/V are appended to it
(positions P ... P + L - 1, P = cache.length) and the L queries attend to
all P + L cached keys, which equals rows P ... P + L - 1 of the forward over
the whole prefix. The GIL is released while computing; a cache is used by
one call at a time (ValueError naming cache otherwise).

Keyword-only:
)doc";

const char* const kGqaContextIntro = R"doc(
The training forward (no cache): forward()'s output (bit-identical), and a
GroupedQueryContext holding what backward() needs (no L x S weights: each
row's log-sum-exp). Dropout applies in training mode (train()), drawn from
dropout_seed. Returns (output, context).

Keyword-only:
)doc";

const char* const kGqaBackwardDoc = R"doc(backward(context, d_output) -> dict

Gradients for the forward that filled `context`, given d_output =
dl/d(output), (B, L, E): "x" (B, L, E), and every state_dict name
("q_proj.weight", ...). K/V heads get the sum over their group's query
heads; RoPE its transpose. ValueError if the context is empty (or
cleared), comes from another module, or predates update_parameters() /
load_state_dict(), or d_output has the wrong shape.
)doc";

#define MULTIHEAD_GQA_ROWS(M) MULTIHEAD_KERNEL_KEYWORDS(M) MULTIHEAD_SCORE_KEYWORDS(M) MULTIHEAD_GQA_KEYWORDS(M)
#define MULTIHEAD_GQA_CACHE(X) \
  X(py::object, cache, py::none(), , "A KVCache (make_cache()) to append to and attend over, or None.")
#define MULTIHEAD_GQA_CONTEXT(X) \
  X(py::object, context, py::none(), , "A GroupedQueryContext to refill (buffers reused), or None for a new one.")

struct GqaForwardCall : GqaCall {
  MULTIHEAD_GQA_CACHE(MULTIHEAD_OPTION_MEMBER)
};
struct GqaContextCall : GqaCall {
  MULTIHEAD_GQA_CONTEXT(MULTIHEAD_OPTION_MEMBER)
};

template <class Call, class Doc>
std::string gqa_doc(const std::string& name, const char* intro, Doc extra) {
  const Call d;
  DocBuilder b(name);
  b.required("x");
  b.keyword_only();
  MULTIHEAD_GQA_ROWS(MULTIHEAD_PY_DOC)
  extra(b, d);
  return b.line() + "\n" + intro + b.take_entries();
}

}  // namespace

void bind_grouped_query_attention(py::module_& m) {
  using namespace pybind11::literals;

  py::class_<PyKVCache>(m, "KVCache",
                        "KVCache(batch, kv_heads, head_dim, max_len, grow=False, *, dtype=None)\n\n"
                        "The K/V of every token seen so far, for `batch` sequences decoded together:\n"
                        "K and V (batch, kv_heads, capacity, head_dim), positions 0 ... length - 1 filled\n"
                        "(K after RoPE, as Llama's cache). Preallocated to max_len; when a step needs more,\n"
                        "with grow=True it grows to max(2 x capacity, needed), else ValueError naming\n"
                        "max_len. GroupedQueryAttention.make_cache() makes one of the module's shape;\n"
                        "forward(x, cache=cache) appends x's K/V and attends over all of it.")
      .def(py::init([](int64_t batch, int64_t kv_heads, int64_t head_dim, int64_t max_len, bool grow,
                       const py::object& dtype) {
             return PyKVCache(batch, kv_heads, head_dim, max_len, grow, parse_dtype(dtype));
           }),
           "batch"_a, "kv_heads"_a, "head_dim"_a, "max_len"_a, "grow"_a = false, py::kw_only(), "dtype"_a = py::none(),
           "__init__(self, batch, kv_heads, head_dim, max_len, grow=False, *, dtype=None)\n\nSee help(KVCache).")
      .def("append", &PyKVCache::append, "key"_a, "value"_a,
           "append(self, key, value) -> None\n\n"
           "Appends key and value, each (batch, kv_heads, L, head_dim), at positions length ...\n"
           "length + L - 1 (K as stored: after any RoPE). ValueError naming key, value or max_len.")
      .def("keys", &PyKVCache::keys, "keys(self) -> numpy.ndarray\n\nA copy of the cached K, (batch, kv_heads, length, head_dim).")
      .def("values", &PyKVCache::values,
           "values(self) -> numpy.ndarray\n\nA copy of the cached V, (batch, kv_heads, length, head_dim).")
      .def("clear", [](PyKVCache& c) { c.visit([](auto& k) { k.clear(); }); },
           "clear(self) -> None\n\nForgets every token (keeps the memory).")
      .def_property_readonly("batch", [](const PyKVCache& c) { return c.visit([](const auto& k) { return k.batch(); }); })
      .def_property_readonly("kv_heads", [](const PyKVCache& c) { return c.visit([](const auto& k) { return k.kv_heads(); }); })
      .def_property_readonly("head_dim", [](const PyKVCache& c) { return c.visit([](const auto& k) { return k.head_dim(); }); })
      .def_property_readonly("length", [](const PyKVCache& c) { return c.visit([](const auto& k) { return k.length(); }); },
                             "Tokens held.")
      .def_property_readonly("capacity", [](const PyKVCache& c) { return c.visit([](const auto& k) { return k.capacity(); }); },
                             "Positions allocated.")
      .def_property_readonly("grows", [](const PyKVCache& c) { return c.visit([](const auto& k) { return k.grows(); }); })
      .def_property_readonly("nbytes", [](const PyKVCache& c) { return c.visit([](const auto& k) { return k.bytes(); }); },
                             "Bytes it holds: 2 * batch * kv_heads * capacity * head_dim * itemsize.")
      .def_property_readonly("dtype", [](const PyKVCache& c) { return py::dtype(dtype_str(c.dtype())); });

  py::class_<PyGqaContext>(m, "GroupedQueryContext",
                           "What GroupedQueryAttention.forward_with_context keeps for backward(): a copy of x,\n"
                           "the projected q, k (after RoPE) and v, the merged heads and each attention row's\n"
                           "log-sum-exp (never the L x S weights). Pass it back as context= to reuse it.")
      .def_property_readonly("nbytes", &PyGqaContext::nbytes, "Bytes of the buffers it holds.")
      .def_property_readonly("empty", &PyGqaContext::empty, "True until a forward has filled it (and after clear()).")
      .def_property_readonly("dtype", [](const PyGqaContext& c) { return py::dtype(dtype_str(c.c.dtype)); })
      .def("clear", &PyGqaContext::clear, "clear(self) -> None\n\nFrees its buffers; backward() then refuses it.");

  py::class_<PyGroupedQueryAttention> gqa(m, "GroupedQueryAttention", kGqaClassDoc);
  gqa.def(py::init(&PyGroupedQueryAttention::create), "embed_dim"_a, "num_heads"_a, "num_kv_heads"_a = py::none(),
          "head_dim"_a = py::none(), "bias"_a = false, "dropout"_a = 0.0, "causal"_a = true, "rope"_a = py::none(),
          "rope_theta"_a = 10000.0, py::kw_only(), "seed"_a = 0, "dtype"_a = py::none(),
          "__init__(self, embed_dim, num_heads, num_kv_heads=None, head_dim=None, bias=False, dropout=0.0, "
          "causal=True, rope=None, rope_theta=10000.0, *, seed=0, dtype=None)\n\nSee help(GroupedQueryAttention).")
      .def("backward", &PyGroupedQueryAttention::backward, kGqaBackwardDoc, "context"_a, "d_output"_a)
      .def("update_parameters", &PyGroupedQueryAttention::update_parameters, "update"_a,
           "update_parameters(self, update) -> None\n\n"
           "As MultiheadAttention.update_parameters: update(name, array) for every parameter, in\n"
           "state_dict order (a copy in the module's dtype; change it in place and return None, or\n"
           "return the new values); then every shape is checked (ValueError naming the parameter;\n"
           "on error the module is unchanged). Earlier contexts are refused by backward().")
      .def("share_parameters", &PyGroupedQueryAttention::share_parameters, "arrays"_a,
           "share_parameters(self, arrays) -> None\n\n"
           "As MultiheadAttention.share_parameters: from now on the module reads its parameters from the\n"
           "memory of `arrays` (every parameter under state_dict's names, C-contiguous, the module's dtype\n"
           "and shapes), with no copy; in-place changes are seen by the next call. update_parameters()\n"
           "and load_state_dict() end the sharing.")
      .def_property_readonly("shares_parameters", &PyGroupedQueryAttention::shares_parameters,
           "True after share_parameters(), until update_parameters() or load_state_dict().")
      .def("state_dict", &PyGroupedQueryAttention::state_dict,
           "state_dict(self) -> dict\n\nA new dict of the parameters under Hugging Face's names (copies, in the module's dtype).")
      .def("load_state_dict", &PyGroupedQueryAttention::load_state_dict, "state_dict"_a, "strict"_a = true,
           "load_state_dict(self, state_dict, strict=True) -> (missing_keys, unexpected_keys)\n\n"
           "Copies parameters from a mapping of names to array-likes, as MultiheadAttention's.")
      .def("make_cache", &PyGroupedQueryAttention::make_cache, "batch"_a, "max_len"_a, "grow"_a = false,
           "make_cache(self, batch, max_len, grow=False) -> KVCache\n\n"
           "A KVCache of this module's K/V shape and dtype for `batch` sequences of up to max_len tokens.")
      .def("train", [](py::object self, bool mode) { self.cast<PyGroupedQueryAttention&>().training = mode; return self; },
           "mode"_a = true, "train(self, mode=True) -> self\n\nTraining mode (dropout applies) or eval mode. Returns self.")
      .def("eval", [](py::object self) { self.cast<PyGroupedQueryAttention&>().training = false; return self; },
           "eval(self) -> self\n\nEval mode (no dropout). Returns self.")
      .def_readwrite("training", &PyGroupedQueryAttention::training)
      .def_property_readonly("embed_dim", [](const PyGroupedQueryAttention& s) { return s.config().embed_dim; })
      .def_property_readonly("num_heads", [](const PyGroupedQueryAttention& s) { return s.config().num_heads; })
      .def_property_readonly("num_kv_heads", [](const PyGroupedQueryAttention& s) { return s.config().resolved_kv_heads(); })
      .def_property_readonly("head_dim", [](const PyGroupedQueryAttention& s) { return s.config().resolved_head_dim(); })
      .def_property_readonly("bias", [](const PyGroupedQueryAttention& s) { return s.config().bias; })
      .def_property_readonly("dropout", &PyGroupedQueryAttention::dropout)
      .def_property_readonly("causal", [](const PyGroupedQueryAttention& s) { return s.config().causal; })
      .def_property_readonly("rope", [](const PyGroupedQueryAttention& s) -> py::object {
        if (!s.config().rope) return py::none();
        return py::str(to_string(s.config().rope->convention));
      })
      .def_property_readonly("rope_theta", [](const PyGroupedQueryAttention& s) {
        return s.config().rope ? s.config().rope->theta : 10000.0;
      })
      .def_property_readonly("dtype", [](const PyGroupedQueryAttention& s) { return py::dtype(dtype_str(s.dtype())); })
      .def("__repr__", [](const PyGroupedQueryAttention& s) {
        const auto& c = s.config();
        return "GroupedQueryAttention(embed_dim=" + std::to_string(c.embed_dim) + ", num_heads=" +
               std::to_string(c.num_heads) + ", num_kv_heads=" + std::to_string(c.resolved_kv_heads()) +
               ", head_dim=" + std::to_string(c.resolved_head_dim()) + ", bias=" + (c.bias ? "True" : "False") +
               ", causal=" + (c.causal ? "True" : "False") +
               ", rope=" + (c.rope ? "'" + to_string(c.rope->convention) + "'" : std::string("None")) +
               ", dtype=" + dtype_str(s.dtype()) + ")";
      });

  {
    const GqaForwardCall d;
    auto forward = [](PyGroupedQueryAttention& self, const py::object& x MULTIHEAD_GQA_ROWS(MULTIHEAD_PY_PARAM)
                          MULTIHEAD_GQA_CACHE(MULTIHEAD_PY_PARAM)) {
      GqaForwardCall c;
      MULTIHEAD_GQA_ROWS(MULTIHEAD_PY_STORE)
      MULTIHEAD_GQA_CACHE(MULTIHEAD_PY_STORE)
      return self.forward(x, c, c.cache);
    };
    for (const char* name : {"forward", "__call__"}) {
      const std::string doc = gqa_doc<GqaForwardCall>(name, kGqaForwardIntro, [](DocBuilder& b, const GqaForwardCall& d) {
        MULTIHEAD_GQA_CACHE(MULTIHEAD_PY_DOC)
      });
      gqa.def(name, forward, doc.c_str(), "x"_a, py::kw_only() MULTIHEAD_GQA_ROWS(MULTIHEAD_PY_ARG)
                                                   MULTIHEAD_GQA_CACHE(MULTIHEAD_PY_ARG));
    }
  }
  {
    const GqaContextCall d;
    const std::string doc = gqa_doc<GqaContextCall>("forward_with_context", kGqaContextIntro,
                                                    [](DocBuilder& b, const GqaContextCall& d) {
                                                      MULTIHEAD_GQA_CONTEXT(MULTIHEAD_PY_DOC)
                                                    });
    gqa.def(
        "forward_with_context",
        [](PyGroupedQueryAttention& self, const py::object& x MULTIHEAD_GQA_ROWS(MULTIHEAD_PY_PARAM)
                                              MULTIHEAD_GQA_CONTEXT(MULTIHEAD_PY_PARAM)) {
          GqaContextCall c;
          MULTIHEAD_GQA_ROWS(MULTIHEAD_PY_STORE)
          MULTIHEAD_GQA_CONTEXT(MULTIHEAD_PY_STORE)
          return self.forward_with_context(x, c, c.context);
        },
        doc.c_str(), "x"_a, py::kw_only() MULTIHEAD_GQA_ROWS(MULTIHEAD_PY_ARG) MULTIHEAD_GQA_CONTEXT(MULTIHEAD_PY_ARG));
  }

  m.def(
      "rotary_embedding",
      [](const py::object& x, const std::string& convention, double theta, int64_t position_offset) {
        return rope_dispatch(x, convention, theta, position_offset, false);
      },
      "x"_a, "convention"_a = "half-split", "theta"_a = 10000.0, "position_offset"_a = 0,
      "rotary_embedding(x, convention='half-split', theta=10000.0, position_offset=0) -> numpy.ndarray\n\n"
      "RoPE (Su et al. 2021) of x (..., L, D): row l is at position position_offset + l and each\n"
      "pair i of its D elements is rotated by (position)*theta^(-2i/D). convention: 'half-split'\n"
      "(pairs (i, i + D/2): Hugging Face Llama, GPT-NeoX) or 'interleaved' (pairs (2i, 2i+1): the\n"
      "paper, GPT-J, Meta's Llama). Angles in float64, rounded once; computes in x's dtype.");
  m.def(
      "rotary_embedding_backward",
      [](const py::object& d_y, const std::string& convention, double theta, int64_t position_offset) {
        return rope_dispatch(d_y, convention, theta, position_offset, true);
      },
      "d_y"_a, "convention"_a = "half-split", "theta"_a = 10000.0, "position_offset"_a = 0,
      "rotary_embedding_backward(d_y, convention='half-split', theta=10000.0, position_offset=0) -> numpy.ndarray\n\n"
      "dl/dx of rotary_embedding given d_y = dl/dy: the rotation by the negated angles.");
  m.def(
      "sinusoidal_positions",
      [](int64_t length, int64_t width, int64_t offset, const py::object& dtype) -> py::array {
        const Precision p = parse_dtype(dtype);
        if (p == Precision::F64) {
          Tensor<double> t;
          {
            py::gil_scoped_release nogil;
            t = sinusoidal_positions<double>(length, width, offset);
          }
          return to_numpy(std::move(t));
        }
        Tensor<float> t;
        {
          py::gil_scoped_release nogil;
          t = sinusoidal_positions<float>(length, width, offset);
        }
        return to_numpy(std::move(t));
      },
      "length"_a, "width"_a, "offset"_a = 0, py::kw_only(), "dtype"_a = py::none(),
      "sinusoidal_positions(length, width, offset=0, *, dtype=None) -> numpy.ndarray\n\n"
      "Vaswani et al.'s positional encoding, (length, width): PE[p, 2i] = sin((p + offset) /\n"
      "10000^(2i/width)), PE[p, 2i+1] = cos(...). Computed in float64, rounded once to dtype\n"
      "(float32 default, or float64).");
}

}  // namespace multihead::python
