// Environment parsing: torchrun-style names, Open MPI, SLURM, and every
// error a user can meet (each names the variable).
#include <gtest/gtest.h>

#include <cstdlib>

#include "strata/core/error.h"
#include "strata/runtime/env.h"

namespace {

using strata::runtime::Environment;
using Vars = std::map<std::string, std::string>;

std::string error_of(const Vars& vars) {
  try {
    Environment::from_map(vars);
  } catch (const strata::ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(EnvTest, NoVariablesMeansOneProcess) {
  Environment env = Environment::from_map({});
  EXPECT_EQ(env.rank, 0);
  EXPECT_EQ(env.world_size, 1);
  EXPECT_EQ(env.num_nodes, 1);
  EXPECT_EQ(env.master_addr, "127.0.0.1");
  EXPECT_EQ(env.master_port, 0);
  EXPECT_EQ(env.source, "none");
  EXPECT_FALSE(env.launched());
}

TEST(EnvTest, TorchrunNamesGiveEveryField) {
  Environment env = Environment::from_map({{"RANK", "5"},
                                           {"LOCAL_RANK", "1"},
                                           {"WORLD_SIZE", "8"},
                                           {"LOCAL_WORLD_SIZE", "4"},
                                           {"NODE_RANK", "1"},
                                           {"MASTER_ADDR", "node0.example"},
                                           {"MASTER_PORT", "29501"},
                                           {"STRATA_TIMEOUT", "17"}});
  EXPECT_EQ(env.rank, 5);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_world_size, 4);
  EXPECT_EQ(env.node_rank, 1);
  EXPECT_EQ(env.num_nodes, 2);
  EXPECT_EQ(env.master_addr, "node0.example");
  EXPECT_EQ(env.master_port, 29501);
  EXPECT_EQ(env.timeout_s, 17);
  EXPECT_EQ(env.source, "strata");
  EXPECT_TRUE(env.launched());
  EXPECT_EQ(env.describe(), "rank 5/8 (local 1/4, node 1/2)");
}

TEST(EnvTest, ToVarsRoundTrips) {
  Environment env = Environment::from_map(
      {{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_PORT", "1234"}, {"STRATA_TIMEOUT", "9"}});
  Vars vars = env.to_vars();
  EXPECT_EQ(vars, (Vars{{"RANK", "3"},
                        {"LOCAL_RANK", "1"},
                        {"WORLD_SIZE", "4"},
                        {"LOCAL_WORLD_SIZE", "2"},
                        {"NODE_RANK", "1"},
                        {"MASTER_ADDR", "127.0.0.1"},
                        {"MASTER_PORT", "1234"},
                        {"STRATA_TIMEOUT", "9"}}));
  Environment again = Environment::from_map(vars);
  EXPECT_EQ(again.describe(), env.describe());
}

TEST(EnvTest, OpenMpiVariablesAreRead) {
  Environment env = Environment::from_map({{"OMPI_COMM_WORLD_RANK", "3"},
                                           {"OMPI_COMM_WORLD_SIZE", "4"},
                                           {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                           {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                           {"MASTER_ADDR", "10.0.0.1"}});
  EXPECT_EQ(env.source, "openmpi");
  EXPECT_EQ(env.describe(), "rank 3/4 (local 1/2, node 1/2)");
  EXPECT_EQ(env.master_addr, "10.0.0.1");
  EXPECT_EQ(env.master_port, 29500);
}

TEST(EnvTest, SlurmVariablesAreReadAndThePortFollowsTheJobId) {
  Environment env = Environment::from_map({{"SLURM_PROCID", "5"},
                                           {"SLURM_STEP_ID", "0"},
                                           {"SLURM_NTASKS", "6"},
                                           {"SLURM_LOCALID", "2"},
                                           {"SLURM_NODEID", "1"},
                                           {"SLURM_NNODES", "2"},
                                           {"SLURM_NTASKS_PER_NODE", "3"},
                                           {"SLURM_JOB_ID", "123456"},
                                           {"MASTER_ADDR", "gpu01"}});
  EXPECT_EQ(env.source, "slurm");
  EXPECT_EQ(env.describe(), "rank 5/6 (local 2/3, node 1/2)");
  EXPECT_EQ(env.master_addr, "gpu01");
  EXPECT_EQ(env.master_port, 15000 + 3456);
}

TEST(EnvTest, SlurmTasksPerNodeIsDerivedWhenMissing) {
  Environment env = Environment::from_map(
      {{"SLURM_PROCID", "3"}, {"SLURM_STEP_ID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_NNODES", "2"}, {"MASTER_ADDR", "a"}});
  EXPECT_EQ(env.describe(), "rank 3/4 (local 1/2, node 1/2)");
  EXPECT_EQ(error_of({{"SLURM_PROCID", "0"}, {"SLURM_STEP_ID", "0"}, {"SLURM_NTASKS", "5"}, {"SLURM_NNODES", "2"},
                      {"MASTER_ADDR", "a"}}),
            "[env] SLURM_NTASKS=5 tasks do not divide evenly over SLURM_NNODES=2 nodes and SLURM_NTASKS_PER_NODE is "
            "not set; run srun with --ntasks-per-node");
}

TEST(EnvTest, TorchrunNamesWinOverSlurmWhenBothAreSet) {
  Environment env = Environment::from_map(
      {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"SLURM_PROCID", "0"}, {"SLURM_STEP_ID", "0"}, {"SLURM_NTASKS", "2"}});
  EXPECT_EQ(env.source, "strata");
  EXPECT_EQ(env.rank, 1);
}

TEST(EnvTest, IncompleteSetsNameTheMissingVariable) {
  EXPECT_EQ(error_of({{"RANK", "0"}}),
            "[env] RANK is set but WORLD_SIZE is not; set WORLD_SIZE to the number of workers");
  EXPECT_EQ(error_of({{"WORLD_SIZE", "2"}}),
            "[env] WORLD_SIZE is set but RANK is not; set RANK to this worker's global rank (0..WORLD_SIZE-1)");
  EXPECT_EQ(error_of({{"OMPI_COMM_WORLD_RANK", "0"}}),
            "[env] OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is not; set OMPI_COMM_WORLD_SIZE to the "
            "number of processes (mpirun sets it)");
  EXPECT_EQ(error_of({{"SLURM_PROCID", "0"}, {"SLURM_STEP_ID", "0"}}),
            "[env] SLURM_PROCID is set but SLURM_NTASKS is not; set SLURM_NTASKS to the number of tasks (srun "
            "--ntasks)");
}

TEST(EnvTest, MalformedNumbersNameTheVariableAndValue) {
  EXPECT_EQ(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "abc"}}),
            "[env] LOCAL_RANK='abc' is not an integer");
  EXPECT_EQ(error_of({{"RANK", "1x"}, {"WORLD_SIZE", "2"}}), "[env] RANK='1x' is not an integer");
  EXPECT_EQ(error_of({{"RANK", ""}, {"WORLD_SIZE", "2"}}), "[env] RANK='' is not an integer");
  EXPECT_EQ(error_of({{"RANK", "0"}, {"WORLD_SIZE", "99999999999"}}),
            "[env] WORLD_SIZE='99999999999' is not an integer");
  EXPECT_EQ(error_of({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_PORT", "http"}}),
            "[env] MASTER_PORT='http' is not an integer");
  EXPECT_EQ(error_of({{"STRATA_TIMEOUT", "5s"}}), "[env] STRATA_TIMEOUT='5s' is not an integer");
  EXPECT_EQ(error_of({{"SLURM_PROCID", " 1"}, {"SLURM_STEPID", "0"}, {"SLURM_NTASKS", "2"}}),
            "[env] SLURM_PROCID=' 1' is not an integer");
}

TEST(EnvTest, ContradictoryValuesAreErrors) {
  EXPECT_EQ(error_of({{"RANK", "2"}, {"WORLD_SIZE", "2"}}),
            "[env] RANK=2 is outside 0..1 (WORLD_SIZE=2); each worker needs a distinct rank below the world size");
  EXPECT_EQ(error_of({{"RANK", "-1"}, {"WORLD_SIZE", "2"}}),
            "[env] RANK=-1 is outside 0..1 (WORLD_SIZE=2); each worker needs a distinct rank below the world size");
  EXPECT_EQ(error_of({{"RANK", "0"}, {"WORLD_SIZE", "0"}}), "[env] WORLD_SIZE=0 must be at least 1");
  EXPECT_EQ(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}}),
            "[env] LOCAL_RANK=2 is outside 0..1 (LOCAL_WORLD_SIZE=2)");
  EXPECT_EQ(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "4"}}),
            "[env] LOCAL_WORLD_SIZE=4 must be between 1 and WORLD_SIZE=2");
  EXPECT_EQ(error_of({{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "2"}, {"NODE_RANK", "2"}}),
            "[env] NODE_RANK=2 is outside 0..1 (2 nodes)");
  EXPECT_EQ(error_of({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_PORT", "70000"}}),
            "[env] MASTER_PORT=70000 is not a TCP port (1..65535)");
  EXPECT_EQ(error_of({{"STRATA_TIMEOUT", "0"}}), "[env] STRATA_TIMEOUT=0 must be a positive number of seconds");
  EXPECT_EQ(error_of({{"OMPI_COMM_WORLD_RANK", "4"}, {"OMPI_COMM_WORLD_SIZE", "4"}}),
            "[env] OMPI_COMM_WORLD_RANK=4 is outside 0..3 (OMPI_COMM_WORLD_SIZE=4); each worker needs a distinct "
            "rank below the world size");
}

TEST(EnvTest, MultiNodeMpiAndSlurmJobsNeedMasterAddr) {
  EXPECT_EQ(error_of({{"OMPI_COMM_WORLD_RANK", "0"},
                      {"OMPI_COMM_WORLD_SIZE", "4"},
                      {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}),
            "[env] the Open MPI job spans 2 nodes but MASTER_ADDR is not set; set MASTER_ADDR to the host name or "
            "address of the node that runs rank 0");
  EXPECT_EQ(error_of({{"SLURM_PROCID", "0"}, {"SLURM_STEP_ID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_NNODES", "2"}}),
            "[env] the SLURM job spans 2 nodes but neither SLURM_JOB_NODELIST nor MASTER_ADDR is set; srun sets "
            "SLURM_JOB_NODELIST, else set MASTER_ADDR to the host name or address of the node that runs rank 0");
}

// What srun gives task `rank` of 2 nodes x 2 tasks (--ntasks-per-node=2).
Vars srun_task(int rank, const std::string& nodelist) {
  return {{"SLURM_JOB_ID", "4321"},        {"SLURM_STEP_ID", "0"},
          {"SLURM_PROCID", std::to_string(rank)}, {"SLURM_NTASKS", "4"},
          {"SLURM_NNODES", "2"},           {"SLURM_NODEID", std::to_string(rank / 2)},
          {"SLURM_LOCALID", std::to_string(rank % 2)}, {"SLURM_NTASKS_PER_NODE", "2"},
          {"SLURM_JOB_NODELIST", nodelist}};
}

TEST(EnvTest, SlurmMasterAddrIsTheFirstHostOfTheNodeList) {
  for (int rank = 0; rank < 4; ++rank) {
    Environment env = Environment::from_map(srun_task(rank, "gpu[07-08,11],login1"));
    EXPECT_EQ(env.source, "slurm");
    EXPECT_EQ(env.master_addr, "gpu07") << "rank " << rank;
    EXPECT_EQ(env.master_port, 15000 + 4321);
    EXPECT_EQ(env.describe(), "rank " + std::to_string(rank) + "/4 (local " + std::to_string(rank % 2) +
                                  "/2, node " + std::to_string(rank / 2) + "/2)");
  }
  // The user's MASTER_ADDR wins; the step's list comes before the job's;
  // the older SLURM_NODELIST is read when it is the only one.
  Vars vars = srun_task(1, "gpu[07-08]");
  vars["MASTER_ADDR"] = "10.1.2.3";
  EXPECT_EQ(Environment::from_map(vars).master_addr, "10.1.2.3");
  vars = srun_task(1, "gpu[07-08]");
  vars["SLURM_STEP_NODELIST"] = "gpu[08-09]";
  EXPECT_EQ(Environment::from_map(vars).master_addr, "gpu08");
  vars = srun_task(1, "x");
  vars.erase("SLURM_JOB_NODELIST");
  vars["SLURM_NODELIST"] = "a[003-004]";
  EXPECT_EQ(Environment::from_map(vars).master_addr, "a003");
  // One node: every task is here, whatever the list says.
  Environment one = Environment::from_map({{"SLURM_PROCID", "1"}, {"SLURM_STEP_ID", "3"}, {"SLURM_NTASKS", "2"},
                                           {"SLURM_NNODES", "1"}, {"SLURM_JOB_NODELIST", "gpu01"}});
  EXPECT_EQ(one.master_addr, "127.0.0.1");
}

TEST(EnvTest, SlurmMalformedNodeListNamesTheVariable) {
  EXPECT_EQ(error_of(srun_task(0, "gpu[07-")),
            "[slurm] SLURM_JOB_NODELIST='gpu[07-' is not a SLURM host list: a '[' that is not closed at '[07-' "
            "(byte 3); expected host names and bracketed ranges such as node[01-04,07] or a1,b[2-3]");
  Vars step = srun_task(0, "gpu01");
  step["SLURM_STEP_NODELIST"] = "gpu 01";
  EXPECT_EQ(error_of(step),
            "[slurm] SLURM_STEP_NODELIST='gpu 01' is not a SLURM host list: a character that no host name holds "
            "(letters, digits, '-', '.', '_') at ' ' (byte 3); expected host names and bracketed ranges such as "
            "node[01-04,07] or a1,b[2-3]");
}

// Note [SLURM tasks and the batch script]: without a step id this is the
// batch script (or salloc's shell), one process; a step of one task is one
// process too. Either may start workers of its own.
TEST(EnvTest, SlurmBatchScriptAndOneTaskStepsAreSingleProcesses) {
  Vars batch = srun_task(0, "gpu[01-02]");
  batch.erase("SLURM_STEP_ID");
  Environment env = Environment::from_map(batch);
  EXPECT_EQ(env.source, "none");
  EXPECT_FALSE(env.launched());
  EXPECT_EQ(env.world_size, 1);
  Environment one = Environment::from_map(
      {{"SLURM_PROCID", "0"}, {"SLURM_STEP_ID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_JOB_NODELIST", "gpu01"}});
  EXPECT_FALSE(one.launched());
  Vars old = srun_task(3, "gpu[01-02]");
  old.erase("SLURM_STEP_ID");
  old["SLURM_STEPID"] = "0";
  EXPECT_EQ(Environment::from_map(old).describe(), "rank 3/4 (local 1/2, node 1/2)");
}

TEST(EnvTest, FromEnvReadsTheProcessEnvironment) {
  ::setenv("RANK", "1", 1);
  ::setenv("WORLD_SIZE", "3", 1);
  ::setenv("MASTER_PORT", "4242", 1);
  Environment env = Environment::from_env();
  ::unsetenv("RANK");
  ::unsetenv("WORLD_SIZE");
  ::unsetenv("MASTER_PORT");
  EXPECT_EQ(env.describe(), "rank 1/3 (local 1/3, node 0/1)");
  EXPECT_EQ(env.master_port, 4242);
}

}  // namespace
