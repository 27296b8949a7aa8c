/*
 * sim.h — the knobs of the simulated NCCL / CUDA runtime (nccl_sim.c) that
 * tests/unit/test_nccl_sim.c turns. Set them while no rank thread runs.
 */
#ifndef PT_SIM_H
#define PT_SIM_H

#include <stddef.h>

extern int sim_ndev;             /* devices cudaGetDeviceCount reports (4) */
extern size_t sim_malloc_limit;  /* cudaMalloc of more bytes fails */
extern int sim_inprogress;       /* NCCL answers ncclInProgress this many polls (0) */
extern int sim_sum_early;        /* negative control: the sum kernel ignores stream order */

int sim_aborts(void);            /* ncclCommAbort calls so far */
int sim_live_allocs(void);       /* simulated device allocations not freed */
void sim_fail_comms(int r);      /* every live communicator reports async error r */

#endif
