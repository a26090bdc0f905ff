/* test_abi.cpp — the same layout checks compiled as C++17. */
#include "test_abi.c"
