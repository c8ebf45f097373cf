// python/src/parameters.hpp: a module's parameters from Python, for any
// module with a parameter table (for_each_parameter over its Config and
// Parameters<double>: MultiheadAttention, GroupedQueryAttention). The
// binding keeps a double master copy (float32 values for a float32 module);
// these are state_dict(), load_state_dict() and update_parameters() on it,
// written once for both modules.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <map>
#include <memory>
#include <set>
#include <string>
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

// Rounds every parameter to float32 (a float32 module holds float32 values).
template <class Config, class Params>
void round_to_float(const Config& c, Params& p) {
  for_each_parameter(c, p, [](const ParameterInfo&, Tensor<double>& t) {
    for (double& x : t.vec()) x = static_cast<double>(static_cast<float>(x));
  });
}

// A float array (any float dtype, any layout) copied to double: parameters
// are kept, so they are always copied.
inline Tensor<double> parameter_tensor(const py::handle& obj, const std::string& name) {
  HeldTensor<double> t = float_tensor<double>(obj, name);
  return Tensor<double>(t.tensor);  // a copy of the view
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

// state_dict(): copies under the table's names, in the module's dtype.
template <class Config, class Params>
py::dict state_dict_of(const Config& c, Params p, Precision dtype) {
  py::dict d;
  for (auto& [n, slot] : present_parameters(c, p)) {
    if (dtype == Precision::F64) d[py::str(n)] = to_numpy(std::move(*slot));
    else d[py::str(n)] = to_numpy(tensor_cast<float>(*slot));
  }
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
    py::array a = dtype == Precision::F64 ? to_numpy(Tensor<double>(t)) : to_numpy(tensor_cast<float>(t));
    const py::object r = update(py::str(n), a);
    t = parameter_tensor(r.is_none() ? py::object(a) : r, n);
  }
  if (dtype == Precision::F32) round_to_float(c, p);
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
    *slot->second = parameter_tensor(kv[1], name);
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
  if (dtype == Precision::F32) round_to_float(c, p);
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

}  // namespace multihead::python
