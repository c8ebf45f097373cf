// src/train/checkpoint_metadata.cpp: train/checkpoint_metadata.hpp.
#include "train/checkpoint_metadata.hpp"

#include "io/metadata.hpp"

namespace multihead::train {

void bad_file(const std::string& path, Error::Kind kind, const std::string& what) {
  throw Error(kind, quote_input(path) + ": " + what);
}

void write_model_config(const ModelConfig& c, std::map<std::string, std::string>& out) {
  out["vocabulary"] = std::to_string(c.vocabulary);
  out["sequence_length"] = std::to_string(c.sequence_length);
  out["d_model"] = std::to_string(c.d_model);
  out["heads"] = std::to_string(c.heads);
  out["layers"] = std::to_string(c.layers);
  out["ff"] = std::to_string(c.ff);
  out["dropout"] = to_exact_string(c.dropout);
  out["causal"] = c.causal ? "true" : "false";
  out["positional_encoding"] = to_string(c.positions);
}

void MetadataReader::fail(const std::string& what) const {
  bad_file(path_, Error::Kind::Format, noun_ + " metadata " + what);
}

const std::string& MetadataReader::text(const std::string& key) const {
  const auto it = file_.metadata.find(key);
  if (it == file_.metadata.end()) fail("lacks '" + key + "'");
  return it->second;
}

// The one rule (io/metadata.hpp), with the key named as "'KEY'" after the
// file and noun: "'PATH': checkpoint metadata 'step': expected an integer, got '12abc'".
template <class Read>
auto MetadataReader::read(const std::string& key, Read read) const {
  const std::string& s = text(key);
  try {
    return read("'" + key + "'", s);
  } catch (const Error& e) {
    fail(e.what());
  }
}

int64_t MetadataReader::integer(const std::string& key) const {
  return read(key, [](const std::string& name, const std::string& s) { return detail::metadata_integer(name, s); });
}

uint64_t MetadataReader::unsigned_integer(const std::string& key) const {
  return read(key, [](const std::string& name, const std::string& s) { return detail::metadata_unsigned(name, s); });
}

double MetadataReader::number(const std::string& key) const {
  return read(key, [](const std::string& name, const std::string& s) { return detail::metadata_number(name, s); });
}

bool MetadataReader::boolean(const std::string& key) const {
  return read(key, [](const std::string& name, const std::string& s) { return detail::metadata_boolean(name, s); });
}

Tensor<float> MetadataReader::float32_tensor(const std::string& name, const Shape& shape) const {
  if (file_.undecoded.count(name))
    bad_file(path_, Error::Kind::Value,
             "tensor " + quote_input(name) + " was not decoded (the file was read with a filter that left it out)");
  const auto it = file_.tensors.find(name);
  if (it == file_.tensors.end())
    bad_file(path_, Error::Kind::Missing, "tensor " + quote_input(name) + " is missing (expected shape " + shape_to_string(shape) + ")");
  if (it->second.dtype != DType::F32)
    bad_file(path_, Error::Kind::Format, "tensor " + quote_input(name) + ": expected dtype float32, got " + to_string(it->second.dtype));
  if (it->second.values.shape() != shape)
    bad_file(path_, Error::Kind::Shape, "tensor " + quote_input(name) + ": expected shape " + shape_to_string(shape) + ", got " +
                                            shape_to_string(it->second.values.shape()));
  return tensor_cast<float>(it->second.values);
}

ModelConfig MetadataReader::model_config() const {
  ModelConfig c;
  c.vocabulary = integer("vocabulary");
  c.sequence_length = integer("sequence_length");
  c.d_model = integer("d_model");
  c.heads = integer("heads");
  c.layers = integer("layers");
  c.ff = integer("ff");
  c.dropout = number("dropout");
  c.causal = boolean("causal");
  // Files written before the key existed had sinusoidal positions.
  if (file_.metadata.count("positional_encoding"))
    c.positions = read("positional_encoding", [](const std::string& name, const std::string& s) {
      return parse_positions(s, "metadata " + name);
    });
  // Each attention block's num_heads, written beside 'heads' for the weights
  // loader (trainer.cpp): one that disagrees makes the file contradict
  // itself, and which count the block was trained with cannot be known, so
  // it is refused rather than resumed with 'heads'. Walked over the
  // metadata's keys, not 0 … layers − 1 (a hostile 'layers' is huge).
  static const std::string kBlocks = "blocks.", kNumHeads = ".attn.num_heads";
  for (const auto& [key, value] : file_.metadata) {
    if (!key.starts_with(kBlocks) || !key.ends_with(kNumHeads) || key.size() <= kBlocks.size() + kNumHeads.size())
      continue;
    const int64_t h = integer(key);
    if (h != c.heads)
      fail("'" + key + "' is " + std::to_string(h) + " but 'heads' is " + std::to_string(c.heads) +
           ": the file contradicts itself");
  }
  return c;
}

}  // namespace multihead::train
