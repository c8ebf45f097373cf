// python/src/train.cpp: multihead.Trainer, multihead.TrainedModel and
// multihead.task_batch: the small Transformer encoder of
// multihead/train.hpp, trained on a built-in task as `multihead train`
// trains it (the same settings give the same losses), checkpoints, and the
// trained model's evaluation with every layer's per-head weights.
//
// Trainer.train() releases the GIL for each step and takes it back to call
// the progress callback (which may read or save the trainer: only a
// running step makes other calls on it wait their turn, refused); an exception the callback raises (or a
// KeyboardInterrupt between steps) stops the loop after the step that was
// running, which stays done: the trainer can go on, be saved or resumed.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "arrays.hpp"
#include "bindings.hpp"
#include "multihead/runtime.hpp"
#include "multihead/error.hpp"
#include "multihead/io.hpp"
#include "multihead/train.hpp"
#include "multihead/trained_model.hpp"
#include "options.hpp"

namespace multihead::python {
namespace {

// The task of `multihead train --task NAME [--symbols N --length L]`:
// symbols and length default to the CLI's 10 and 8 for copy and reverse,
// and are refused for the tasks with their own vocabulary and length.
std::shared_ptr<const Task> task_of(const std::string& name, std::optional<int64_t> symbols,
                                    std::optional<int64_t> length) {
  if (name == "lesson" || name == "lookup2")
    for (auto [what, v] : {std::pair{"symbols", symbols}, {"length", length}})
      if (v)
        throw Error(Error::Kind::Value, std::string(what) + ": expected None with task '" + name +
                                            "' (the task has its own vocabulary and length), got " + std::to_string(*v));
  return make_task(name, symbols.value_or(10), length.value_or(8));
}

py::dict stats_dict(const StepStats& s) {
  py::dict d;
  d["step"] = s.step;
  d["loss"] = s.loss;
  d["accuracy"] = s.accuracy;
  d["grad_norm"] = s.grad_norm;
  d["lr"] = s.lr;
  d["tokens"] = s.tokens;
  return d;
}

py::array ids_array(const std::vector<int32_t>& v, int64_t B, int64_t L) {
  py::array_t<int32_t> a({B, L});
  std::copy(v.begin(), v.end(), a.mutable_data());
  return a;
}

py::dict batch_dict(const Batch& b) {
  py::dict d;
  d["tokens"] = ids_array(b.tokens, b.batch, b.length);
  d["targets"] = ids_array(b.targets, b.batch, b.length);
  py::array_t<bool> m({b.batch, b.length});
  for (std::size_t i = 0; i < b.mask.size(); ++i) m.mutable_data()[i] = b.mask[i] != 0;
  d["mask"] = m;
  return d;
}

py::dict float_tensors(std::map<std::string, Tensor<float>> tensors) {
  py::dict d;
  for (auto& [n, t] : tensors) d[py::str(n)] = to_numpy(std::move(t));
  return d;
}

py::dict config_dict(const ModelConfig& c) {
  py::dict d;
  d["vocabulary"] = c.vocabulary;
  d["sequence_length"] = c.sequence_length;
  d["d_model"] = c.d_model;
  d["heads"] = c.heads;
  d["layers"] = c.layers;
  d["ff"] = c.ff;
  d["dropout"] = c.dropout;
  d["causal"] = c.causal;
  d["positions"] = to_string(c.positions);
  return d;
}

py::dict options_dict(const TrainOptions& o) {
  py::dict d;
  d["steps"] = o.steps;
  d["batch"] = o.batch;
  d["lr"] = o.lr;
  d["warmup"] = o.warmup;
  d["schedule"] = to_string(o.schedule);
  d["weight_decay"] = o.weight_decay;
  d["beta1"] = o.beta1;
  d["beta2"] = o.beta2;
  d["adam_eps"] = o.eps;
  d["clip"] = o.clip;
  d["seed"] = o.seed;
  d["dtype"] = to_string(o.dtype);
  d["threads"] = o.threads;
  return d;
}

// An integer array (B, L) (or (L) for one sequence) as ids; `name` is the argument.
std::vector<int32_t> id_argument(const py::handle& obj, const std::string& name, int64_t& B, int64_t& L, bool first) {
  const py::array a = as_numpy(obj, name);
  const char kind = a.dtype().kind();
  if (kind != 'i' && kind != 'u')
    throw py::type_error(name + ": expected an integer array of token ids, got " + dtype_name(a));
  if (a.ndim() != 1 && a.ndim() != 2)
    throw Error(Error::Kind::Shape, name + ": expected (B, L) or (L) token ids, got " + shape_of(a));
  const int64_t b = a.ndim() == 2 ? a.shape(0) : 1, l = a.shape(a.ndim() - 1);
  if (first) {
    B = b;
    L = l;
  } else if (b != B || l != L) {
    throw Error(Error::Kind::Shape, name + ": expected the tokens' shape (" + std::to_string(B) + ", " +
                                        std::to_string(L) + "), got " + shape_of(a));
  }
  std::vector<int32_t> out(static_cast<std::size_t>(b * l));
  // Read in the array's own signedness, so an unsigned id past INT64_MAX is
  // named as the value the caller wrote.
  auto take = [&](const auto* data) {
    for (std::size_t i = 0; i < out.size(); ++i) {
      const auto v = data[i];
      if (std::cmp_less(v, INT32_MIN) || std::cmp_greater(v, INT32_MAX))
        throw Error(Error::Kind::Value,
                    name + ": expected token ids, got " + std::to_string(v) + " at " + std::to_string(i));
      out[i] = static_cast<int32_t>(v);
    }
  };
  if (kind == 'u') take(c_contiguous<uint64_t>(a, name).data());
  else take(c_contiguous<int64_t>(a, name).data());
  return out;
}

// One call at a time on an object whose library calls run without the GIL.
class Busy {
 public:
  Busy(bool& flag, const char* what) : flag_(flag) {
    if (flag_) throw Error(Error::Kind::Value, std::string(what) + ": in use by another call (one at a time)");
    flag_ = true;
  }
  ~Busy() { flag_ = false; }
  Busy(const Busy&) = delete;
  Busy& operator=(const Busy&) = delete;

 private:
  bool& flag_;
};

class PyTrainer {
 public:
  PyTrainer(Trainer t, std::string task) : trainer_(std::make_unique<Trainer>(std::move(t))), task_(std::move(task)) {}

  static PyTrainer create(const std::string& task, std::optional<int64_t> symbols, std::optional<int64_t> length,
                          const TrainerCall& call) {
    ModelConfig m;
    TrainOptions t;
    trainer_settings(call, m, t);
    std::shared_ptr<const Task> k = task_of(task, symbols, length);
    py::gil_scoped_release nogil;
    return PyTrainer(Trainer(k, m, t), task);
  }

  // `multihead train --resume PATH [--steps N] [--threads T]`: the
  // checkpoint's settings, its task rebuilt.
  static PyTrainer resume(const PathArg& path, std::optional<int64_t> steps, int threads) {
    py::gil_scoped_release nogil;
    const CheckpointInfo ck = read_checkpoint_info(path);
    ModelConfig m = ck.model;
    TrainOptions o = ck.options;
    if (steps) o.steps = *steps;
    o.threads = threads;
    const std::shared_ptr<const Task> task = make_task(ck.task, m.vocabulary, m.sequence_length);
    m.vocabulary = 0;
    m.sequence_length = 0;
    return PyTrainer(Trainer::resume(path, task, m, o), ck.task);
  }

  py::dict train_step() {
    StepStats s;
    {
      Busy busy(busy_, "trainer");
      py::gil_scoped_release nogil;
      s = trainer_->train_step();
    }
    return stats_dict(s);
  }

  // Runs `steps` more steps (None: up to options' steps), calling
  // callback(stats) every `every` steps and after the last; a callback
  // returning False stops the loop. Returns the stats of every step run.
  py::list train(std::optional<int64_t> steps, const py::object& callback, int64_t every) {
    if (!callback.is_none() && !PyCallable_Check(callback.ptr()))
      throw py::type_error("callback: expected a callable callback(stats) or None, got " + type_name(callback));
    if (every < 1) throw Error(Error::Kind::Value, "every: expected >= 1, got " + std::to_string(every));
    const int64_t left = trainer_->options().steps - trainer_->step();
    if (steps && (*steps < 0 || *steps > left))
      throw Error(Error::Kind::Value, "steps: expected 0 to " + std::to_string(left) + " (the run's steps " +
                                          std::to_string(trainer_->options().steps) + " minus the " +
                                          std::to_string(trainer_->step()) + " done), got " + std::to_string(*steps));
    const int64_t n = steps.value_or(left);
    py::list out;
    for (int64_t i = 0; i < n; ++i) {
      // Busy only while the step runs: the callback may read or save the trainer.
      StepStats s;
      {
        Busy busy(busy_, "trainer");
        py::gil_scoped_release nogil;
        s = trainer_->train_step();
      }
      py::dict d = stats_dict(s);
      out.append(d);
      if (!callback.is_none() && ((i + 1) % every == 0 || i + 1 == n)) {
        const py::object r = callback(d);  // an exception propagates: the loop stops here
        if (r.is(py::bool_(false))) break;
      }
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    }
    return out;
  }

  int64_t step() const { return trainer().step(); }
  // The trainer for a read, refused while train() runs in another thread
  // (its step mutates the trainer with the GIL released). A read that
  // itself releases the GIL holds a Busy.
  const Trainer& trainer() const {
    if (busy_) throw Error(Error::Kind::Value, "trainer: in use by another call (one at a time)");
    return *trainer_;
  }
  const Trainer& trainer_unchecked() const { return *trainer_; }
  const std::string& task() const { return task_; }
  bool busy_ = false;

 private:
  std::unique_ptr<Trainer> trainer_;
  std::string task_;
};

py::dict evaluate(const TrainedModel& model, const py::object& tokens, const py::object& targets,
                  const py::object& mask, bool attention_weights, int threads) {
  Batch b;
  int64_t B = 0, L = 0;
  b.tokens = id_argument(tokens, "tokens", B, L, true);
  const int64_t V = model.config().vocabulary;
  b.batch = B;
  b.length = L;
  if (L != model.config().sequence_length)
    throw Error(Error::Kind::Shape, "tokens: expected (B, " + std::to_string(model.config().sequence_length) +
                                        ") (the model's sequence length), got " + shape_of(as_numpy(tokens, "tokens")));
  b.targets = targets.is_none() ? std::vector<int32_t>(b.tokens.size(), 0) : id_argument(targets, "targets", B, L, false);
  for (auto [name, ids] : {std::pair{"tokens", &b.tokens}, {"targets", &b.targets}})
    for (std::size_t i = 0; i < ids->size(); ++i)
      if ((*ids)[i] < 0 || (*ids)[i] >= V)
        throw Error(Error::Kind::Value, std::string(name) + ": expected ids in [0, " + std::to_string(V) + "), got " +
                                            std::to_string((*ids)[i]) + " at flat index " + std::to_string(i));
  if (mask.is_none()) {
    b.mask.assign(b.tokens.size(), targets.is_none() ? 0 : 1);
  } else {
    py::array m = as_numpy(mask, "mask");
    if (m.dtype().kind() != 'b')
      throw py::type_error("mask: expected a bool array (True = the position counts in the loss), got " + dtype_name(m));
    if (m.size() != B * L || (m.ndim() == 2 && (m.shape(0) != B || m.shape(1) != L)) || m.ndim() > 2)
      throw Error(Error::Kind::Shape, "mask: expected the tokens' shape (" + std::to_string(B) + ", " +
                                          std::to_string(L) + "), got " + shape_of(m));
    const py::array_t<uint8_t> c = c_contiguous<uint8_t>(m.view("uint8"), "mask");
    b.mask.assign(c.data(), c.data() + c.size());
  }
  Evaluation e;
  {
    py::gil_scoped_release nogil;
    e = model.evaluate(b, attention_weights, threads);
  }
  py::dict d;
  d["loss"] = e.count > 0 ? py::object(py::float_(e.loss)) : py::none();
  d["accuracy"] = e.count > 0 ? py::object(py::float_(e.accuracy)) : py::none();
  d["count"] = e.count;
  d["predictions"] = ids_array(e.predictions, B, L);
  d["logits"] = to_numpy(std::move(e.logits).reshaped({B, L, V}));
  py::list attention;
  for (Tensor<float>& t : e.attention) attention.append(to_numpy(std::move(t)));
  d["attention"] = attention;
  return d;
}

// "NAME(task='reverse', symbols=None, length=None, *, d_model=64, ...)" from
// the rows, and with `entries` the keyword section.
std::string trainer_signature(const char* name, bool self, bool entries) {
  const TrainerCall d;
  DocBuilder b(name);
  if (self) b.required("self");
  b.add("task", py::str("reverse"), nullptr);
  b.add("symbols", py::none(), nullptr);
  b.add("length", py::none(), nullptr);
  b.keyword_only();
  MULTIHEAD_TRAINER_KEYWORDS(MULTIHEAD_PY_DOC)
  return b.line() + (entries ? "\n\nKeyword-only:\n" + b.take_entries() : std::string());
}

const char* const kTrainerDoc = R"doc(

The small Transformer encoder of `multihead train` (embedding, positions,
pre-LN attention blocks, read-out) and its AdamW state, on a
built-in task: 'copy', 'reverse' (over `symbols` ids, sequences of
`length`; None = the CLI's 10 and 8), 'lesson' or 'lookup2' (their own
vocabulary and length: symbols and length must be None). The same settings
as the CLI's flags give the same losses, step for step. The passes compute
in `dtype` (float32 by default; bfloat16 and float16 keep float32 master
weights and moments, docs/precision.md).

    t = multihead.Trainer("reverse", d_model=32, heads=4, steps=100)
    t.train(callback=lambda s: print(s["step"], s["loss"]), every=10)
    t.save_checkpoint("run.safetensors")
    model = t.model()            # a TrainedModel

)doc";

}  // namespace

void bind_trainer(py::module_& m) {
  using namespace pybind11::literals;

  py::class_<TrainedModel>(m, "TrainedModel",
                           "A trained encoder (Trainer.model(), TrainedModel.load()) without its optimiser:\n"
                           "evaluate() on token ids with every layer's per-head weights; save().")
      .def_static(
          "load",
          [](const PathArg& path) {
            py::gil_scoped_release nogil;
            return TrainedModel::load(path);
          },
          "path"_a,
          "load(path) -> TrainedModel\n\nA model file (`multihead experiment --save-model`, TrainedModel.save) or a\n"
          "`multihead train` checkpoint (its optimiser state ignored).")
      .def_static(
          "from_bytes",
          [](const py::bytes& data, const std::string& name) {
            const std::string bytes = data;
            py::gil_scoped_release nogil;
            return TrainedModel::parse(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), name);
          },
          "data"_a, "name"_a = "bytes",
          "from_bytes(data, name='bytes') -> TrainedModel\n\nA model file's bytes (TrainedModel.serialize()); name is what errors call it.")
      .def(
          "evaluate",
          [](const TrainedModel& self, const py::object& tokens, const py::object& targets, const py::object& mask,
             bool attention_weights, int threads) { return evaluate(self, tokens, targets, mask, attention_weights, threads); },
          "tokens"_a, "targets"_a = py::none(), "mask"_a = py::none(), py::kw_only(), "attention_weights"_a = true,
          "threads"_a = 1,
          "evaluate(self, tokens, targets=None, mask=None, *, attention_weights=True, threads=1) -> dict\n\n"
          "The forward pass (no dropout, no update) on token ids (B, L) or (L), L the model's\n"
          "sequence_length. Returns {'loss', 'accuracy' (None without targets), 'count' (the\n"
          "positions counted: mask, default all with targets), 'predictions' (B, L) int32 argmax,\n"
          "'logits' (B, L, V) float32, 'attention': per layer (B, H, L, L) float32, each row a\n"
          "softmax summing to 1 (empty with attention_weights=False)}. The GIL is released.")
      .def(
          "serialize",
          [](const TrainedModel& self, const std::map<std::string, std::string>& metadata) {
            return py::bytes(self.serialize(metadata));
          },
          "metadata"_a = std::map<std::string, std::string>{},
          "serialize(self, metadata={}) -> bytes\n\nThe model file's bytes, `metadata` added to its __metadata__.")
      .def(
          "save",
          [](const TrainedModel& self, const PathArg& path, const std::map<std::string, std::string>& metadata) {
            const std::string bytes = self.serialize(metadata);
            py::gil_scoped_release nogil;
            write_file_atomic(path, bytes);
          },
          "path"_a, "metadata"_a = std::map<std::string, std::string>{},
          "save(self, path, metadata={}) -> None\n\nWrites the model file (atomic), `metadata` added to its __metadata__.")
      .def("parameters", [](const TrainedModel& self) { return float_tensors(self.parameters()); },
           "parameters(self) -> dict\n\nThe parameters under PyTorch's names (train.hpp), float32 copies.")
      .def_property_readonly("config", [](const TrainedModel& self) { return config_dict(self.config()); },
                             "The model configuration, a dict (vocabulary, sequence_length, d_model, ...).")
      .def_property_readonly("task", &TrainedModel::task)
      .def_property_readonly("metadata", &TrainedModel::metadata)
      .def_property_readonly("parameter_count", &TrainedModel::parameter_count);

  static const std::string class_doc = trainer_signature("Trainer", false, false) + kTrainerDoc;
  static const std::string init_doc = trainer_signature("__init__", true, true);
  py::class_<PyTrainer> t(m, "Trainer", class_doc.c_str());
  {
    const TrainerCall d;
    t.def(py::init([](const std::string& task, std::optional<int64_t> symbols,
                      std::optional<int64_t> length MULTIHEAD_TRAINER_KEYWORDS(MULTIHEAD_PY_PARAM)) {
            TrainerCall c;
            MULTIHEAD_TRAINER_KEYWORDS(MULTIHEAD_PY_STORE)
            return PyTrainer::create(task, symbols, length, c);
          }),
          "task"_a = "reverse", "symbols"_a = py::none(), "length"_a = py::none(),
          py::kw_only() MULTIHEAD_TRAINER_KEYWORDS(MULTIHEAD_PY_ARG), init_doc.c_str());
  }
  t.def_static("resume", &PyTrainer::resume, "path"_a, "steps"_a = py::none(), "threads"_a = 0,
               "resume(path, steps=None, threads=0) -> Trainer\n\n"
               "The run saved in a checkpoint (save_checkpoint(), `multihead train --checkpoint-out`),\n"
               "with its settings and task; steps may raise the planned steps. Continuing gives the\n"
               "losses an uninterrupted run gives (`multihead train --resume`).")
      .def("train", &PyTrainer::train, "steps"_a = py::none(), "callback"_a = py::none(), py::kw_only(),
           "every"_a = 1,
           "train(self, steps=None, callback=None, *, every=1) -> list\n\n"
           "Runs `steps` more steps (None: up to the planned steps), the GIL released during each.\n"
           "callback(stats) is called with the GIL every `every` steps and after the last; returning\n"
           "False stops. stats = {'step' (0-based), 'loss', 'accuracy', 'grad_norm', 'lr', 'tokens'}.\n"
           "An exception in the callback (or Ctrl-C) stops training and propagates; the steps run\n"
           "stay done. Returns every step's stats.")
      .def("train_step", &PyTrainer::train_step, "train_step(self) -> dict\n\nOne step; its stats (see train()).")
      .def("save_checkpoint",
           [](PyTrainer& self, const PathArg& path) {
             Busy busy(self.busy_, "trainer");
             py::gil_scoped_release nogil;
             self.trainer_unchecked().save_checkpoint(path);
           },
           "path"_a,
           "save_checkpoint(self, path) -> None\n\nThe checkpoint `multihead train --checkpoint-out` writes (atomic).")
      .def("checkpoint_bytes", [](const PyTrainer& self) { return py::bytes(self.trainer().serialize_checkpoint()); },
           "checkpoint_bytes(self) -> bytes\n\nThe checkpoint's bytes.")
      .def("parameters", [](const PyTrainer& self) { return float_tensors(self.trainer().parameters()); },
           "parameters(self) -> dict\n\nThe parameters under PyTorch's names, float32 copies.")
      .def("current_batch", [](const PyTrainer& self) { return batch_dict(self.trainer().current_batch()); },
           "current_batch(self) -> dict\n\nThe batch the next step trains on: {'tokens', 'targets' (B, L) int32, 'mask' (B, L) bool}.")
      .def(
          "gradients",
          [](PyTrainer& self) {
            GradientDump g;
            {
              Busy busy(self.busy_, "trainer");
              py::gil_scoped_release nogil;
              g = self.trainer_unchecked().gradients();
            }
            py::dict d;
            d["loss"] = g.loss;
            d["accuracy"] = g.accuracy;
            d["gradients"] = float_tensors(std::move(g.gradients));
            return d;
          },
          "gradients(self) -> dict\n\nLoss and every parameter's gradient on current_batch(), no update\n"
          "(`multihead train --dump-gradients`): {'loss', 'accuracy', 'gradients': {name: array}}.")
      .def("model", [](const PyTrainer& self) { return TrainedModel::of(self.trainer(), self.task()); },
           "model(self) -> TrainedModel\n\nThe model as it stands (a copy), for evaluate() or save().")
      .def_property_readonly("step", &PyTrainer::step, "Steps done.")
      .def_property_readonly("task", &PyTrainer::task)
      .def_property_readonly("config", [](const PyTrainer& self) { return config_dict(self.trainer().model_config()); },
                             "The model configuration, a dict.")
      .def_property_readonly("options", [](const PyTrainer& self) { return options_dict(self.trainer().options()); },
                             "The training settings, a dict (steps = the planned steps).");

  m.def(
      "task_batch",
      [](const std::string& task, uint64_t seed, int64_t step, int64_t batch, std::optional<int64_t> symbols,
         std::optional<int64_t> length) {
        if (batch < 1) throw Error(Error::Kind::Value, "batch: expected >= 1, got " + std::to_string(batch));
        const std::shared_ptr<const Task> t = task_of(task, symbols, length);
        const double tokens = static_cast<double>(batch) * static_cast<double>(t->sequence_length());
        check_fits_in_memory("batch", "a batch of " + std::to_string(batch) + " x " +
                                          std::to_string(t->sequence_length()) + " tokens, targets and mask values",
                             9.0 * tokens);
        return batch_dict(t->batch(seed, step, batch));
      },
      "task"_a, "seed"_a, "step"_a, "batch"_a, "symbols"_a = py::none(), "length"_a = py::none(),
      "task_batch(task, seed, step, batch, symbols=None, length=None) -> dict\n\n"
      "The batch a Trainer of this task and seed trains on at `step`: {'tokens', 'targets' (B, L)\n"
      "int32, 'mask' (B, L) bool}. A pure function of its arguments.");
  m.def("task_names", &task_names, "task_names() -> list[str]\n\nThe built-in tasks.");
}

}  // namespace multihead::python
