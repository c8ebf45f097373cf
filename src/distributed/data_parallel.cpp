// src/distributed/data_parallel.cpp: multihead/data_parallel.hpp.
#include "multihead/data_parallel.hpp"

#include <string>
#include <vector>

#include "multihead/error.hpp"

namespace multihead::distributed {
namespace {

// The chain's messages: the gradient values, then the fold's counts and
// its loss sum.
constexpr int kGradientTag = 1801, kCountsTag = 1802, kLossTag = 1803;

void send_fold(Communicator& c, const ExampleFold& f, int dest) {
  const int64_t counts[3] = {f.examples, f.count, f.correct};
  Request g = c.isend(f.gradient.data(), static_cast<int64_t>(f.gradient.size()), dest, kGradientTag);
  Request n = c.isend(counts, 3, dest, kCountsTag);
  Request l = c.isend(&f.loss_sum, 1, dest, kLossTag);
  c.wait(g);
  c.wait(n);
  c.wait(l);
}

void receive_fold(Communicator& c, ExampleFold& f, int64_t values, int source) {
  int64_t counts[3] = {0, 0, 0};
  f.gradient.assign(static_cast<std::size_t>(values), 0.0f);
  Request g = c.irecv(f.gradient.data(), values, source, kGradientTag);
  Request n = c.irecv(counts, 3, source, kCountsTag);
  Request l = c.irecv(&f.loss_sum, 1, source, kLossTag);
  c.wait(g);
  c.wait(n);
  c.wait(l);
  f.examples = counts[0];
  f.count = counts[1];
  f.correct = counts[2];
}

void broadcast_fold(Communicator& c, ExampleFold& f, int64_t values, int root) {
  int64_t counts[3] = {f.examples, f.count, f.correct};
  f.gradient.resize(static_cast<std::size_t>(values));
  c.broadcast(f.gradient.data(), values, root);
  c.broadcast(counts, 3, root);
  c.broadcast(&f.loss_sum, 1, root);
  f.examples = counts[0];
  f.count = counts[1];
  f.correct = counts[2];
}

}  // namespace

void check_data_parallel(const Trainer& trainer, int ranks) {
  const TrainOptions& o = trainer.options();
  if (o.gradients != GradientSum::PerExample)
    throw Error(Error::Kind::Value, "data parallel: expected a trainer with per-example gradients, got batched");
  if (ranks < 1 || o.batch % ranks != 0)
    throw Error(Error::Kind::Value, "batch: expected a multiple of the " + std::to_string(ranks) +
                                        " ranks (each takes batch/ranks examples), got " + std::to_string(o.batch));
}

StepStats data_parallel_step(Trainer& trainer, Communicator& comm) {
  const int P = comm.size(), r = comm.rank();
  const int64_t per = trainer.options().batch / P;
  // The passes first: they need nothing from the other ranks.
  const std::vector<ExampleResult> mine = trainer.example_results(r * per, (r + 1) * per);
  const auto values = static_cast<int64_t>(mine.front().gradient.size());
  ExampleFold fold;
  if (r > 0) receive_fold(comm, fold, values, r - 1);
  for (const ExampleResult& e : mine) fold.add(e);  // throws unless the fold held examples 0 … r·per − 1
  if (r + 1 < P) send_fold(comm, fold, r + 1);
  broadcast_fold(comm, fold, values, P - 1);
  return trainer.apply(fold);
}

}  // namespace multihead::distributed
