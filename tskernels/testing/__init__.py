"""Problem generators (plain torch) and hypothesis strategies (needs the `test` extra) shared by
our tests, benchmarks and anyone testing a kernel against tskernels' references."""
