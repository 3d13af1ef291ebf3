"""pytest-benchmark suites of specverify (see benchmarks/README.md); a package so that
tests/test_benchmarks_smoke.py can import the benchmark functions and run each once on tiny sizes."""
