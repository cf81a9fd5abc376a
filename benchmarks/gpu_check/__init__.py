"""fairring's GPU check: the CUDA tests and CUDA benches, written to one report (`make gpu-check`).

Needs no network and no virtual environment: run it with the python whose
torch fairring was just built against (`make gpu-check` builds first). Stages,
each with its own time limit inside --budget, so the whole check ends in time:

Stages in order of value:

1. environment: python, torch, CUDA, NCCL, the compiler, nvcc, fairring.build_info(), the GPUs;
1b. contract: `tests/test_cuda.py -k synchronous`: every collective kind with async_op False
   and True, above and below the threshold, engine and NCCL, on 2 machines x 2 ranks (a
   job's first step meets these; since torch 2.8 NCCL returns no Work for a synchronous op),
   and a synchronous engine all-reduce holding only the caller's stream (the engine launching
   ahead, FAIRRING_CUDA_WAIT=stream's default) timed against its op;
1c. fsdp2: a GPT of 124M parameters trained by FSDP2 (the training study's real part,
   benchmarks/gpu_check/fsdp2.py), MPS started where it can be, on 2 hosts x 2 and then x 4
   ranks with NICs shaped to 10 Gbit/s (loopback where namespaces cannot be made; --quick:
   2 x 2 only): the engine against NCCL, step time, losses, and how long the host took to
   issue each step (what the engine's wait() holds of it);
2. versus NCCL (benchmarks/versus_nccl.py): MPS started where the machine lets it (and
   stopped after), each machine a network namespace whose NIC is shaped to 10 Gbit/s, NCCL
   on its socket transport through it; on 2 machines x 2 ranks, then x 4 where the time
   allows (not with --quick), the engine, NCCL's all-reduce and FAIRRING_CUDA_ENGINE=auto's
   routing at 4 to 256 MiB on the same tensors, the order rotated every iteration, every
   result checked, with the fraction of the bound; and, on 2 x 2, 8 buckets of 25 MiB
   issued at once, the engine against NCCL (what the op boundary costs), then FSDP's
   reduce-scatter and all-gather at the same sizes (engine, NCCL, auto; --quick: the
   reduce-scatter only), where the stage's time allows; skipped, saying why, where namespaces cannot be made;
3. tests: `python -m pytest tests/test_cuda.py -rs -s -p no:cacheprovider -k "not synchronous"`;
4. correctness on the layouts of --worlds with several ranks per machine (2x2, 3x2),
   whose local steps run on real NCCL groups (a distinct NCCL_HOSTID per process,
   NCCL's socket transport on loopback): every dtype and op against plain torch on
   the CPU; the first layout with the GPU in launch order (CUDA_DEVICE_MAX_CONNECTIONS=1,
   the engine kept there by FAIRRING_SERIALIZED_LAUNCHES=engine) and the default flat
   threshold, so that NCCL's own small all-reduces are launched among the engine's; the
   second started as a job set up for NCCL starts (a ProcessGroupNCCL.Options as
   pg_options, device_id), so that both reach real NCCL groups. Each also runs
   cuda_bench's order checks: an all-reduce then a broadcast of the same tensor,
   is_completed() against a read without wait(), the same tensor twice in flight, a
   coalescing block, and a second group in flight from another thread (left out with
   CUDA_DEVICE_MAX_CONNECTIONS=1, where two engines are what that setting refuses);
5. compare (--compare): on 2 machines x 2 ranks and 2 x 1, fairring's engine, NCCL's
   all-reduce and Gloo's on the same tensors in the same processes, the order
   alternated each round, every result checked, NCCL's INFO lines on its transport
   quoted (one GPU time-sliced between the processes, on loopback: not a cluster);
5b. failure: rank 3 of 2 machines x 2 ranks kills itself mid-stream of engine all-reduces
   and delegated broadcasts; each survivor's first error must name it within the op's
   timeout (20 s) and 15 s, its device then drain within the op's timeout (the delegate's
   kernels ended by the engine's failure, not NCCL's watchdog), a later broadcast
   (NCCL's on the GPU) be refused with that cause within 5 s, and its teardown return
   within 15 s;
6. bench: two processes on one GPU as two machines (benchmarks/cuda_bench.py):
   engine all-reduce throughput against fairring._C._testing.RailsEndpoint moving the same
   bytes between the same two processes, then every dtype and op checked;
6b. training: `python -m fairring.bench --study training --quick --loopback --cuda` (DDP, and FSDP2)
   (without --cuda on the CPU): tiny models trained by DDP on 2x2, fairring's losses
   against NCCL's (Gloo's) from the same weights on the same data;
7. correctness on the layouts of --worlds of one rank per machine (none by default: on one
   GPU, 4 processes take a minute, and the bench and compare stages run 2 x 1 already);
8. stress: two processes with large slices (--stress-slice) and TensorPipe's
   cuda_basic channel (FAIRRING_CHANNELS=cuda_basic), --stress-ops all-reduces of
   --stress-bytes in flight at once for --stress-rounds rounds, each result checked
   exactly. It shows whether cuda_basic's shared pool of pinned chunks (16 x 1 MiB
   per TensorPipe context) can starve the reduced-shard writes (docs/design.md);
   a hang ends at the stage's time limit, reported with the ranks' output;
9. validate: `python -m fairring.validate` (docs/validating.md) under torchrun, 2 agents as
   2 machines x 2 ranks (--share-gpu on the GPU), 1 to 16 MiB (CPU: 64 KiB to 1 MiB):
   fairring's engine, the delegate's all-reduce and (CUDA) fairring with its engine off,
   taking turns on the same tensor, every element checked; its table and verdict go in
   the report;
10. nixl: the bench's two processes on the NIXL rails (FAIRRING_RAILS_TRANSPORT=nixl),
   the GPU staging registered with UCX; skipped, saying why, where NIXL is not
   installed (carry the nixl-cu13 wheel and put it on PYTHONPATH).

Each stage runs for at most its limit less the later stages' reserves, and at
least its own reserve while the budget lasts (earlier stages first); one that
the budget no longer fits is recorded as skipped. A stage that fails is
recorded and the next one runs; the exit status is 1 if any stage failed (or no GPU is visible), else
0. --only runs the stages it names (contract, versus, tests, worlds, compare, failure, bench, training,
stress, validate, nixl) and reports the others skipped. --device cpu runs the same
benches on CPU tensors (a smoke test for machines without a GPU; the stress scaled
down) and skips the tests.

    python -m benchmarks.gpu_check --report gpu-check-report.md
    python -m benchmarks.gpu_check --device cpu --quick --report /tmp/report.md
"""
