# route (issue #4): route update latency and the count-exchange round trip (a program, not a test).
#   build-*/tests/bench/bench_route [reps]
epf_add_bench(bench_route bench_route.cu)
