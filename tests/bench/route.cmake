# route (issue #4): route update latency and the count-exchange round trip; bench_match: the
# slot pass's equality masks, ballots against __match_any_sync (programs, not tests).
#   build-*/tests/bench/bench_route [reps]
epf_add_bench(bench_route bench_route.cu)
epf_add_bench(bench_match bench_match.cu)
