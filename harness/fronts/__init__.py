"""The fronts users drive: the command line (`cli`), the pytest plugin (`plugin`), the fuzzer,
the benchmark, module mode, and the standalone repro script.  May import every layer."""
