// python/src/bindings.hpp: what every part of the binding shares (module.cpp,
// gqa.cpp, train.cpp): the dtype= argument, and the docstrings generated
// from options.hpp's rows (DocBuilder and the row macros).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>
#include <type_traits>
#include <utility>

#include "arrays.hpp"

namespace multihead::python {

namespace py = pybind11;

// A file argument: a str, bytes or os.PathLike (pathlib.Path), as open()
// takes one, in the file system's encoding (os.fsencode). Converts to the
// std::string the library's readers and writers take.
struct PathArg {
  std::string value;
  operator const std::string&() const { return value; }
};

}  // namespace multihead::python

namespace pybind11::detail {

template <>
struct type_caster<multihead::python::PathArg> {
  PYBIND11_TYPE_CASTER(multihead::python::PathArg, const_name("Union[str, bytes, os.PathLike[str]]"));

  bool load(handle src, bool) {
    object path = reinterpret_steal<object>(PyOS_FSPath(src.ptr()));  // str or bytes, else TypeError
    if (!path) {
      PyErr_Clear();
      return false;
    }
    object bytes = PyBytes_Check(path.ptr()) ? path : reinterpret_steal<object>(PyUnicode_EncodeFSDefault(path.ptr()));
    if (!bytes) {
      PyErr_Clear();
      return false;
    }
    value.value.assign(PyBytes_AS_STRING(bytes.ptr()), static_cast<std::size_t>(PyBytes_GET_SIZE(bytes.ptr())));
    // open() refuses one too: the C library would read the path only up to it.
    if (value.value.find('\0') != std::string::npos) throw value_error("path: embedded null byte");
    return true;
  }

  static handle cast(const multihead::python::PathArg& p, return_value_policy, handle) {
    return PyUnicode_DecodeFSDefaultAndSize(p.value.data(), static_cast<Py_ssize_t>(p.value.size()));
  }
};

}  // namespace pybind11::detail

namespace multihead::python {

// dtype=None | "float32" | "float64" | numpy.float32 | numpy.dtype(...), and
// where `narrow` names the call (MultiheadAttention, load_weights,
// scaled_dot_product_attention) also "bfloat16" / "bf16" and "float16" /
// "f16" / numpy.float16: the 16-bit computations. Elsewhere a 16-bit dtype
// is a TypeError saying where they are.
inline Precision parse_dtype(const py::object& dtype, bool narrow = false) {
  if (dtype.is_none()) return Precision::F32;
  Precision p;
  if (py::isinstance<py::str>(dtype) && (dtype.cast<std::string>() == "bfloat16" || dtype.cast<std::string>() == "bf16")) {
    p = Precision::BF16;
  } else if (py::isinstance<py::str>(dtype) && dtype.cast<std::string>() == "f16") {
    p = Precision::F16;
  } else {
    py::dtype d;
    try {
      d = py::dtype::from_args(dtype);
    } catch (py::error_already_set&) {
      throw py::type_error(std::string("dtype: expected float32 or float64") +
                           (narrow ? ", 'bfloat16' or 'float16'" : "") + ", got " + py::repr(dtype).cast<std::string>());
    }
    if (d.kind() == 'f' && d.itemsize() == 4) return Precision::F32;
    if (d.kind() == 'f' && d.itemsize() == 8) return Precision::F64;
    if (!(d.kind() == 'f' && d.itemsize() == 2))
      throw py::type_error(std::string("dtype: expected float32 or float64") + (narrow ? ", 'bfloat16' or 'float16'" : "") +
                           ", got " + py::str(py::handle(d)).cast<std::string>());
    p = Precision::F16;
  }
  if (!narrow)
    throw py::type_error(std::string("dtype: expected float32 or float64 here, got ") + dtype_str(p) +
                         " (16-bit computations are MultiheadAttention's and scaled_dot_product_attention's)");
  return p;
}

// A default as the Python object pybind11 makes of it.
template <class T>
py::object as_python(const T& value) {
  if constexpr (std::is_base_of_v<py::handle, T>) {
    return py::reinterpret_borrow<py::object>(value);
  } else {
    return py::cast(value);
  }
}

// A docstring's signature line, "name(query, key, value, a=1, *, b='x')", and
// its "    a: ..." entries (wrapped at 79 columns), from the rows: each
// default is the repr of the call struct's member, as pybind11 shows it.
class DocBuilder {
 public:
  explicit DocBuilder(const std::string& function) : line_(function + "(") {}
  void required(const char* name) { separate() += name; }
  void keyword_only() { separate() += "*"; }
  // With a doc, also an entry of the current section (positional or keyword-only).
  void add(const char* name, const py::object& default_value, const char* doc) {
    separate() += std::string(name) + "=" + py::repr(default_value).cast<std::string>();
    if (doc) entries_ += wrap_entry(name, doc);
    names_ += (names_.empty() ? "" : ", ") + std::string(name);
  }
  std::string line() const { return line_ + ")"; }
  // The entries added since the last call, and the names among them.
  std::string take_entries() { return std::exchange(entries_, {}); }
  std::string take_names() { return std::exchange(names_, {}); }
  // "    name: doc" wrapped at 79 columns, continued 8 columns in.
  static std::string wrap_entry(const std::string& name, const std::string& doc) {
    const std::string text = name + ": " + doc;
    std::string out, row = "   ";
    std::size_t i = 0;
    while (i < text.size()) {
      std::size_t j = text.find(' ', i);
      if (j == std::string::npos) j = text.size();
      const std::string word = text.substr(i, j - i);
      if (row.size() > 8 && row.size() + 1 + word.size() > 79) {
        out += row + "\n";
        row = "       ";
      }
      row += " " + word;
      i = j + 1;
    }
    return out + row + "\n";
  }

 private:
  std::string& separate() {
    if (line_.back() != '(') line_ += ", ";
    return line_;
  }
  std::string line_, entries_, names_;
};

// Runs a library backward (fn) with the GIL released (the library's
// messages name its context argument `context`, as the bindings do).
template <class Fn>
auto backward_without_gil(Fn&& fn) {
  py::gil_scoped_release nogil;
  return fn();
}

// The parts of the module defined in their own files (called from
// module.cpp's PYBIND11_MODULE).
void bind_grouped_query_attention(py::module_& m);
void bind_trainer(py::module_& m);

}  // namespace multihead::python

// A row as a parameter of a bound lambda, as its py::arg (the default read
// from the call struct `d`), stored into the call struct `c`, and in the
// docstring (DocBuilder `b`; _SIG: the signature only).
#define MULTIHEAD_PY_PARAM(Type, name, def, into, doc) , Type name
#define MULTIHEAD_PY_ARG(Type, name, def, into, doc) , py::arg(#name) = d.name
#define MULTIHEAD_PY_STORE(Type, name, def, into, doc) c.name = std::move(name);
#define MULTIHEAD_PY_DOC(Type, name, def, into, doc) b.add(#name, as_python(d.name), doc);
#define MULTIHEAD_PY_SIG(Type, name, def, into, doc) b.add(#name, as_python(d.name), nullptr);
