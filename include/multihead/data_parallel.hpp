// multihead/data_parallel.hpp: data-parallel training over MPI (part of
// multihead::distributed; docs/distributed.md, "Data parallelism").
//
// Every rank holds the whole model, its AdamW moments and the run's
// settings, and builds the step's whole batch itself (a pure function of
// seed and step). Rank r of P computes examples [r·B/P, (r+1)·B/P), one
// forward and backward each (GradientSum::PerExample). The gradient sum then
// runs along the ranks in example order: rank r receives the fold of
// examples 0 … r·B/P − 1 from rank r − 1, adds its own examples one by one
// and passes the fold on; the last rank broadcasts the whole batch's fold,
// and every rank takes the same AdamW step. Each addition g ← g + g_b is the
// one the one-process run (P = 1) makes, in the same order, so the losses,
// gradient norms and parameters are bit-identical for every P dividing B.
//
// Cost per step and rank: B/P passes, n = every parameter's gradient values
// sent once along the chain (4n bytes) and once more in the broadcast; the
// chain's additions (B·n) wait on each other, the passes do not.
#pragma once

#include "multihead/distributed.hpp"
#include "multihead/train.hpp"

namespace multihead::distributed {

// Throws multihead::Error (Kind::Value) naming both numbers unless `ranks`
// divides the batch, and unless the trainer sums per example. No
// communication: call it inside Communicator::agree.
void check_data_parallel(const Trainer& trainer, int ranks);

// One training step of the whole batch across comm's ranks (collective;
// every rank returns the same StepStats and holds the same parameters after).
StepStats data_parallel_step(Trainer& trainer, Communicator& comm);

}  // namespace multihead::distributed
