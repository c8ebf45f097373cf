// python/src/arrays.hpp: NumPy arrays in and out of the library.
//
// In: anything np.asarray accepts (NumPy arrays, the buffer protocol, the
// array protocol, so CPU torch tensors too). A C-contiguous array of the
// computation's dtype (float32 or float64) becomes a Tensor::view of its own
// buffer: no copy. Anything else (another float dtype, a non-contiguous
// view, a byte-swapped array) is converted once, by NumPy, into a fresh
// C-contiguous array of that dtype. Read-only arrays are viewed as they are:
// the library only reads its inputs. Integer, complex and object arrays are
// a TypeError, as in PyTorch.
//
// The Held* structs keep the (possibly converted) array referenced while its
// view is in use, also while the GIL is released.
//
// Out: a result Tensor moves to the heap and a NumPy array views it, owned
// by a capsule, so outputs are not copied either.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "multihead/attention.hpp"
#include "multihead/error.hpp"
#include "multihead/narrow.hpp"
#include "multihead/narrow_multihead_attention.hpp"
#include "multihead/tensor.hpp"

namespace multihead::python {

namespace py = pybind11;

// "float32", "int64", "bool": NumPy's name of the array's dtype.
inline std::string dtype_name(const py::array& a) { return py::str(py::handle(a.dtype())).cast<std::string>(); }

inline bool is_float(const py::array& a) { return a.dtype().kind() == 'f'; }

// numpy.asarray, looked up once. Deliberately never freed: a static
// py::object would be released after the interpreter has finalised, without
// the GIL, which aborts the process at exit.
inline const py::object& numpy_asarray() {
  static const py::object* f = new py::object(py::module_::import("numpy").attr("asarray"));
  return *f;
}

// "<class 'list'>": an object's type, for messages.
inline std::string type_name(const py::handle& obj) { return py::str(py::type::of(obj)).cast<std::string>(); }

// np.asarray(obj), without a call when obj is already an ndarray. Where
// np.asarray refuses obj (a torch tensor that requires grad, a torch
// bfloat16 tensor, a ragged list), one TypeError naming the argument, with
// the refusal's type and the first line of its reason; MemoryError and
// anything that is not an Exception (KeyboardInterrupt, SystemExit) pass
// as they are.
inline py::array as_numpy(const py::handle& obj, const std::string& name) {
  if (py::isinstance<py::array>(obj)) return py::reinterpret_borrow<py::array>(obj);
  try {
    return numpy_asarray()(obj).cast<py::array>();
  } catch (py::error_already_set& e) {
    // Only an ordinary refusal (an Exception, not MemoryError; never
    // KeyboardInterrupt or SystemExit) is said this way.
    if (!e.matches(PyExc_Exception) || e.matches(PyExc_MemoryError)) throw;
    // The reason's first line, its bytes as UTF-8 with anything else
    // backslash-escaped (a message may hold a lone surrogate), else none.
    std::string why;
    if (PyObject* text = PyObject_Str(e.value().ptr())) {
      if (PyObject* bytes = PyUnicode_AsEncodedString(text, "utf-8", "backslashreplace")) {
        why.assign(PyBytes_AS_STRING(bytes), static_cast<std::size_t>(PyBytes_GET_SIZE(bytes)));
        Py_DECREF(bytes);
      }
      Py_DECREF(text);
    }
    PyErr_Clear();
    why = why.substr(0, why.find('\n'));
    const std::string error = py::str(e.type().attr("__name__")).cast<std::string>();
    const std::string type = py::str(py::type::of(obj).attr("__name__")).cast<std::string>();
    throw py::type_error(name + ": expected an array (anything np.asarray takes), got " + type +
                         ", which np.asarray refused (" + error + ": " + quote_input(why, 160) + ")");
  }
}

// The dtype a call computes in. From its query: float64 stays float64, every
// other float (float32, float16, longdouble) computes in float32. BF16 and
// F16 only where the dtype is named (a module's dtype=, or
// scaled_dot_product_attention's dtype=): NumPy has no bfloat16.
enum class Precision { F32, F64, BF16, F16 };

inline bool is_narrow(Precision p) { return p == Precision::BF16 || p == Precision::F16; }

// NumPy's names (bfloat16 is not one: ml_dtypes' spelling).
inline const char* dtype_str(Precision p) {
  switch (p) {
    case Precision::F64: return "float64";
    case Precision::BF16: return "bfloat16";
    case Precision::F16: return "float16";
    default: return "float32";
  }
}

// A uint16 array passed where no 16-bit dtype is named: ValueError saying
// how to name it (its bits could be either 16-bit type).
inline void refuse_unnamed_bits(const py::array& a, const std::string& name) {
  if (a.dtype().kind() == 'u' && a.dtype().itemsize() == 2)
    throw Error(Error::Kind::Value, name + ": a uint16 array is read as 16-bit float bits only where the dtype is "
                                           "named (a module made with dtype='bfloat16' or 'float16', or "
                                           "scaled_dot_product_attention(..., dtype='bfloat16')); this call "
                                           "computes in float32/float64 and expected a floating-point array, got uint16");
}

inline Precision precision_of(const py::array& query, const std::string& name) {
  refuse_unnamed_bits(query, name);
  if (!is_float(query))
    throw py::type_error(name + ": expected a floating-point array (float32 or float64), got " +
                         dtype_name(query));
  return query.dtype().itemsize() == 8 ? Precision::F64 : Precision::F32;
}

inline std::string shape_of(const py::array& a) {
  return shape_to_string(Shape(a.shape(), a.shape() + a.ndim()));
}

// `a` itself when it is already C-contiguous of dtype T, else NumPy's
// converted copy (np.asarray(a, dtype=T, order="C")). A copy too large to
// allocate (a broadcast view claiming 2^40 rows) is a ValueError naming the
// array, like every other bad input.
template <class T>
py::array_t<T> c_contiguous(const py::array& a, const std::string& name) {
  if (py::array_t<T, py::array::c_style>::check_(a)) return py::reinterpret_borrow<py::array_t<T>>(a);
  try {
    return numpy_asarray()(a, py::dtype::of<T>(), py::arg("order") = "C").template cast<py::array_t<T>>();
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_MemoryError)) throw;
    throw Error(Error::Kind::Shape, name + ": a " + shape_of(a) + " " + dtype_name(a) +
                                        " array that is not C-contiguous " + py::str(py::handle(py::dtype::of<T>())).cast<std::string>() +
                                        " must be copied, and a copy of that size cannot be allocated");
  }
}

template <class T>
struct HeldTensor {
  py::array array;  // the memory `tensor` views
  Tensor<T> tensor;
};

// A float array as a Tensor<T> view: the array's own buffer when it is
// already C-contiguous T (no copy), else a converted copy.
template <class T>
HeldTensor<T> float_tensor(const py::handle& obj, const std::string& name) {
  py::array a = as_numpy(obj, name);
  refuse_unnamed_bits(a, name);
  if (!is_float(a))
    throw py::type_error(name + ": expected a floating-point array (float32 or float64), got " + dtype_name(a));
  py::array_t<T> c = c_contiguous<T>(a, name);
  Shape shape(c.shape(), c.shape() + c.ndim());
  // const_cast: a read-only array is only ever read (views are passed as
  // const Tensor&).
  Tensor<T> t = Tensor<T>::view(std::move(shape), const_cast<T*>(c.data()));
  return {std::move(c), std::move(t)};
}

// A second view of `h`'s buffer (the same argument passed twice, as key and
// query are in self-attention: converted once, and one address, so forward()
// takes its packed self-attention path).
template <class T>
HeldTensor<T> alias(const HeldTensor<T>& h) {
  return {h.array, Tensor<T>::view(h.tensor.shape(), const_cast<T*>(h.tensor.data()))};
}

template <class T>
struct HeldMask {
  py::array array;
  std::optional<Mask<T>> mask;
  const Mask<T>* get() const { return mask ? &*mask : nullptr; }
};

// A mask argument: None; bool or uint8 (a boolean mask, True = may NOT
// attend, viewed in place: NumPy's bool is one byte holding 0 or 1); or float
// (added to the scores, in the computation's dtype). `invert` flips a
// boolean mask (torch's scaled_dot_product_attention, where True means "may
// attend"); that costs one uint8 copy.
template <class T>
HeldMask<T> mask_arg(const py::handle& obj, const std::string& name, bool invert = false) {
  HeldMask<T> r;
  if (obj.is_none()) return r;
  py::array a = as_numpy(obj, name);
  const char kind = a.dtype().kind();
  if (kind == 'b' || (kind == 'u' && a.dtype().itemsize() == 1)) {
    py::array_t<uint8_t> c = c_contiguous<uint8_t>(kind == 'b' ? a.view("uint8") : a, name);
    Shape shape(c.shape(), c.shape() + c.ndim());
    Tensor<uint8_t> t = Tensor<uint8_t>::view(shape, const_cast<uint8_t*>(c.data()));
    if (invert) {
      Tensor<uint8_t> flipped(shape);
      for (int64_t i = 0; i < flipped.numel(); ++i) flipped[i] = t[i] ? 0 : 1;
      t = std::move(flipped);
    }
    r.array = std::move(c);
    r.mask = Mask<T>::boolean(std::move(t));
    return r;
  }
  if (kind == 'f') {
    HeldTensor<T> f = float_tensor<T>(a, name);
    r.array = std::move(f.array);
    r.mask = Mask<T>::additive(std::move(f.tensor));
    return r;
  }
  throw py::type_error(name + ": expected a bool or floating-point array, got " + dtype_name(a));
}

// A result tensor as a NumPy array that owns it: no copy.
template <class T>
py::array to_numpy(Tensor<T>&& t) {
  std::vector<py::ssize_t> shape(t.shape().begin(), t.shape().end());
  if (t.numel() == 0) return py::array_t<T>(shape);
  auto heap = std::make_unique<Tensor<T>>(std::move(t));
  T* data = heap->data();
  py::capsule owner(heap.get(), [](void* p) { delete static_cast<Tensor<T>*>(p); });
  heap.release();  // the capsule owns it now
  return py::array_t<T>(shape, data, owner);
}

// ---- 16-bit arrays (bfloat16, float16) ----------------------------------------
// NumPy has no bfloat16. A 16-bit input is one of (its "kind", which the
// result keeps: the output of a call is the same kind as its query):
//   Bits     a uint16 array holding the bits of E, read in place when
//            C-contiguous (the 16-bit type named by the call's dtype);
//   Half     a numpy.float16 array, for E = float16 only: IEEE binary16 is
//            NumPy's float16, so its bytes are the bits, read in place;
//   Float32  a float32 array, rounded to E on the way in (round_to, the one
//            rule of multihead/narrow.hpp: nearest, ties to even; NaN stays
//            NaN, beyond the largest finite value gives inf). Its result
//            comes back widened to float32 (exact).
// Anything else (float64, another integer type) is a ValueError naming the
// argument: a float64 array would be rounded twice, and silently losing
// 45 bits is not what dtype='bfloat16' should do.
enum class NarrowKind { Bits, Half, Float32 };

template <class E>
constexpr Precision precision_of_narrow() {
  return std::is_same_v<E, bfloat16> ? Precision::BF16 : Precision::F16;
}

template <class E>
struct HeldNarrow {
  py::array array;  // the memory `tensor` views (Bits, Half), or none (Float32: rounded into its own)
  Tensor<E> tensor;
  NarrowKind kind = NarrowKind::Bits;
};

template <class E>
HeldNarrow<E> narrow_tensor(const py::handle& obj, const std::string& name) {
  static_assert(sizeof(E) == sizeof(uint16_t) && alignof(E) == alignof(uint16_t));
  const std::string type = dtype_str(precision_of_narrow<E>());
  py::array a = as_numpy(obj, name);
  const char kind = a.dtype().kind();
  const auto itemsize = a.dtype().itemsize();
  HeldNarrow<E> r;
  if ((kind == 'u' && itemsize == 2) || (kind == 'f' && itemsize == 2 && std::is_same_v<E, float16>)) {
    // The same two bytes either way; viewed as uint16 (a view, no copy).
    py::array_t<uint16_t> c = c_contiguous<uint16_t>(kind == 'f' ? a.view("uint16") : a, name);
    Shape shape(c.shape(), c.shape() + c.ndim());
    r.tensor = Tensor<E>::view(std::move(shape), reinterpret_cast<E*>(const_cast<uint16_t*>(c.data())));
    r.array = std::move(c);
    r.kind = kind == 'f' ? NarrowKind::Half : NarrowKind::Bits;
    return r;
  }
  if (kind == 'f' && itemsize == 4) {
    HeldTensor<float> f = float_tensor<float>(a, name);
    r.tensor = round_to<E>(f.tensor);
    r.kind = NarrowKind::Float32;
    return r;
  }
  throw Error(Error::Kind::Value, name + ": a " + type + " computation takes a uint16 array of " + type +
                                      " bits" + (std::is_same_v<E, float16> ? ", a float16 array" : "") +
                                      " or a float32 array (rounded to nearest even), got " + dtype_name(a));
}

// A second view of `h`'s memory (query passed again as key / value).
template <class E>
HeldNarrow<E> alias(const HeldNarrow<E>& h) {
  return {h.array, Tensor<E>::view(h.tensor.shape(), const_cast<E*>(h.tensor.data())), h.kind};
}

// A 16-bit result as the given kind: Bits a uint16 array and Half a float16
// array over the tensor's own memory (no copy), Float32 widened (exact).
template <class E>
py::array narrow_to_numpy(Tensor<E>&& t, NarrowKind kind) {
  if (kind == NarrowKind::Float32) return to_numpy(widen<float>(t));
  const py::dtype dt(kind == NarrowKind::Half ? "float16" : "uint16");
  std::vector<py::ssize_t> shape(t.shape().begin(), t.shape().end());
  if (t.numel() == 0) return py::array(dt, shape);
  auto heap = std::make_unique<Tensor<E>>(std::move(t));
  void* data = heap->data();
  py::capsule owner(heap.get(), [](void* p) { delete static_cast<Tensor<E>*>(p); });
  heap.release();  // the capsule owns it now
  return py::array(dt, shape, data, owner);
}

// An array's data address, as the tests compare it with
// arr.__array_interface__["data"][0].
template <class T>
uintptr_t address(const Tensor<T>& t) {
  return reinterpret_cast<uintptr_t>(t.data());
}

// The data addresses of the tensors the last call on this thread handed to
// the library and got back ("query", "key", ..., "output"): the zero-copy
// test reads them through multihead._debug_last_call().
inline std::map<std::string, uintptr_t>& last_call_addresses() {
  thread_local std::map<std::string, uintptr_t> addresses;
  return addresses;
}

// Starts this thread's record anew with a call's query, key, value and output.
template <class T, class U>
void record_call(const Tensor<T>& query, const Tensor<T>& key, const Tensor<T>& value, const Tensor<U>& output) {
  auto& a = last_call_addresses();
  a.clear();
  a["query"] = address(query);
  a["key"] = address(key);
  a["value"] = address(value);
  a["output"] = address(output);
}

}  // namespace multihead::python
