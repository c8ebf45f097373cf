// python/src/parameters.hpp: a module's parameters from Python, for any
// module with a parameter table (for_each_parameter over its Config and
// Parameters<double>: MultiheadAttention, GroupedQueryAttention). The
// binding keeps a double master copy (float32 values for a float32 module,
// bfloat16 / float16 values for a 16-bit one: each exactly a double); these
// are state_dict(), load_state_dict(), update_parameters() and
// share_parameters() on it, and the computing modules built from it
// (ModuleParameters), written once for both modules.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "arrays.hpp"
#include "multihead/error.hpp"
#include "multihead/parameter_table.hpp"
#include "multihead/tensor.hpp"

namespace multihead::python {

namespace py = pybind11;

// The parameters this configuration has (the present rows of the table),
// in state_dict order.
template <class Config, class Params>
std::vector<std::pair<std::string, Tensor<double>*>> present_parameters(const Config& c, Params& p) {
  std::vector<std::pair<std::string, Tensor<double>*>> rows;
  for_each_parameter(c, p, [&](const ParameterInfo& info, Tensor<double>& t) {
    if (info.present) rows.emplace_back(info.name, &t);
  });
  return rows;
}

template <class Config>
std::vector<std::string> expected_names(const Config& c) {
  std::vector<std::string> names;
  for_each_parameter(c, [&](const ParameterInfo& info) {
    if (info.present) names.emplace_back(info.name);
  });
  return names;
}

// One master value rounded to what a module of `dtype` stores: float32, or
// bfloat16 / float16 through float32 (as torch's .to(bfloat16) of a float64
// tensor), by narrow.hpp's one rule.
inline double stored_value(double x, Precision dtype) {
  const float f = static_cast<float>(x);
  switch (dtype) {
    case Precision::F64: return x;
    case Precision::BF16: return static_cast<double>(to_float(narrow_from_float<bfloat16>(f)));
    case Precision::F16: return static_cast<double>(to_float(narrow_from_float<float16>(f)));
    default: return static_cast<double>(f);
  }
}

// Rounds every parameter to what a module of `dtype` stores.
template <class Config, class Params>
void round_to_storage(const Config& c, Params& p, Precision dtype) {
  if (dtype == Precision::F64) return;
  for_each_parameter(c, p, [dtype](const ParameterInfo&, Tensor<double>& t) {
    for (double& x : t.vec()) x = stored_value(x, dtype);
  });
}

// A parameter from Python, copied to double: parameters are kept, so they
// are always copied. A float32/float64 module takes any float array; a
// 16-bit module what its inputs take (arrays.hpp's narrow_tensor: uint16
// bits, float16 for a float16 module, or float32 rounded).
inline Tensor<double> parameter_tensor(const py::handle& obj, const std::string& name, Precision dtype) {
  if (dtype == Precision::BF16) return widen<double>(narrow_tensor<bfloat16>(obj, name).tensor);
  if (dtype == Precision::F16) return widen<double>(narrow_tensor<float16>(obj, name).tensor);
  HeldTensor<double> t = float_tensor<double>(obj, name);
  return Tensor<double>(t.tensor);  // a copy of the view
}

// A master parameter as the array the module hands out: float64, float32, or
// for a 16-bit module its bits as uint16 (a numpy.float16 array is not
// used even for float16, so that both 16-bit types read alike).
inline py::array parameter_array(const Tensor<double>& t, Precision dtype) {
  switch (dtype) {
    case Precision::F64: return to_numpy(Tensor<double>(t));
    case Precision::BF16: return narrow_to_numpy(round_to<bfloat16>(tensor_cast<float>(t)), NarrowKind::Bits);
    case Precision::F16: return narrow_to_numpy(round_to<float16>(tensor_cast<float>(t)), NarrowKind::Bits);
    default: return to_numpy(tensor_cast<float>(t));
  }
}

// The master parameters as ToParams (float or double), for the computing
// module of that dtype (or, back, a computing module's as the master copy).
template <class ToParams, class Config, class Params>
ToParams cast_parameters_to(const Config& c, const Params& p) {
  ToParams out;
  for_each_parameter(c, out, p, [](const ParameterInfo& info, auto& to, const auto& from) {
    using T = typename std::decay_t<decltype(to)>::value_type;
    if (info.present) to = tensor_cast<T>(from);
  });
  return out;
}

// state_dict(): copies under the table's names, in the module's dtype
// (parameter_array).
template <class Config, class Params>
py::dict state_dict_of(const Config& c, Params p, Precision dtype) {
  py::dict d;
  for (auto& [n, slot] : present_parameters(c, p)) d[py::str(n)] = parameter_array(*slot, dtype);
  return d;
}

// update_parameters(update): update(name, array) for every parameter, on a
// copy in the module's dtype; it either changes the array in place and
// returns None, or returns the new values. Returns the new master copy
// (rounded to float32 for a float32 module), which the caller validates.
template <class Config, class Params>
Params updated_parameters(const Config& c, const Params& current, Precision dtype, const py::object& update) {
  if (!PyCallable_Check(update.ptr()))
    throw py::type_error("update: expected a callable update(name, array), got " +
                         py::str(py::type::of(update)).cast<std::string>());
  Params p = current;
  for (auto& [n, slot] : present_parameters(c, p)) {
    Tensor<double>& t = *slot;
    py::array a = parameter_array(t, dtype);
    const py::object r = update(py::str(n), a);
    t = parameter_tensor(r.is_none() ? py::object(a) : r, n, dtype);
  }
  round_to_storage(c, p, dtype);
  return p;
}

// load_state_dict(state_dict, strict): the new master copy (the caller
// validates the shapes) and (missing_keys, unexpected_keys), as torch's
// _IncompatibleKeys; with strict, either list non-empty is a ValueError
// worded as torch's ("Error(s) in loading state_dict for <module>: ...").
template <class Config, class Params>
std::pair<Params, py::tuple> loaded_parameters(const Config& c, const Params& current, Precision dtype,
                                               const py::object& state_dict, bool strict, const std::string& module) {
  if (!py::hasattr(state_dict, "items"))
    throw py::type_error("state_dict: expected a mapping of names to arrays, got " +
                         py::str(py::type::of(state_dict)).cast<std::string>());
  Params p = current;
  const std::vector<std::pair<std::string, Tensor<double>*>> rows = present_parameters(c, p);
  const std::map<std::string, Tensor<double>*> want(rows.begin(), rows.end());
  std::set<std::string> seen;
  std::vector<std::string> unexpected, missing;
  for (const py::handle item : state_dict.attr("items")()) {
    const py::tuple kv = py::reinterpret_borrow<py::object>(item).cast<py::tuple>();
    const std::string name = py::str(kv[0]).cast<std::string>();
    const auto slot = want.find(name);
    if (slot == want.end()) {
      unexpected.push_back(name);
      continue;
    }
    seen.insert(name);
    *slot->second = parameter_tensor(kv[1], name, dtype);
  }
  for (const auto& [n, slot] : rows)
    if (!seen.count(n)) missing.push_back(n);
  if (strict && (!missing.empty() || !unexpected.empty())) {
    std::string msg = "Error(s) in loading state_dict for " + module + ":";
    auto list = [&](const char* what, const std::vector<std::string>& names) {
      if (names.empty()) return;
      msg += std::string(" ") + what + " key(s):";
      for (std::size_t i = 0; i < names.size(); ++i) msg += (i ? ", \"" : " \"") + names[i] + "\"";
      msg += ".";
    };
    list("Missing", missing);
    list("Unexpected", unexpected);
    throw Error(Error::Kind::Missing, msg);
  }
  round_to_storage(c, p, dtype);
  return {std::move(p), py::make_tuple(missing, unexpected)};
}

// share_parameters(arrays): the module's parameters as views of the
// arrays' own memory (no copy), each present row required as a C-contiguous
// array of dtype T and of the row's shape (TypeError / ValueError naming it);
// the arrays are appended to `held`, which keeps them alive.
template <class T, class ToParams, class Config>
ToParams shared_parameters(const Config& c, const py::object& arrays, std::vector<py::array>& held) {
  if (!py::isinstance<py::dict>(arrays))
    throw py::type_error("arrays: expected a dict of names to arrays, got " +
                         py::str(py::type::of(arrays)).cast<std::string>());
  const py::dict d = arrays.cast<py::dict>();
  ToParams out;
  std::size_t used = 0;
  for_each_parameter(c, out, [&](const ParameterInfo& info, Tensor<T>& slot) {
    if (!info.present) return;
    if (!d.contains(info.name))
      throw Error(Error::Kind::Missing, std::string(info.name) + ": missing from arrays (share_parameters needs every parameter)");
    ++used;
    const py::object obj = d[info.name];
    if (!py::isinstance<py::array>(obj))
      throw py::type_error(std::string(info.name) + ": expected a NumPy array, got " +
                           py::str(py::type::of(obj)).cast<std::string>());
    const py::array a = obj.cast<py::array>();
    if (!py::array_t<T, py::array::c_style>::check_(a))
      throw py::type_error(std::string(info.name) + ": expected a C-contiguous " + (sizeof(T) == 8 ? "float64" : "float32") +
                           " array (the module's dtype; shared, not copied), got a " + dtype_name(a) +
                           (a.flags() & py::array::c_style ? "" : " non-contiguous") + " array");
    const Shape shape(a.shape(), a.shape() + a.ndim());
    if (shape != info.shape)
      throw Error(Error::Kind::Shape, std::string(info.name) + ": expected shape " + shape_to_string(info.shape) +
                                          ", got " + shape_to_string(shape));
    slot = Tensor<T>::view(shape, const_cast<T*>(static_cast<const T*>(a.data())));
    held.push_back(a);
  });
  if (used != d.size())
    for (const auto& kv : d) {
      const std::string n = py::str(kv.first).cast<std::string>();
      bool known = false;
      for_each_parameter(c, [&](const ParameterInfo& info) { known = known || (info.present && n == info.name); });
      if (!known) throw Error(Error::Kind::Value, n + ": not a parameter of this module (unexpected in arrays)");
    }
  return out;
}

// The computing module over shared views (shared_parameters), owning with
// it the arrays they view: a thread still computing with it after the
// module was shared anew keeps them alive. Its last reference goes with the
// GIL held (each call drops its module after taking the GIL back).
template <class Module, class Config, class Params>
std::shared_ptr<const Module> module_over(const Config& c, Params p, std::vector<py::array> held) {
  auto owner = std::make_shared<std::vector<py::array>>(std::move(held));
  return std::shared_ptr<const Module>(new Module(c, std::move(p)), [owner](const Module* m) { delete m; });
}

// What a module binding keeps of its parameters, written once for
// MultiheadAttention and GroupedQueryAttention: the configuration, the
// dtype, the double master copy, the arrays share_parameters() views, and
// the float32 / float64 computing modules built from the master copy on
// first use. Traits gives the module's types and its check:
//   using Config = ...;  template <class T> using Params = ...;
//   template <class T> using Module = ...;  static constexpr const char* name;
//   static void validate(const Config&, const Params<double>&);  // throws naming the parameter
// A derived class with more computing modules (the 16-bit ones) drops them
// in modules_changed(), called whenever the master copy changes.
template <class Traits>
class ModuleParameters {
 public:
  using Config = typename Traits::Config;
  template <class T>
  using Params = typename Traits::template Params<T>;
  template <class T>
  using Module = typename Traits::template Module<T>;

  ModuleParameters(const Config& config, Params<double> params, Precision dtype)
      : config_(config), dtype_(dtype), params_(std::move(params)) {
    round_to_storage(config_, params_, dtype_);
    Traits::validate(config_, params_);
  }
  virtual ~ModuleParameters() = default;
  ModuleParameters(ModuleParameters&&) noexcept = default;
  ModuleParameters& operator=(ModuleParameters&&) noexcept = default;

  const Config& config() const { return config_; }
  Precision dtype() const { return dtype_; }

  // update(name, array) for every parameter (state_dict's names and order),
  // on a copy in the module's dtype; then the module takes them all, as
  // load_state_dict does (shapes checked; the computing modules rebuilt, so
  // earlier contexts are refused by backward()).
  void update_parameters(const py::object& update) {
    sync_shared();
    take(updated_parameters(config_, params_, dtype_, update));
  }
  py::dict state_dict() {
    if (!shared_.empty()) master_from_shared();
    return state_dict_of(config_, params_, dtype_);
  }
  // Returns (missing_keys, unexpected_keys), as torch's _IncompatibleKeys.
  py::tuple load_state_dict(const py::object& state_dict, bool strict) {
    sync_shared();
    auto [p, keys] = loaded_parameters(config_, params_, dtype_, state_dict, strict, Traits::name);
    take(std::move(p));
    return keys;
  }

  // share_parameters(arrays): the computing module of the module's dtype
  // reads its parameters from the arrays' memory at every call (no copy);
  // their changes in place are seen by the next call. The other dtype's
  // module (a float64 input to a float32 module) is built from the master
  // copy, brought up to date first. update_parameters and load_state_dict
  // end the sharing.
  void share_parameters(const py::object& arrays) {
    if (is_narrow(dtype_))
      throw Error(Error::Kind::Value, std::string("share_parameters: a ") + dtype_str(dtype_) + " " + Traits::name +
                                          " keeps its own parameters (load_state_dict, update_parameters); "
                                          "sharing is for float32/float64 modules");
    std::vector<py::array> held;
    if (dtype_ == Precision::F64) {
      auto p = shared_parameters<double, Params<double>>(config_, arrays, held);
      f64_ = module_over<Module<double>>(config_, std::move(p), held);
      f32_.reset();
    } else {
      auto p = shared_parameters<float, Params<float>>(config_, arrays, held);
      f32_ = module_over<Module<float>>(config_, std::move(p), held);
      f64_.reset();
    }
    shared_ = std::move(held);
  }
  bool shares_parameters() const { return !shared_.empty(); }

  // The computing module for T, built on first use from the double master
  // parameters (exact for a float32 module, whose values are float32).
  // Called with the GIL held, which serialises it.
  template <class T>
  std::shared_ptr<const Module<T>> module() {
    auto& slot = [&]() -> auto& {
      if constexpr (std::is_same_v<T, double>) return f64_;
      else return f32_;
    }();
    if (!slot) {
      if (!shared_.empty()) master_from_shared();
      slot = std::make_shared<const Module<T>>(config_, cast_parameters_to<Params<T>>(config_, params_));
    }
    return slot;
  }

 protected:
  // The master copy (its values those of the module's dtype).
  const Params<double>& master() {
    if (!shared_.empty()) master_from_shared();
    return params_;
  }
  virtual void modules_changed() {}

  Config config_;
  Precision dtype_;

 private:
  // New parameters: checked (names, shapes) before the module takes them.
  void take(Params<double> p) {
    Traits::validate(config_, p);
    params_ = std::move(p);
    f32_.reset();
    f64_.reset();
    modules_changed();
  }
  // The master copy from the shared arrays' current values.
  void master_from_shared() {
    params_ = dtype_ == Precision::F64 ? f64_->parameters()
                                       : cast_parameters_to<Params<double>>(config_, f32_->parameters());
  }
  void sync_shared() {
    if (shared_.empty()) return;
    master_from_shared();
    shared_.clear();
    f32_.reset();
    f64_.reset();
  }

  Params<double> params_;          // master copy
  std::vector<py::array> shared_;  // the arrays share_parameters() views, or empty
  std::shared_ptr<const Module<float>> f32_;
  std::shared_ptr<const Module<double>> f64_;
};

}  // namespace multihead::python
