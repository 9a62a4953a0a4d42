// Uses the installed strata the way a user's program would.
#include <strata/strata.h>

#include <ATen/ATen.h>
#include <iostream>

int main() {
  strata::comm::Group group;  // one rank, no launcher needed
  at::Tensor t = at::arange(4, at::kFloat);
  group.all_reduce(t, strata::comm::ReduceOp::kSum);
  bool ok = group.size() == 1 && t.equal(at::arange(4, at::kFloat));
  std::cout << "consumer: world size " << group.size() << ", all_reduce " << (ok ? "ok" : "WRONG") << "\n";
  return ok ? 0 : 1;
}
