# Low-latency dispatch / combine benchmark (issue #6): 8 virtual ranks, T = 1 and 128.
epf_add_bench(bench_ll bench_ll.cu)
