epf_add_bench(bench_ht bench_ht.cu)
