// vlsparse-sim: the project's main job. Runs visual-token sparsity policies over a whole model's
// attention (prefill layer by layer, then decode) and reports what each keeps, costs and changes.
// Subcommands run / compare / characterize / masks / golden verify / policies; the code lives in
// sim/include/vlsparse/sim/ (commands.hpp is the entry point), docs/simulator.md describes it.
#include <cstdlib>

#include <unistd.h>

#include <vlsparse/sim/commands.hpp>

int main(int argc, char** argv) {
#if defined(_OPENMP) && defined(__linux__)
    // OpenMP threads spin while they wait by default; on a shared machine (more runnable threads than
    // cores) the spinning takes the cores from the threads that have work, and a run takes several
    // times longer. Unless the user chose a wait policy, restart once with OMP_WAIT_POLICY=passive
    // (the OpenMP runtime reads it before main, so it has to be in the environment at start).
    if (std::getenv("OMP_WAIT_POLICY") == nullptr && setenv("OMP_WAIT_POLICY", "passive", 1) == 0)
        execv("/proc/self/exe", argv);  // returns only on failure: then run with the default policy
#endif
    return vlsparse::sim::sim_main(argc, argv);
}
