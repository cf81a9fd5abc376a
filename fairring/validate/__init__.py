"""A cluster validation command for fairring's all-reduce: `python -m fairring.validate --help`.

Run on every rank (torchrun, or srun alone), it sweeps all-reduce sizes the way
nccl-tests does and compares, on the same tensor with the paths taking turns,
fairring's engine against the delegate's own all-reduce (NCCL for CUDA, Gloo
for CPU) and, on CUDA, fairring with its engine off. Every result is checked.
Rank 0 prints nccl-tests-style tables, the engine's speed against the delegate
and the hierarchical bound, the rails each rank uses, and a verdict: whether
the engine wins on this cluster and which FAIRRING_FLAT_THRESHOLD to set.
docs/validating.md is its reference.
"""
