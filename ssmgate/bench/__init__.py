"""Benchmarks: programs that print a table and write JSON (`python -m ssmgate.bench NAME --help`)."""
