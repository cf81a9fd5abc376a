"""Studies and checks run from a checkout (see README.md here); not part of the installed package.

A regular package, so that `python -m benchmarks.<name>` from the checkout's root finds these
files even where some installed distribution ships a top-level `benchmarks` of its own.
"""
