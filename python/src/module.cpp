// python/src/module.cpp: the `multihead` Python module (pybind11).
//
//   multihead.MultiheadAttention        torch.nn.MultiheadAttention's
//                                       arguments, forward, state_dict
//   multihead.scaled_dot_product_attention   torch.nn.functional's (2.x)
//   multihead.load_weights / save_weights    safetensors, PyTorch key names
//   multihead.explain / inspect              `multihead explain` / `inspect`
// and, in their own files, GroupedQueryAttention, KVCache and the position
// functions (gqa.cpp), Trainer and TrainedModel (train.cpp); what they share
// is in bindings.hpp (dtype=, docstrings from the rows) and parameters.hpp
// (state_dict, load_state_dict, update_parameters of a parameter table).
//
// Arrays come in without copies when they are C-contiguous float32/float64
// (arrays.hpp). The attention calls' keyword arguments are the rows of
// options.hpp's table: their parameters, py::arg lists, docstring signatures
// and conversion into the library's options structs are generated from it. The GIL is released while the library
// computes; every referenced array stays alive meanwhile, held by this frame.
// multihead::Error becomes ValueError with the library's message; a dtype
// the library cannot take is a TypeError.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "arrays.hpp"
#include "bindings.hpp"
#include "multihead/error.hpp"
#include "multihead/explain.hpp"
#include "multihead/io.hpp"
#include "multihead/multihead_attention.hpp"
#include "multihead/narrow_multihead_attention.hpp"
#include "multihead/runtime.hpp"
#include "multihead/trained_model.hpp"
#include "multihead/version.hpp"
#include "multihead/weights.hpp"
#include "options.hpp"
#include "parameters.hpp"

namespace multihead::python {
namespace {

// What forward_with_context returns as its third element: the library's
// ForwardContext in the computation's dtype (which keeps its own copy of
// the masks: the caller's arrays are not held).
class PyForwardContext {
 public:
  Precision dtype = Precision::F32;
  std::unique_ptr<ForwardContext<float>> f32;
  std::unique_ptr<ForwardContext<double>> f64;
  std::unique_ptr<NarrowForwardContext<bfloat16>> bf16;  // a 16-bit module's
  std::unique_ptr<NarrowForwardContext<float16>> f16;

  template <class E>
  NarrowForwardContext<E>& narrow() {
    auto& slot = [&]() -> auto& {
      if constexpr (std::is_same_v<E, bfloat16>) return bf16;
      else return f16;
    }();
    if (!slot) slot = std::make_unique<NarrowForwardContext<E>>();
    return *slot;
  }

  template <class T>
  ForwardContext<T>& get() {
    if constexpr (std::is_same_v<T, double>) {
      if (!f64) f64 = std::make_unique<ForwardContext<double>>();
      return *f64;
    } else {
      if (!f32) f32 = std::make_unique<ForwardContext<float>>();
      return *f32;
    }
  }
  bool empty() const {
    switch (dtype) {
      case Precision::F64: return !f64 || f64->empty();
      case Precision::BF16: return !bf16 || bf16->empty();
      case Precision::F16: return !f16 || f16->empty();
      default: return !f32 || f32->empty();
    }
  }
  std::size_t nbytes() const {
    return (f32 ? f32->bytes() : 0) + (f64 ? f64->bytes() : 0) + (bf16 ? bf16->bytes() : 0) +
           (f16 ? f16->bytes() : 0);
  }
};

struct MhaTraits {
  using Config = MultiheadAttentionConfig;
  template <class T>
  using Params = MultiheadAttentionParameters<T>;
  template <class T>
  using Module = BasicMultiheadAttention<T>;
  static constexpr const char* name = "MultiheadAttention";
  static void validate(const Config& c, const Params<double>& p) {
    c.validate();
    validate_parameters(c, p);  // names the parameter, expected and actual shape
  }
};

// multihead.MultiheadAttention. A float32 module computes in float32, or in
// float64 for a float64 query; a float64 module in float64. A 16-bit module
// (dtype='bfloat16' or 'float16') computes in its type
// (NarrowMultiheadAttention<E>: inputs, weights and output stored in E),
// whatever kind of array holds the query (arrays.hpp's narrow_tensor).
class PyMultiheadAttention : public ModuleParameters<MhaTraits> {
 public:
  PyMultiheadAttention(const MultiheadAttentionConfig& config, MultiheadAttentionParameters<double> params,
                       Precision dtype)
      : ModuleParameters(config, std::move(params), dtype) {}

  static PyMultiheadAttention create(int64_t embed_dim, int64_t num_heads, double dropout, bool bias,
                                     bool add_bias_kv, bool add_zero_attn, std::optional<int64_t> kdim,
                                     std::optional<int64_t> vdim, bool batch_first, uint64_t seed,
                                     const py::object& dtype) {
    MultiheadAttentionConfig c;
    c.embed_dim = embed_dim;
    c.num_heads = num_heads;
    c.dropout = dropout;
    c.bias = bias;
    c.add_bias_kv = add_bias_kv;
    c.add_zero_attn = add_zero_attn;
    // None means embed_dim, as in PyTorch; 0 is the library's spelling of it.
    if (kdim && *kdim <= 0) throw Error(Error::Kind::Value, "kdim: expected a positive size or None, got " + std::to_string(*kdim));
    if (vdim && *vdim <= 0) throw Error(Error::Kind::Value, "vdim: expected a positive size or None, got " + std::to_string(*vdim));
    c.kdim = kdim.value_or(0);
    c.vdim = vdim.value_or(0);
    c.batch_first = batch_first;
    c.validate();
    const Precision p = parse_dtype(dtype, /*narrow=*/true);
    MultiheadAttentionParameters<double> params;
    {
      py::gil_scoped_release nogil;  // a large module takes a while to initialise
      params = BasicMultiheadAttention<double>(c, seed).parameters();
    }
    // A 16-bit module: torch's initial values rounded, as .to(bfloat16) does.
    return PyMultiheadAttention(c, std::move(params), p);
  }

  bool training = false;

  // The arguments after (query, key, value) are the table's rows
  // (options.hpp); `form` is forward's own.
  py::tuple forward(const py::object& query, const py::object& key, const py::object& value, const ModuleCall& o,
                    const std::string& form) {
    if (form != "fused" && form != "textbook")
      throw Error(Error::Kind::Value, "form: expected 'fused' or 'textbook', got " + quote_input(form));
    if (dtype_ == Precision::BF16) return run_narrow<bfloat16>(query, key, value, o, form);
    if (dtype_ == Precision::F16) return run_narrow<float16>(query, key, value, o, form);
    const py::array q = as_numpy(query, "query");
    const py::object k = key.is(query) ? q : key;
    const py::object v = value.is(query) ? q : value;
    if (precision_of(q, "query") == Precision::F64) return run<double>(q, k, v, o, form == "textbook");
    return run<float>(q, k, v, o, form == "textbook");
  }

  // The training forward: (output, weights, context); `context` (a
  // ForwardContext from an earlier call, or None) is refilled and returned,
  // reusing its buffers.
  py::tuple forward_with_context(const py::object& query, const py::object& key, const py::object& value,
                                 const ModuleCall& o, const py::object& context) {
    py::object ctx = context.is_none() ? py::cast(PyForwardContext()) : context;
    if (!py::isinstance<PyForwardContext>(ctx))
      throw py::type_error("context: expected a multihead.ForwardContext or None, got " +
                           py::str(py::type::of(ctx)).cast<std::string>());
    PyForwardContext& c = ctx.cast<PyForwardContext&>();
    if (is_narrow(dtype_)) {
      py::tuple r = dtype_ == Precision::BF16 ? run_narrow<bfloat16>(query, key, value, o, "fused", &c)
                                              : run_narrow<float16>(query, key, value, o, "fused", &c);
      return py::make_tuple(r[0], r[1], ctx);
    }
    const py::array q = as_numpy(query, "query");
    const py::object k = key.is(query) ? q : key;
    const py::object v = value.is(query) ? q : value;
    py::tuple r = precision_of(q, "query") == Precision::F64 ? run_with_context<double>(q, k, v, o, c)
                                                              : run_with_context<float>(q, k, v, o, c);
    return py::make_tuple(r[0], r[1], ctx);
  }

  // dℓ/d(inputs, parameters) from a context of this module's current
  // parameters: {"query", "key", "value", state_dict names...}.
  py::dict backward(PyForwardContext& context, const py::object& d_output) {
    if (context.empty())
      throw Error(Error::Kind::Value, "context: empty ForwardContext; get one from forward_with_context()");
    if (is_narrow(context.dtype) != is_narrow(dtype_) || (is_narrow(dtype_) && context.dtype != dtype_))
      throw Error(Error::Kind::Value, std::string("context: filled by a ") + dtype_str(context.dtype) +
                                          " forward, and this module is " + dtype_str(dtype_));
    if (dtype_ == Precision::BF16) return run_narrow_backward<bfloat16>(context, d_output);
    if (dtype_ == Precision::F16) return run_narrow_backward<float16>(context, d_output);
    return context.dtype == Precision::F64 ? run_backward<double>(context, d_output)
                                           : run_backward<float>(context, d_output);
  }

  std::shared_ptr<const BasicMultiheadAttention<double>> module_f64() { return module<double>(); }

  // The 16-bit computing module, built on first use from the master copy
  // (whose values are E's: exact).
  template <class E>
  std::shared_ptr<const NarrowMultiheadAttention<E>> narrow_module() {
    auto& slot = [&]() -> auto& {
      if constexpr (std::is_same_v<E, bfloat16>) return bf16_;
      else return f16_;
    }();
    if (!slot)
      slot = std::make_shared<const NarrowMultiheadAttention<E>>(NarrowMultiheadAttention<E>::rounded(
          config_, cast_parameters_to<MultiheadAttentionParameters<float>>(config_, master())));
    return slot;
  }

 private:
  void modules_changed() override {
    bf16_.reset();
    f16_.reset();
  }

  // The 16-bit forward: (output, None), the output the kind of array the
  // query is (uint16 bits, float16, or float32 widened); with a context, the
  // training forward filling it.
  template <class E>
  py::tuple run_narrow(const py::object& query, const py::object& key, const py::object& value, const ModuleCall& o,
                       const std::string& form, PyForwardContext* context = nullptr) {
    if (form != "fused")
      throw Error(Error::Kind::Value, std::string("form: a ") + dtype_str(dtype_) +
                                          " module runs the fused forward only, got " + quote_input(form));
    HeldNarrow<E> q = narrow_tensor<E>(query, "query");
    HeldNarrow<E> k = key.is(query) ? alias(q) : narrow_tensor<E>(key, "key");
    HeldNarrow<E> v = value.is(query) ? alias(q) : value.is(key) ? alias(k) : narrow_tensor<E>(value, "value");
    const HeldMask<float> kpm = mask_arg<float>(o.key_padding_mask, "key_padding_mask");
    const HeldMask<float> am = mask_arg<float>(o.attn_mask, "attn_mask");
    const ForwardOptions<float> fo = forward_options<float>(o, training, kpm.get(), am.get());
    const std::shared_ptr<const NarrowMultiheadAttention<E>> m = narrow_module<E>();
    NarrowForwardContext<E>* ctx = context ? &context->narrow<E>() : nullptr;
    if (context) context->dtype = precision_of_narrow<E>();
    Tensor<E> out;
    {
      py::gil_scoped_release nogil;
      out = ctx ? m->forward(q.tensor, k.tensor, v.tensor, fo, *ctx) : m->forward(q.tensor, k.tensor, v.tensor, fo);
    }
    record_call(q.tensor, k.tensor, v.tensor, out);
    return py::make_tuple(narrow_to_numpy(std::move(out), q.kind), py::none());
  }

  // The 16-bit backward: every gradient in E, as the kind of array d_output
  // is (uint16 bits, float16, or float32 widened).
  template <class E>
  py::dict run_narrow_backward(PyForwardContext& c, const py::object& d_output) {
    HeldNarrow<E> d = narrow_tensor<E>(d_output, "d_output");
    const std::shared_ptr<const NarrowMultiheadAttention<E>> m = narrow_module<E>();
    MultiheadAttentionGradients<E> g = backward_without_gil([&] { return m->backward(c.narrow<E>(), d.tensor); });
    py::dict out;
    out["query"] = narrow_to_numpy(std::move(g.query), d.kind);
    out["key"] = narrow_to_numpy(std::move(g.key), d.kind);
    out["value"] = narrow_to_numpy(std::move(g.value), d.kind);
    for (const std::string& n : expected_names(config_))
      out[py::str(n)] = narrow_to_numpy(std::move(g.parameters.at(n)), d.kind);
    return out;
  }

  template <class T>
  py::tuple run(const py::array& query, const py::object& key, const py::object& value, const ModuleCall& o,
                bool textbook) {
    HeldTensor<T> q = float_tensor<T>(query, "query");
    HeldTensor<T> k = key.is(query) ? alias(q) : float_tensor<T>(key, "key");
    HeldTensor<T> v = value.is(query) ? alias(q) : value.is(key) ? alias(k) : float_tensor<T>(value, "value");
    const HeldMask<T> kpm = mask_arg<T>(o.key_padding_mask, "key_padding_mask");
    const HeldMask<T> am = mask_arg<T>(o.attn_mask, "attn_mask");
    const ForwardOptions<T> fo = for_module(forward_options<T>(o, training, kpm.get(), am.get()));
    const std::shared_ptr<const BasicMultiheadAttention<T>> m = module<T>();

    ForwardResult<T> r;
    {
      py::gil_scoped_release nogil;
      r = textbook ? m->forward_textbook(q.tensor, k.tensor, v.tensor, fo)
                   : m->forward(q.tensor, k.tensor, v.tensor, fo);
    }
    record_call(q.tensor, k.tensor, v.tensor, r.output);
    auto& a = last_call_addresses();
    if (kpm.mask) a["key_padding_mask"] = kpm.mask->is_bool() ? address(kpm.mask->bool_values()) : address(kpm.mask->float_values());
    if (am.mask) a["attn_mask"] = am.mask->is_bool() ? address(am.mask->bool_values()) : address(am.mask->float_values());
    py::object weights = py::none();
    if (r.attn_weights) weights = to_numpy(std::move(*r.attn_weights));
    return py::make_tuple(to_numpy(std::move(r.output)), weights);
  }

  template <class T>
  py::tuple run_with_context(const py::array& query, const py::object& key, const py::object& value,
                             const ModuleCall& o, PyForwardContext& c) {
    HeldTensor<T> q = float_tensor<T>(query, "query");
    HeldTensor<T> k = key.is(query) ? alias(q) : float_tensor<T>(key, "key");
    HeldTensor<T> v = value.is(query) ? alias(q) : value.is(key) ? alias(k) : float_tensor<T>(value, "value");
    // The masks live for this call only: the context copies them.
    const HeldMask<T> kpm = mask_arg<T>(o.key_padding_mask, "key_padding_mask");
    const HeldMask<T> am = mask_arg<T>(o.attn_mask, "attn_mask");
    const ForwardOptions<T> fo = for_module(forward_options<T>(o, training, kpm.get(), am.get()));
    const std::shared_ptr<const BasicMultiheadAttention<T>> m = module<T>();
    ForwardContext<T>& ctx = c.get<T>();
    c.dtype = std::is_same_v<T, double> ? Precision::F64 : Precision::F32;
    ForwardResult<T> r;
    {
      py::gil_scoped_release nogil;
      r = m->forward(q.tensor, k.tensor, v.tensor, fo, ctx);
    }
    py::object weights = py::none();
    if (r.attn_weights) weights = to_numpy(std::move(*r.attn_weights));
    return py::make_tuple(to_numpy(std::move(r.output)), weights);
  }

  template <class T>
  py::dict run_backward(PyForwardContext& c, const py::object& d_output) {
    HeldTensor<T> d = float_tensor<T>(d_output, "d_output");
    const std::shared_ptr<const BasicMultiheadAttention<T>> m = module<T>();
    MultiheadAttentionGradients<T> g;
    {
      py::gil_scoped_release nogil;
      m->backward(c.get<T>(), d.tensor, g);
    }
    py::dict out;
    out["query"] = to_numpy(std::move(g.query));
    out["key"] = to_numpy(std::move(g.key));
    out["value"] = to_numpy(std::move(g.value));
    for (const std::string& n : expected_names(config_)) out[py::str(n)] = to_numpy(std::move(g.parameters.at(n)));
    return out;
  }

  // The shared module of this dtype multiplies by the weights as stored
  // (FusedPaths::transposed_weights off: transposed copies could go stale).
  template <class T>
  ForwardOptions<T> for_module(ForwardOptions<T> fo) const {
    if (shares_parameters() && (dtype_ == Precision::F64) == std::is_same_v<T, double>) fo.paths.transposed_weights = false;
    return fo;
  }

  std::shared_ptr<const NarrowMultiheadAttention<bfloat16>> bf16_;
  std::shared_ptr<const NarrowMultiheadAttention<float16>> f16_;
};

// What scaled_dot_product_attention_with_context keeps for
// scaled_dot_product_attention_backward: the inputs and the output (the
// arrays themselves, held: no copy; a converted input's converted copy),
// the mask as the kernel read it, each row's log-sum-exp and the options.
template <class T>
struct SdpaSaved {
  HeldTensor<T> q, k, v, out;
  HeldMask<T> mask;
  Tensor<T> lse;
};

// The same for the 16-bit forward: the inputs (16-bit, held), the rounded
// output, the float32 mask and the float32 log-sum-exp.
template <class E>
struct NarrowSdpaSaved {
  HeldNarrow<E> q, k, v;
  Tensor<E> out;
  HeldMask<float> mask;
  Tensor<float> lse;
};

class PySdpaContext {
 public:
  Precision dtype = Precision::F32;
  AttentionOptions options;
  std::unique_ptr<SdpaSaved<float>> f32;
  std::unique_ptr<SdpaSaved<double>> f64;
  std::unique_ptr<NarrowSdpaSaved<bfloat16>> bf16;
  std::unique_ptr<NarrowSdpaSaved<float16>> f16;
  template <class T>
  auto& get() {
    if constexpr (std::is_same_v<T, double>) return f64;
    else if constexpr (std::is_same_v<T, bfloat16>) return bf16;
    else if constexpr (std::is_same_v<T, float16>) return f16;
    else return f32;
  }
  void reset() {
    f32.reset();
    f64.reset();
    bf16.reset();
    f16.reset();
  }
  bool empty() const { return !f32 && !f64 && !bf16 && !f16; }
};

template <class T>
py::object sdpa(const py::array& query, const py::object& key, const py::object& value, const SdpaCall& o,
                PySdpaContext* context = nullptr) {
  HeldTensor<T> q = float_tensor<T>(query, "query");
  HeldTensor<T> k = key.is(query) ? alias(q) : float_tensor<T>(key, "key");
  HeldTensor<T> v = value.is(query) ? alias(q) : value.is(key) ? alias(k) : float_tensor<T>(value, "value");
  // torch.nn.functional.scaled_dot_product_attention: a bool True means
  // "may attend", the opposite of the library's (and MHA's) convention.
  HeldMask<T> am = mask_arg<T>(o.attn_mask, "attn_mask", /*invert=*/true);
  const AttentionOptions ao = attention_options(o);
  Tensor<T> out;
  Tensor<T> weights;
  Tensor<T> lse;
  {
    py::gil_scoped_release nogil;
    out = scaled_dot_product_attention<T>(q.tensor, k.tensor, v.tensor, am.get(), ao,
                                          o.need_weights ? &weights : nullptr, context ? &lse : nullptr);
  }
  record_call(q.tensor, k.tensor, v.tensor, out);
  if (context) {
    py::array out_array = to_numpy(std::move(out));
    auto saved = std::make_unique<SdpaSaved<T>>();
    saved->out = float_tensor<T>(out_array, "output");  // a view of the returned array
    saved->q = std::move(q);
    saved->k = std::move(k);
    saved->v = std::move(v);
    saved->lse = std::move(lse);
    context->options = ao;
    context->dtype = std::is_same_v<T, double> ? Precision::F64 : Precision::F32;
    context->reset();
    // The mask as the kernel read it: the caller's array (viewed) or the
    // inverted copy of a boolean one.
    saved->mask = std::move(am);
    context->get<T>() = std::move(saved);
    return py::make_tuple(out_array, o.need_weights ? to_numpy(std::move(weights)) : py::object(py::none()));
  }
  if (!o.need_weights) return to_numpy(std::move(out));
  return py::make_tuple(to_numpy(std::move(out)), to_numpy(std::move(weights)));
}

// The 16-bit scaled_dot_product_attention: the output the query's kind.
template <class E>
py::object sdpa_narrow(const py::object& query, const py::object& key, const py::object& value, const SdpaCall& o,
                       PySdpaContext* context) {
  if (o.need_weights)
    throw Error(Error::Kind::Value, std::string("need_weights: a ") + dtype_str(precision_of_narrow<E>()) +
                                        " scaled_dot_product_attention runs the flash kernel, which returns no "
                                        "weights; expected False, got True");
  HeldNarrow<E> q = narrow_tensor<E>(query, "query");
  HeldNarrow<E> k = key.is(query) ? alias(q) : narrow_tensor<E>(key, "key");
  HeldNarrow<E> v = value.is(query) ? alias(q) : value.is(key) ? alias(k) : narrow_tensor<E>(value, "value");
  const HeldMask<float> am = mask_arg<float>(o.attn_mask, "attn_mask", /*invert=*/true);
  const AttentionOptions ao = attention_options(o);
  Tensor<E> out;
  Tensor<float> lse;
  {
    py::gil_scoped_release nogil;
    out = scaled_dot_product_attention(q.tensor, k.tensor, v.tensor, am.get(), ao, context ? &lse : nullptr);
  }
  record_call(q.tensor, k.tensor, v.tensor, out);
  if (!context) return narrow_to_numpy(std::move(out), q.kind);
  const NarrowKind kind = q.kind;
  auto saved = std::make_unique<NarrowSdpaSaved<E>>();
  saved->out = Tensor<E>(out);  // the backward's copy (the returned array owns the other)
  saved->q = std::move(q);
  saved->k = std::move(k);
  saved->v = std::move(v);
  saved->mask = std::move(am);
  saved->lse = std::move(lse);
  context->options = ao;
  context->reset();
  context->dtype = precision_of_narrow<E>();
  context->get<E>() = std::move(saved);
  return py::make_tuple(narrow_to_numpy(std::move(out), kind), py::none());
}

// Its backward: d_query, d_key, d_value in E, as the kind of array d_output is.
template <class E>
py::tuple sdpa_narrow_backward(PySdpaContext& c, const py::object& d_output) {
  HeldNarrow<E> d = narrow_tensor<E>(d_output, "d_output");
  const NarrowSdpaSaved<E>& s = *c.get<E>();
  SdpaGradients<E> g;
  {
    py::gil_scoped_release nogil;
    g = scaled_dot_product_attention_backward(s.q.tensor, s.k.tensor, s.v.tensor, s.mask.get(), c.options, s.out,
                                              s.lse, d.tensor);
  }
  return py::make_tuple(narrow_to_numpy(std::move(g.query), d.kind), narrow_to_numpy(std::move(g.key), d.kind),
                        narrow_to_numpy(std::move(g.value), d.kind));
}

// scaled_dot_product_attention(_with_context)'s dispatch on dtype= (None:
// the query's).
py::object sdpa_call(const py::object& query, const py::object& key, const py::object& value, const SdpaCall& c,
                     PySdpaContext* context) {
  const Precision named = c.dtype.is_none() ? Precision::F32 : parse_dtype(c.dtype, /*narrow=*/true);
  if (is_narrow(named)) {
    if (named == Precision::BF16) return sdpa_narrow<bfloat16>(query, key, value, c, context);
    return sdpa_narrow<float16>(query, key, value, c, context);
  }
  const py::array q = as_numpy(query, "query");
  const py::object k = key.is(query) ? q : key, v = value.is(query) ? q : value;
  const Precision p = c.dtype.is_none() ? precision_of(q, "query") : named;
  if (p == Precision::F64) return sdpa<double>(q, k, v, c, context);
  return sdpa<float>(q, k, v, c, context);
}

template <class T>
py::tuple sdpa_backward(PySdpaContext& c, const py::object& d_output) {
  HeldTensor<T> d = float_tensor<T>(d_output, "d_output");
  const SdpaSaved<T>& s = *c.get<T>();
  SdpaGradients<T> g;
  {
    py::gil_scoped_release nogil;
    g = scaled_dot_product_attention_backward<T>(s.q.tensor, s.k.tensor, s.v.tensor, s.mask.get(), c.options,
                                                 s.out.tensor, s.lse, d.tensor);
  }
  return py::make_tuple(to_numpy(std::move(g.query)), to_numpy(std::move(g.key)), to_numpy(std::move(g.value)));
}

PyMultiheadAttention load(const PathArg& path, const std::optional<std::string>& prefix,
                          std::optional<int64_t> num_heads, std::optional<bool> batch_first,
                          std::optional<bool> add_zero_attn, std::optional<double> dropout,
                          const py::object& dtype) {
  LoadOptions lo;
  lo.prefix = prefix.value_or("");
  lo.overrides.num_heads = num_heads;
  lo.overrides.batch_first = batch_first;
  lo.overrides.add_zero_attn = add_zero_attn;
  lo.overrides.dropout = dropout;
  const Precision p = parse_dtype(dtype, /*narrow=*/true);
  LoadedWeights w;
  {
    py::gil_scoped_release nogil;
    w = load_weights(path, lo);
  }
  return PyMultiheadAttention(w.config, std::move(w.parameters), p);
}

// ---- explain and inspect -----------------------------------------------------
// tokens=None | "w1 w2 ..." | a sequence of labels.
std::vector<std::string> token_labels(const py::object& tokens) {
  if (tokens.is_none()) return {};
  if (py::isinstance<py::str>(tokens)) return explain::split_tokens(tokens.cast<std::string>());
  try {
    return tokens.cast<std::vector<std::string>>();
  } catch (const py::cast_error&) {
    throw py::type_error("tokens: expected None, a string of labels or a sequence of strings, got " +
                         py::str(py::type::of(tokens)).cast<std::string>());
  }
}

template <class T>
explain::Report module_report_of(PyMultiheadAttention& mha, const py::array& input, int64_t batch,
                                 const std::vector<std::string>& tokens, const std::optional<std::string>& source) {
  HeldTensor<T> x = float_tensor<T>(input, "input");
  const auto m = mha.module<T>();
  const MultiheadAttentionConfig& c = mha.config();
  if (!c.same_embed_dim())
    throw Error(Error::Kind::Value, "module: explain runs self-attention, which needs kdim = vdim = embed_dim " +
                                        std::to_string(c.embed_dim) + "; this module has kdim " +
                                        std::to_string(c.key_dim()) + ", vdim " + std::to_string(c.value_dim()));
  const std::string what = source.value_or("MultiheadAttention, input " + shape_of(input) + "; " +
                                           std::to_string(c.num_heads) + " heads, embed_dim " +
                                           std::to_string(c.embed_dim) + ", " +
                                           (sizeof(T) == 8 ? "float64" : "float32") + "; self-attention");
  py::gil_scoped_release nogil;
  try {
    return explain::module_report(*m, x.tensor, batch, tokens, what, "tokens");
  } catch (const Error& e) {
    if (e.kind() != Error::Kind::Shape) throw;
    throw Error(e.kind(), "input (the query, key and value of self-attention): " + std::string(e.what()));
  }
}

std::string explain_report(const py::object& module, const py::object& input, const std::optional<std::string>& text,
                           const py::object& tokens, int64_t batch, const py::object& token, const std::string& format,
                           bool unicode, bool colour, const std::optional<std::string>& source,
                           const std::optional<PathArg>& out) {
  if (format != "html" && format != "text" && format != "bertviz")
    throw Error(Error::Kind::Value, "format: expected 'html', 'text' or 'bertviz', got " + quote_input(format));
  if (batch < 0) throw Error(Error::Kind::Value, "batch: expected >= 0, got " + std::to_string(batch));
  explain::Report r;
  if (py::isinstance<PyMultiheadAttention>(module)) {
    if (input.is_none())
      throw Error(Error::Kind::Missing, "input: required with a MultiheadAttention (the query, key and value of "
                                        "self-attention)");
    if (text) throw Error(Error::Kind::Value, "text: applies to a TrainedModel of the lesson task, not a MultiheadAttention");
    PyMultiheadAttention& mha = module.cast<PyMultiheadAttention&>();
    if (is_narrow(mha.dtype()))
      throw Error(Error::Kind::Value, std::string("module: explain shows attention weights, which a ") +
                                          dtype_str(mha.dtype()) + " MultiheadAttention does not return (its flash "
                                          "kernel keeps none); explain a float32 module with its state_dict");
    const py::array x = as_numpy(input, "input");
    const std::vector<std::string> labels = token_labels(tokens);
    r = precision_of(x, "input") == Precision::F64 ? module_report_of<double>(mha, x, batch, labels, source)
                                                   : module_report_of<float>(mha, x, batch, labels, source);
  } else if (py::isinstance<TrainedModel>(module)) {
    for (auto [name, given] : {std::pair{"input", !input.is_none()}, {"tokens", !tokens.is_none()}, {"batch", batch != 0}})
      if (given)
        throw Error(Error::Kind::Value, std::string(name) +
                                            ": applies to a MultiheadAttention only (a trained model's tokens are its words)");
    const TrainedModel& model = module.cast<const TrainedModel&>();
    const std::vector<std::string> words = text ? explain::lesson_words(*text) : explain::lesson_default_sentence();
    const ModelConfig& c = model.config();
    const std::string what = source.value_or(
        "a model trained on the lesson task: " + std::to_string(c.layers) + " layer" + (c.layers > 1 ? "s" : "") +
        ", " + std::to_string(c.heads) + " heads, d_model " + std::to_string(c.d_model) + "; input padded to " +
        std::to_string(c.sequence_length) + " tokens" + (text ? "" : "; a held-out test sentence"));
    py::gil_scoped_release nogil;
    r = explain::lesson_report(model, words, what, nullptr, "text", format != "bertviz");
  } else {
    throw py::type_error("module: expected a multihead.MultiheadAttention or a multihead.TrainedModel, got " +
                         py::str(py::type::of(module)).cast<std::string>());
  }
  if (!token.is_none()) {
    if (py::isinstance<py::bool_>(token) || !(py::isinstance<py::int_>(token) || py::isinstance<py::str>(token)))
      throw py::type_error("token: expected a position (int) or a token label (str), got " +
                           py::str(py::type::of(token)).cast<std::string>());
    r.focus = explain::resolve_token(py::str(token).cast<std::string>(), r.query_tokens, "token");
  }
  std::string bytes;
  {
    py::gil_scoped_release nogil;
    bytes = explain::write_report(r, format, unicode, colour);
    if (out) write_file_atomic(*out, bytes);
  }
  return bytes;
}

py::dict inspect_file(const PathArg& path_arg) {
  const std::string& path = path_arg;
  py::dict d;
  d["path"] = path_arg;
  FileFormat format;
  {
    py::gil_scoped_release nogil;
    format = detect_file_format(path);
  }
  if (format == FileFormat::Npy) {
    LoadedTensor t;
    {
      py::gil_scoped_release nogil;
      t = read_npy(path, path);
    }
    d["format"] = "npy";
    d["dtype"] = to_string(t.dtype);
    d["shape"] = py::tuple(py::cast(t.values.shape()));
    return d;
  }
  if (format != FileFormat::Safetensors)
    throw Error(Error::Kind::Format, path + ": this is " + describe(format) + "; inspect reads safetensors and .npy files");
  SafetensorsFile file;
  std::vector<FoundModule> modules;
  {
    py::gil_scoped_release nogil;
    file = read_safetensors(path, Sixteen::Decode, no_tensors());  // names and shapes only
    modules = find_attention_modules(file, path);
  }
  d["format"] = "safetensors";
  py::dict tensors;  // name order, as `multihead inspect` lists them
  std::map<std::string, std::pair<DType, Shape>> rows;
  for (const auto& [name, t] : file.tensors) rows[name] = {t.dtype, t.values.shape()};
  for (const auto& [name, t] : file.integer_tensors) rows[name] = {t.dtype, t.shape};
  for (const auto& [name, t] : file.undecoded) rows[name] = {t.dtype, t.shape};
  for (const auto& [name, row] : rows) {
    py::dict e;
    e["dtype"] = to_string(row.first);
    e["shape"] = py::tuple(py::cast(row.second));
    tensors[py::str(name)] = e;
  }
  d["tensors"] = tensors;
  d["metadata"] = file.metadata;
  py::list found;
  for (const FoundModule& m : modules) {
    py::dict e;
    e["prefix"] = m.prefix;
    if (!m.problem.empty()) {
      e["problem"] = m.problem;
    } else {
      e["problem"] = py::none();
      e["embed_dim"] = m.embed_dim;
      e["kdim"] = m.kdim;
      e["vdim"] = m.vdim;
      e["bias"] = m.bias;
      e["add_bias_kv"] = m.add_bias_kv;
      e["num_heads"] = m.num_heads;
      e["batch_first"] = m.batch_first;
      e["add_zero_attn"] = m.add_zero_attn;
      e["dropout"] = m.dropout;
    }
    found.append(e);
  }
  d["modules"] = found;
  return d;
}

const char* const kClassDoc = R"doc(MultiheadAttention(embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False, add_zero_attn=False, kdim=None, vdim=None, batch_first=False, *, seed=0, dtype=None)

Allows the model to jointly attend to information from different
representation subspaces, as torch.nn.MultiheadAttention does (same
arguments, same defaults, same state_dict names).

    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O
    head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)

Args:
    embed_dim: Total dimension of the model.
    num_heads: Number of parallel attention heads. embed_dim is split across
        them (each head has dimension embed_dim // num_heads).
    dropout: Dropout probability on the attention weights, applied only in
        training mode (see train()). Default: 0.0.
    bias: If True, adds bias to the input and output projections. Default: True.
    add_bias_kv: If True, adds bias_k and bias_v to the key and value
        sequences at dim=0. Default: False.
    add_zero_attn: If True, adds a new batch of zeros to the key and value
        sequences at dim=1. Default: False.
    kdim: Total number of features for keys. Default: None (kdim=embed_dim).
    vdim: Total number of features for values. Default: None (vdim=embed_dim).
    batch_first: If True, inputs and outputs are (batch, seq, feature).
        Default: False (seq, batch, feature).

Keyword-only (not in PyTorch):
    seed: Seed of the initialisation (PyTorch's _reset_parameters
        distributions, drawn from another generator). Default: 0.
    dtype: numpy.float32 (default, as PyTorch) or numpy.float64: the dtype
        the parameters are kept in and state_dict() returns. forward()
        computes in its query's dtype either way. Or 'bfloat16' / 'float16'
        (also 'bf16', 'f16', numpy.float16): the module torch's
        .to(torch.bfloat16) makes. Parameters, inputs and output are stored
        in that type and forward() computes in it (docs/precision.md), for
        any query: a uint16 array of its bits, a float16 array (float16
        only), or a float32 array, rounded to nearest even on the way in.
        The output is the query's kind: uint16 bits, float16, or float32
        (widened, exact). state_dict() returns uint16 bits;
        load_state_dict() and update_parameters() take uint16 bits, float16
        (float16 module) or float32 (rounded); float64 is refused.
        forward_with_context/backward too: the gradients in the 16-bit type,
        as the kind of array d_output is. need_weights=False.

Unlike a torch module, a new MultiheadAttention is in eval mode
(training=False): dropout is random, so it must be asked for.

Examples::

    >>> mha = multihead.MultiheadAttention(embed_dim, num_heads)
    >>> mha.load_state_dict({k: v.numpy() for k, v in torch_mha.state_dict().items()})
    >>> attn_output, attn_output_weights = mha(query, key, value)
)doc";

// The docstrings of the option-taking calls: their first line (the
// signature) and their keyword sections come from the rows (DocBuilder,
// below); these are the parts around them.
const char* const kForwardTensorsDoc = R"doc(    query: Query embeddings of shape (L, E) unbatched, (L, N, E) when
        batch_first=False or (N, L, E) when batch_first=True, where L is the
        target sequence length, N the batch size and E the embedding dimension
        embed_dim. Any array-like: NumPy arrays, torch CPU tensors, anything
        with the buffer or array protocol. A C-contiguous float32 or float64
        array is read in place (no copy); anything else is converted once.
        The computation runs in float64 for a float64 query, else in float32;
        a 16-bit module computes in its type (see help(MultiheadAttention),
        dtype), the output the query's kind.
    key: Key embeddings of shape (S, Ek) unbatched, (S, N, Ek) or (N, S, Ek)
        with batch_first, where S is the source sequence length and Ek kdim.
    value: Value embeddings of shape (S, Ev) unbatched, (S, N, Ev) or
        (N, S, Ev) with batch_first, where Ev is vdim.
)doc";

const char* const kForwardReturnsDoc = R"doc(
Returns:
    (attn_output, attn_output_weights): NumPy arrays of the computation's
    dtype; attn_output has the query's shape (with E features),
    attn_output_weights is None unless need_weights.

Raises:
    ValueError: a shape, option or value the library rejects; the message
        names the tensor and gives the expected and the actual shape.
    TypeError: an array of a dtype it cannot take (int, complex, object).

The GIL is released while computing: several threads may call one module at
once. Inputs are read in place, so no thread may write to them during a call.
)doc";

const char* const kForwardWithContextDoc = R"doc(
The training forward: the same computation as forward() (bit-identical
output and weights; form is always 'fused'), also keeping what backward()
needs. Dropout applies in training mode (train()), drawn from dropout_seed;
backward() regenerates the same mask from it (none is stored). The other
arguments are forward()'s.

Returns:
    (attn_output, attn_output_weights, context): context is a
    ForwardContext (the one given as context=, refilled, or a new one). It
    keeps its own copy of the masks (the arrays passed in may change or go
    afterwards); no gradient flows through the returned weights.
)doc";

const char* const kBackwardDoc = R"doc(backward(context, d_output) -> dict

The gradients of a loss l given d_output = dl/d(attn_output), of the output's
shape, for the forward that filled `context`:
    "query", "key", "value": dl/d(input), the inputs' shapes. Self-attention
        (one array passed three times) gets three arrays: the array's
        gradient is their sum.
    every state_dict name ("in_proj_weight", "out_proj.bias", ...): dl/dparam.
Arrays are in the context's dtype. ValueError if the context is empty, or
the module's parameters changed since that forward (load_state_dict,
update_parameters), or d_output has the wrong shape.
)doc";

const char* const kSdpaIntroDoc = R"doc(
softmax(query @ key^T * scale + mask) @ value, as
torch.nn.functional.scaled_dot_product_attention (PyTorch 2.x).

Args:
    query: (..., L, D).
    key: (..., S, D), the same leading dimensions (no broadcasting).
    value: (..., S, Dv).
)doc";

const char* const kSdpaReturnsDoc = R"doc(
Returns:
    The output (..., L, Dv), or (output, weights) with need_weights.
)doc";

// The bindings' own keywords, after the shared rows (options.hpp).
#define MULTIHEAD_FORWARD_FORM(X) \
  X(std::string, form, "fused", , "'fused' (default) or 'textbook' (the lesson's per-head form).")
#define MULTIHEAD_FORWARD_CONTEXT(X) \
  X(py::object, context, py::none(), , "A ForwardContext to refill (its buffers reused), or None for a new one.")

struct ForwardCall : ModuleCall {
  MULTIHEAD_FORWARD_FORM(MULTIHEAD_OPTION_MEMBER)
};
struct ForwardContextCall : ModuleCall {
  MULTIHEAD_FORWARD_CONTEXT(MULTIHEAD_OPTION_MEMBER)
};

// The rows of the module's forwards, in the order of their signatures.
#define MULTIHEAD_FORWARD_ROWS(EXTRA, M) \
  MULTIHEAD_MODULE_POSITIONAL(M) MULTIHEAD_ATTENTION_KEYWORDS(M) MULTIHEAD_MODULE_KEYWORDS(M) EXTRA(M)
#define MULTIHEAD_SDPA_ROWS(M) MULTIHEAD_SDPA_POSITIONAL(M) MULTIHEAD_ATTENTION_KEYWORDS(M) MULTIHEAD_SDPA_KEYWORDS(M)

// forward's and __call__'s docstring (the two differ only in their name).
template <class Call>
std::string forward_doc(const std::string& name) {
  const Call d;
  DocBuilder b(name);
  for (const char* t : {"query", "key", "value"}) b.required(t);
  MULTIHEAD_MODULE_POSITIONAL(MULTIHEAD_PY_DOC)
  const std::string positional = b.take_entries();
  b.keyword_only();
  MULTIHEAD_ATTENTION_KEYWORDS(MULTIHEAD_PY_DOC)
  MULTIHEAD_MODULE_KEYWORDS(MULTIHEAD_PY_DOC)
  MULTIHEAD_FORWARD_FORM(MULTIHEAD_PY_DOC)
  return b.line() + "\n\nArgs:\n" + kForwardTensorsDoc + positional + "\nKeyword-only (not in PyTorch):\n" +
         b.take_entries() + kForwardReturnsDoc;
}

std::string forward_with_context_doc() {
  const ForwardContextCall d;
  DocBuilder b("forward_with_context");
  for (const char* t : {"query", "key", "value"}) b.required(t);
  MULTIHEAD_MODULE_POSITIONAL(MULTIHEAD_PY_SIG)
  b.keyword_only();
  MULTIHEAD_ATTENTION_KEYWORDS(MULTIHEAD_PY_SIG)
  MULTIHEAD_MODULE_KEYWORDS(MULTIHEAD_PY_SIG)
  MULTIHEAD_FORWARD_CONTEXT(MULTIHEAD_PY_DOC)
  return b.line() + "\n" + kForwardWithContextDoc + "\nKeyword-only:\n" + b.take_entries();
}

const char* const kSdpaWithContextDoc = R"doc(
The training forward of scaled_dot_product_attention (the same arguments
and output), also keeping what scaled_dot_product_attention_backward needs:
the inputs and the output (held, not copied: change none of them in place
before the backward), the mask, each row's log-sum-exp and the options
(dropout's keep decisions are regenerated from dropout_seed).

Returns:
    (output, weights or None, context): context is an SdpaContext.
)doc";

std::string sdpa_doc(const std::string& name = "scaled_dot_product_attention") {
  const SdpaCall d;
  DocBuilder b(name);
  for (const char* t : {"query", "key", "value"}) b.required(t);
  MULTIHEAD_SDPA_POSITIONAL(MULTIHEAD_PY_DOC)
  const std::string positional = b.take_entries();
  b.keyword_only();
  b.take_names();
  MULTIHEAD_ATTENTION_KEYWORDS(MULTIHEAD_PY_SIG)
  const std::string shared = b.take_names();
  MULTIHEAD_SDPA_KEYWORDS(MULTIHEAD_PY_DOC)
  return b.line() + "\n" + (name == "scaled_dot_product_attention" ? kSdpaIntroDoc : kSdpaWithContextDoc) +
         positional + "\nKeyword-only (not in PyTorch):\n" + b.take_entries() +
         DocBuilder::wrap_entry(shared, "as in MultiheadAttention.forward.") +
         (name == "scaled_dot_product_attention" ? kSdpaReturnsDoc : "");
}

}  // namespace
}  // namespace multihead::python

PYBIND11_MODULE(_multihead, m) {
  namespace py = pybind11;
  using namespace multihead;
  using namespace multihead::python;
  using namespace pybind11::literals;

  // Docstrings start with their own Python signature, as PyTorch's read
  // (pybind11's would show every array argument as `object`).
  py::options options;
  options.disable_function_signatures();
  m.doc() = "multihead: torch.nn.MultiheadAttention on the CPU, from NumPy arrays (C++ library, pybind11).";
  m.attr("__version__") = multihead::version();

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const multihead::Error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const std::length_error& e) {
      // A size past what a container can hold (pybind11 would say ValueError).
      PyErr_SetString(PyExc_MemoryError, (std::string("out of memory: ") + e.what()).c_str());
    }
  });

  py::class_<PyMultiheadAttention> mha(m, "MultiheadAttention", kClassDoc);
  mha      .def(py::init(&PyMultiheadAttention::create), "embed_dim"_a, "num_heads"_a, "dropout"_a = 0.0,
           "bias"_a = true, "add_bias_kv"_a = false, "add_zero_attn"_a = false, "kdim"_a = py::none(),
           "vdim"_a = py::none(), "batch_first"_a = false, py::kw_only(), "seed"_a = 0,
           "dtype"_a = py::none(),
           "__init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False, add_zero_attn=False, "
           "kdim=None, vdim=None, batch_first=False, *, seed=0, dtype=None)\n\nSee help(MultiheadAttention).")
      .def("backward", &PyMultiheadAttention::backward, kBackwardDoc, "context"_a, "d_output"_a)
      .def("update_parameters", &PyMultiheadAttention::update_parameters, "update"_a,
           "update_parameters(self, update) -> None\n\n"
           "Calls update(name, array) for every parameter, in state_dict order, with a copy in the module's\n"
           "dtype. update either changes the array in place and returns None, or returns the new values\n"
           "(any array-like of the same shape). The module then takes them all, as load_state_dict does\n"
           "(shapes checked: ValueError naming the parameter; on any error the module is unchanged).\n"
           "Contexts from before the update are refused by backward().\n\n"
           "    g = mha.backward(ctx, d_out)\n"
           "    mha.update_parameters(lambda name, p: p - lr * g[name])")
      .def("share_parameters", &PyMultiheadAttention::share_parameters, "arrays"_a,
           "share_parameters(self, arrays) -> None\n\n"
           "From now on the module reads its parameters from the memory of `arrays` (a dict under\n"
           "state_dict's names, every parameter, each a C-contiguous array of the module's dtype and of its\n"
           "shape: TypeError / ValueError naming it), with no copy: changes made to them in place are seen\n"
           "by the next call, with nothing to reload (multihead.torch shares the torch Parameters so).\n"
           "A backward reads the values they hold then. state_dict() copies their current values;\n"
           "update_parameters() and load_state_dict() end the sharing (the module takes its own copy).\n"
           "The arrays are kept alive while shared.")
      .def_property_readonly("shares_parameters", &PyMultiheadAttention::shares_parameters,
           "True after share_parameters(), until update_parameters() or load_state_dict().")
      .def("state_dict", &PyMultiheadAttention::state_dict,
           "state_dict(self) -> dict\n\nA new dict of the parameters under PyTorch's names (copies, in the module's dtype).")
      .def("load_state_dict", &PyMultiheadAttention::load_state_dict, "state_dict"_a, "strict"_a = true,
           "load_state_dict(self, state_dict, strict=True) -> (missing_keys, unexpected_keys)\n\n"
           "Copies parameters from any mapping of names to array-likes (NumPy arrays, the buffer or array\n"
           "protocol). A torch state_dict works after {k: v.numpy() for k, v in sd.items()}.\n"
           "Returns (missing_keys, unexpected_keys); with strict=True either raises ValueError.")
      .def("train", [](py::object self, bool mode) { self.cast<PyMultiheadAttention&>().training = mode; return self; },
           "mode"_a = true, "train(self, mode=True) -> self\n\nTraining mode (dropout applies) or, with mode=False, eval mode. Returns self.")
      .def("eval", [](py::object self) { self.cast<PyMultiheadAttention&>().training = false; return self; },
           "eval(self) -> self\n\nEval mode (no dropout). Returns self.")
      .def_readwrite("training", &PyMultiheadAttention::training)
      .def_property_readonly("embed_dim", [](const PyMultiheadAttention& s) { return s.config().embed_dim; })
      .def_property_readonly("num_heads", [](const PyMultiheadAttention& s) { return s.config().num_heads; })
      .def_property_readonly("head_dim", [](const PyMultiheadAttention& s) { return s.config().head_dim(); })
      .def_property_readonly("dropout", [](const PyMultiheadAttention& s) { return s.config().dropout; })
      .def_property_readonly("kdim", [](const PyMultiheadAttention& s) { return s.config().key_dim(); })
      .def_property_readonly("vdim", [](const PyMultiheadAttention& s) { return s.config().value_dim(); })
      .def_property_readonly("batch_first", [](const PyMultiheadAttention& s) { return s.config().batch_first; })
      .def_property_readonly("add_zero_attn", [](const PyMultiheadAttention& s) { return s.config().add_zero_attn; })
      .def_property_readonly("add_bias_kv", [](const PyMultiheadAttention& s) { return s.config().add_bias_kv; })
      .def_property_readonly("bias", [](const PyMultiheadAttention& s) { return s.config().bias; })
      .def_property_readonly("dtype", [](const PyMultiheadAttention& s) -> py::object {
        // NumPy has no bfloat16: the 16-bit modules' dtype is its name.
        if (is_narrow(s.dtype())) return py::str(dtype_str(s.dtype()));
        return py::dtype(dtype_str(s.dtype()));
      }, "numpy.dtype('float32') or ('float64'); 'bfloat16' or 'float16' (a str) for a 16-bit module.")
      .def("__repr__", [](const PyMultiheadAttention& s) {
        const auto& c = s.config();
        auto b = [](bool x) { return x ? "True" : "False"; };
        return "MultiheadAttention(embed_dim=" + std::to_string(c.embed_dim) +
               ", num_heads=" + std::to_string(c.num_heads) + ", dropout=" + py::repr(py::float_(c.dropout)).cast<std::string>() +
               ", bias=" + b(c.bias) + ", add_bias_kv=" + b(c.add_bias_kv) + ", add_zero_attn=" + b(c.add_zero_attn) +
               ", kdim=" + std::to_string(c.key_dim()) + ", vdim=" + std::to_string(c.value_dim()) +
               ", batch_first=" + b(c.batch_first) + ", dtype=" + dtype_str(s.dtype()) + ")";
      });

  // The option-taking calls: their parameters, py::arg lists and docstrings
  // come from the rows of options.hpp.
  {
    const ForwardCall d;
    auto forward = [](PyMultiheadAttention& self, const py::object& query, const py::object& key,
                      const py::object& value MULTIHEAD_FORWARD_ROWS(MULTIHEAD_FORWARD_FORM, MULTIHEAD_PY_PARAM)) {
      ForwardCall c;
      MULTIHEAD_FORWARD_ROWS(MULTIHEAD_FORWARD_FORM, MULTIHEAD_PY_STORE)
      return self.forward(query, key, value, c, c.form);
    };
    for (const char* name : {"forward", "__call__"})
      mha.def(name, forward, forward_doc<ForwardCall>(name).c_str(), "query"_a, "key"_a,
              "value"_a MULTIHEAD_MODULE_POSITIONAL(MULTIHEAD_PY_ARG), py::kw_only()
                  MULTIHEAD_ATTENTION_KEYWORDS(MULTIHEAD_PY_ARG) MULTIHEAD_MODULE_KEYWORDS(MULTIHEAD_PY_ARG)
                      MULTIHEAD_FORWARD_FORM(MULTIHEAD_PY_ARG));
  }
  {
    const ForwardContextCall d;
    mha.def(
        "forward_with_context",
        [](PyMultiheadAttention& self, const py::object& query, const py::object& key,
           const py::object& value MULTIHEAD_FORWARD_ROWS(MULTIHEAD_FORWARD_CONTEXT, MULTIHEAD_PY_PARAM)) {
          ForwardContextCall c;
          MULTIHEAD_FORWARD_ROWS(MULTIHEAD_FORWARD_CONTEXT, MULTIHEAD_PY_STORE)
          return self.forward_with_context(query, key, value, c, c.context);
        },
        forward_with_context_doc().c_str(), "query"_a, "key"_a,
        "value"_a MULTIHEAD_MODULE_POSITIONAL(MULTIHEAD_PY_ARG), py::kw_only()
            MULTIHEAD_ATTENTION_KEYWORDS(MULTIHEAD_PY_ARG) MULTIHEAD_MODULE_KEYWORDS(MULTIHEAD_PY_ARG)
                MULTIHEAD_FORWARD_CONTEXT(MULTIHEAD_PY_ARG));
  }
  {
    const SdpaCall d;
    m.def(
        "scaled_dot_product_attention",
        [](const py::object& query, const py::object& key, const py::object& value MULTIHEAD_SDPA_ROWS(MULTIHEAD_PY_PARAM)) {
          SdpaCall c;
          MULTIHEAD_SDPA_ROWS(MULTIHEAD_PY_STORE)
          return sdpa_call(query, key, value, c, nullptr);
        },
        sdpa_doc().c_str(), "query"_a, "key"_a, "value"_a MULTIHEAD_SDPA_POSITIONAL(MULTIHEAD_PY_ARG), py::kw_only()
            MULTIHEAD_ATTENTION_KEYWORDS(MULTIHEAD_PY_ARG) MULTIHEAD_SDPA_KEYWORDS(MULTIHEAD_PY_ARG));
  }
  {
    const SdpaCall d;
    m.def(
        "scaled_dot_product_attention_with_context",
        [](const py::object& query, const py::object& key, const py::object& value MULTIHEAD_SDPA_ROWS(MULTIHEAD_PY_PARAM)) {
          SdpaCall c;
          MULTIHEAD_SDPA_ROWS(MULTIHEAD_PY_STORE)
          py::object ctx = py::cast(PySdpaContext());
          const py::tuple r = sdpa_call(query, key, value, c, &ctx.cast<PySdpaContext&>()).cast<py::tuple>();
          return py::make_tuple(r[0], r[1], ctx);
        },
        sdpa_doc("scaled_dot_product_attention_with_context").c_str(), "query"_a, "key"_a,
        "value"_a MULTIHEAD_SDPA_POSITIONAL(MULTIHEAD_PY_ARG), py::kw_only()
            MULTIHEAD_ATTENTION_KEYWORDS(MULTIHEAD_PY_ARG) MULTIHEAD_SDPA_KEYWORDS(MULTIHEAD_PY_ARG));
  }
  m.def(
      "scaled_dot_product_attention_backward",
      [](const py::object& context, const py::object& d_output) {
        if (!py::isinstance<PySdpaContext>(context))
          throw py::type_error("context: expected a multihead.SdpaContext (from "
                               "scaled_dot_product_attention_with_context), got " +
                               py::str(py::type::of(context)).cast<std::string>());
        PySdpaContext& c = context.cast<PySdpaContext&>();
        if (c.empty())
          throw Error(Error::Kind::Value, "context: empty SdpaContext; get one from "
                                          "scaled_dot_product_attention_with_context()");
        switch (c.dtype) {
          case Precision::F64: return sdpa_backward<double>(c, d_output);
          case Precision::BF16: return sdpa_narrow_backward<bfloat16>(c, d_output);
          case Precision::F16: return sdpa_narrow_backward<float16>(c, d_output);
          default: return sdpa_backward<float>(c, d_output);
        }
      },
      "context"_a, "d_output"_a,
      "scaled_dot_product_attention_backward(context, d_output) -> (d_query, d_key, d_value)\n\n"
      "The gradients of a loss l given d_output = dl/d(output), (..., L, Dv), for the forward that filled\n"
      "`context` (scaled_dot_product_attention_with_context), in its dtype and the inputs' shapes:\n"
      "the kernels' own backward (no gradient reaches the mask). ValueError naming d_output if its\n"
      "shape is wrong. The GIL is released while computing.");
  py::class_<PySdpaContext>(m, "SdpaContext",
                            "What scaled_dot_product_attention_with_context keeps for\n"
                            "scaled_dot_product_attention_backward: the inputs and output (held, not copied),\n"
                            "the mask, each row's log-sum-exp and the options.")
      .def_property_readonly("dtype", [](const PySdpaContext& c) -> py::object {
        if (is_narrow(c.dtype)) return py::str(dtype_str(c.dtype));
        return py::dtype(dtype_str(c.dtype));
      });

  py::class_<PyForwardContext>(m, "ForwardContext",
                               "What MultiheadAttention.forward_with_context keeps for backward(): copies of the\n"
                               "inputs, the projected Q/K/V, the attention output before out_proj, each attention\n"
                               "row's log-sum-exp (never the L x S weights), the options, and the masks.\n"
                               "Pass it back as context= to reuse its buffers.")
      .def_property_readonly("nbytes", &PyForwardContext::nbytes, "Bytes of the buffers it holds.")
      .def_property_readonly("empty", &PyForwardContext::empty, "True until a forward has filled it.")
      .def_property_readonly("dtype", [](const PyForwardContext& c) -> py::object {
        if (is_narrow(c.dtype)) return py::str(dtype_str(c.dtype));
        return py::dtype(dtype_str(c.dtype));
      });

  bind_grouped_query_attention(m);
  bind_trainer(m);

  m.def("alibi_slopes", &multihead::alibi_slopes, "heads"_a,
        "alibi_slopes(heads) -> list[float]\n\nALiBi's per-head slopes (Press et al. 2022): 2^(-8h/H) for H a "
        "power of two,\nelse the authors' interpolation (docs/semantics.md).");

  m.def("load_weights", &load,
        "load_weights(path, prefix=None, *, num_heads=None, batch_first=None, add_zero_attn=None, dropout=None, dtype=None)\n\n"
        "A MultiheadAttention from a safetensors state_dict (PyTorch's names; F32, F64, F16 or BF16).\n"
        "dtype as MultiheadAttention's: 'bfloat16' / 'float16' keep a BF16 / F16 file's values exactly\n"
        "(other files are rounded to nearest even).\n"
        "The configuration the tensors cannot tell (num_heads, batch_first, add_zero_attn, dropout) comes\n"
        "from the file's __metadata__, which the keyword arguments override. With a prefix (e.g.\n"
        "'layers.0.self_attn.', the final '.' optional), only the tensors '<prefix><name>' are read, as\n"
        "from a whole model's state_dict; metadata is looked up as '<prefix>key', then 'key'.",
        "path"_a, "prefix"_a = py::none(), py::kw_only(), "num_heads"_a = py::none(), "batch_first"_a = py::none(),
        "add_zero_attn"_a = py::none(), "dropout"_a = py::none(), "dtype"_a = py::none());

  m.def(
      "save_weights",
      [](const PathArg& path, PyMultiheadAttention& module) {
        if (is_narrow(module.dtype())) {
          const auto bf16 = module.dtype() == Precision::BF16 ? module.narrow_module<bfloat16>() : nullptr;
          const auto f16 = module.dtype() == Precision::F16 ? module.narrow_module<float16>() : nullptr;
          py::gil_scoped_release nogil;
          write_file_atomic(path, bf16 ? serialize_weights(*bf16) : serialize_weights(*f16));
          return;
        }
        const auto mod = module.module_f64();
        py::gil_scoped_release nogil;
        save_weights(path, *mod);
      },
      "path"_a, "module"_a,
      "save_weights(path, module)\n\nWrites the module's state_dict as F32 safetensors (BF16 / F16 for a 16-bit module:\n"
      "its parameters as they are), with its configuration in __metadata__ (what load_weights reads).\n"
      "Atomic: a failure leaves no partial file.");

  m.def("explain", &explain_report, "module"_a, "input"_a = py::none(), py::kw_only(), "text"_a = py::none(),
        "tokens"_a = py::none(), "batch"_a = 0, "token"_a = py::none(), "format"_a = "html", "unicode"_a = false,
        "colour"_a = false, "source"_a = py::none(), "out"_a = py::none(),
        "explain(module, input=None, *, text=None, tokens=None, batch=0, token=None, format='html', unicode=False, "
        "colour=False, source=None, out=None) -> str\n\n"
        "What each head attends to, as `multihead explain` writes it: format 'html' (one self-contained\n"
        "page), 'text' (one query token's rows, head by head) or 'bertviz' (head_view's JSON). Returns the\n"
        "report as a string, also written to `out` (atomic) when given.\n"
        "  module: a MultiheadAttention, with input (L, E), or (L, B, E) / (N, L, E) as its batch_first\n"
        "      says, attended to itself (entry `batch`; tokens: its L labels, a string or a sequence;\n"
        "      default the positions); or a TrainedModel of the lesson task, with text (a sentence of its\n"
        "      words; default its held-out test sentence), which adds the answer at \"it\" and the heads'\n"
        "      specialisation measures.\n"
        "  token: the query to show (text) or focus first (html): a position or a label.\n"
        "  unicode, colour: the text view's shading and ANSI colours (off: the CLI's file output).\n"
        "  source: the page's line on what was run (default: a description of the module and input).\n"
        "Every layer's per-head weights come from attention_weights_per_head (the flash kernel's\n"
        "recomputed weights) or TrainedModel.evaluate. The GIL is released while computing.");
  m.def("inspect", &inspect_file, "path"_a,
        "inspect(path) -> dict\n\n"
        "What `multihead inspect` lists of a file. safetensors: {'path', 'format': 'safetensors',\n"
        "'tensors': {name: {'dtype', 'shape'}} (name order), 'metadata': {key: value}, 'modules': [one\n"
        "dict per MultiheadAttention in it: 'prefix', 'problem' (None, or why load_weights would refuse\n"
        "it), 'embed_dim', 'kdim', 'vdim', 'bias', 'add_bias_kv' (from the shapes), 'num_heads',\n"
        "'batch_first', 'add_zero_attn', 'dropout' (from the metadata; None when absent)]}. .npy:\n"
        "{'path', 'format': 'npy', 'dtype', 'shape'}.");

  // multihead/runtime.hpp: process-wide switches, as the CLI's --threads,
  // --simd-target and MULTIHEAD_KERNEL.
  m.def("set_threads", &multihead::set_threads, "threads"_a,
        "set_threads(threads)\n\nThreads of the library's parallel loops and of its BLAS, for every later call;\n"
        "threads <= 0 leaves both as they are. A call's num_threads > 0 still wins for its own loops.");
  m.def("threads", &multihead::threads, "threads() -> int\n\nThreads the library's loops use for num_threads=0.");
  m.def("check_environment", &multihead::check_environment,
        "check_environment() -> None\n\nChecks every MULTIHEAD_* tuning variable (MULTIHEAD_SIMD_TARGET, MULTIHEAD_KERNEL,\n"
        "MULTIHEAD_BF16_DOT, ...); ValueError naming the first with an unknown value and the values\n"
        "it takes. `import multihead` calls it, as every command of the CLI does, so a mistyped\n"
        "variable fails at once rather than in whichever call first reads it.");
  // multihead/tensor.hpp: the kept storage blocks.
  m.def(
      "kept_storage",
      [] {
        const multihead::KeptStorage k = multihead::kept_storage();
        py::dict d;
        d["bytes"] = k.bytes;
        d["blocks"] = k.blocks;
        d["limit_bytes"] = k.limit_bytes;
        return d;
      },
      "kept_storage() -> dict\n\nFreed storage blocks (256 KiB or more) the library keeps for reuse, so that a\n"
      "loop allocating the same arrays every step does not fault their pages in again:\n"
      "{'bytes', 'blocks', 'limit_bytes'}. The limit is MULTIHEAD_KEPT_STORAGE_MIB (default 256)\n"
      "or set_kept_storage_limit().");
  m.def(
      "set_kept_storage_limit",
      [](int64_t bytes) {
        if (bytes < 0)
          throw multihead::Error(multihead::Error::Kind::Value,
                                 "set_kept_storage_limit: bytes must be >= 0, got " + std::to_string(bytes));
        multihead::set_kept_storage_limit(static_cast<std::size_t>(bytes));
      },
      "bytes"_a,
      "set_kept_storage_limit(bytes)\n\nAt most this many bytes of freed storage kept for reuse; 0 keeps nothing.\n"
      "Kept blocks over the new limit are freed now, oldest first.");
  m.def("release_kept_storage", &multihead::release_kept_storage,
        "release_kept_storage() -> int\n\nFrees every kept storage block (the limit stays); returns the bytes freed.");
  m.def("blas_threads", &multihead::blas_threads, "blas_threads() -> int\n\nThreads the BLAS uses now.");
  m.def("simd_targets_available", &multihead::simd_targets_available,
        "simd_targets_available() -> list[str]\n\nSIMD targets compiled in that this CPU runs, best first.");
  m.def("simd_target_current", &multihead::simd_target_current,
        "simd_target_current() -> str\n\nThe target the SIMD kernels dispatch to now.");
  m.def("simd_target_force", &multihead::simd_target_force, "name"_a,
        "simd_target_force(name)\n\nForces a SIMD target (e.g. 'AVX2') for every later call; '' lifts it.");
  m.def("bf16_dot_force", &multihead::bf16_dot_force, "way"_a,
        "bf16_dot_force(way)\n\nThe bf16 flash kernel's way for every later call: 'fma' (widened to float32,\n"
        "float32 FMA), 'dpbf16' (bf16 pairs into float32, vdpbf16ps where the CPU has AVX512_BF16) or\n"
        "'measure' (time both on this core, once per process); '' or 'auto' lifts the force: auto is\n"
        "dpbf16 on an AMD core with AVX512_BF16, fma elsewhere (docs/precision.md, 'The two bf16 dot ways').");
  m.def("bf16_dot_current", &multihead::bf16_dot_current,
        "bf16_dot_current() -> str\n\nThe bf16 way the current SIMD target runs now, and why.");
  m.def("f16_gemm_force", &multihead::f16_gemm_force, "way"_a,
        "f16_gemm_force(way)\n\nHow products of two float16 operands (the f16 modules' projections) run for every\n"
        "later call: 'widen' (both widened to float32) or 'bf16x3' (each f16 value split exactly into two bf16\n"
        "numbers, three bf16 products on oneDNN's bf16 matmul); '' or 'auto' lifts the force: auto is bf16x3\n"
        "where oneDNN's bf16 matmul runs on AMX (docs/precision.md, 'f16 products on a bf16 matmul').");
  m.def("f16_gemm_current", &multihead::f16_gemm_current,
        "f16_gemm_current() -> str\n\nThe way f16 products run now, and why.");
  m.def("narrow_attention_force", &multihead::narrow_attention_force, "way"_a,
        "narrow_attention_force(way)\n\nHow bf16 attention computes its products, forward (QK^T, PV) and\n"
        "backward, for every later call: 'flash' (the flash kernel) or 'matmul' (blocks of query rows, the\n"
        "products on oneDNN's bf16 matmul, the weights (and, backward, the score gradients) rounded to bf16);\n"
        "'' or 'auto' lifts the force: auto is matmul for calls of at least 128 query rows (a backward also\n"
        "over at least 2 K/V slices, batch entries x K/V heads) where oneDNN's bf16 matmul runs on AMX (docs/precision.md,\n"
        "'bf16 attention on a bf16 matmul').");
  m.def("narrow_attention_current", &multihead::narrow_attention_current,
        "narrow_attention_current() -> str\n\nThe way bf16 attention runs now, and why.");
  m.def(
      "kernel_force", [](const std::string& name) { multihead::kernel_force(parse_attention_kernel(name)); },
      "name"_a,
      "kernel_force(name)\n\nForces 'reference', 'materialized' or 'flash' for every later call, whatever the\n"
      "call asks for; 'auto' lifts it.");
  m.def(
      "kernel_forced", [] { return to_string(multihead::kernel_forced()); },
      "kernel_forced() -> str\n\nThe forced kernel, or 'auto'.");

  m.def(
      "_debug_last_call",
      [] { return last_call_addresses(); },
      "_debug_last_call() -> dict\n\nData addresses of the tensors this thread's last forward / scaled_dot_product_attention call handed\n"
      "to the library and got back (for the zero-copy test).");
}
