"""fairring's microbenchmark: `python -m fairring.bench --help`."""
