// What strata reads from and asks of SLURM: the compressed host lists it
// writes into SLURM_JOB_NODELIST ("node[01-04,07]"), and requeueing the
// current job (`scontrol requeue`), as a pre-empted job does before it ends.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace strata::runtime {

/// Bounds on a host list (Note [Bounded host lists] in slurm.cpp): its
/// length in bytes, the hosts an expansion may produce, the digits of one
/// number in a range.
inline constexpr size_t kMaxNodelistBytes = 64 * 1024;
inline constexpr size_t kMaxNodelistHosts = 64 * 1024;
inline constexpr size_t kMaxNodelistDigits = 9;

/// Every host of a SLURM host list, in SLURM's order: comma-separated
/// entries, each a name with zero or more bracket groups of numbers and
/// ranges ("node[01-04,07]", "a1,b[2-3]", "rack[1-2]-gpu[1-4]", the last
/// host varying fastest); zero padding kept (the width of the lower bound:
/// node[08-10] is node08 node09 node10). Throws ConfigError naming
/// `variable` and the offending part when the list is malformed or longer
/// than the bounds above.
std::vector<std::string> expand_nodelist(std::string_view nodelist, std::string_view variable = "SLURM_JOB_NODELIST");

/// The first host of the list (the one SLURM starts task 0 on), after
/// checking the whole list as expand_nodelist does but without expanding
/// it: linear in the length of the text whatever the ranges hold.
std::string first_host(std::string_view nodelist, std::string_view variable = "SLURM_JOB_NODELIST");

/// How many hosts the list names (at most kMaxNodelistHosts, else a
/// ConfigError), without expanding it.
size_t count_nodelist(std::string_view nodelist, std::string_view variable = "SLURM_JOB_NODELIST");

/// What slurm_requeue did.
struct RequeueResult {
  bool ok = false;       ///< scontrol ran and exited 0
  std::string job_id;    ///< the job it asked to requeue ("" when none was found)
  std::string message;   ///< one line for the log: what ran and how it ended, or why nothing ran
};

/// Requeues the current job, as Lightning's SLURM connector does on the
/// pre-emption signal: runs `scontrol requeue JOB` (found on PATH, no
/// shell), JOB being SLURM_ARRAY_JOB_ID_SLURM_ARRAY_TASK_ID for an array
/// task and SLURM_JOB_ID otherwise, and waits up to `timeout_s` for it
/// (then kills it). Never throws: a missing or malformed job id, a missing
/// scontrol, its failure or its hang come back as ok=false with the
/// reason (and scontrol's own words) in `message`, for the caller to log.
RequeueResult slurm_requeue(int timeout_s = 60);

}  // namespace strata::runtime
