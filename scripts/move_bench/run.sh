#!/bin/sh
cd "$(dirname "$0")"
nvcc -O3 -arch=sm_90 -o /tmp/move_bench move_bench.cu && /tmp/move_bench
