"""NVML's used bytes of GPUs, sampled in a thread while a benchmark runs:
the peak of each, for bench_allocator.py and ddp_bench.py."""

import threading
import time


class PeakSampler:
    """NVML used bytes of every device in `devices`, sampled every `period` seconds;
    keeps each device's maximum."""

    def __init__(self, devices, period=0.001):
        import pynvml

        self.nvml = pynvml
        pynvml.nvmlInit()
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in devices]
        self.period = period
        self.peaks = [0] * len(devices)
        self.samples = 0
        self.stop_flag = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def used(self):
        return [int(self.nvml.nvmlDeviceGetMemoryInfo(h).used) for h in self.handles]

    def _sample(self):
        for i, used in enumerate(self.used()):
            self.peaks[i] = max(self.peaks[i], used)

    def _run(self):
        while not self.stop_flag.is_set():
            self._sample()
            self.samples += 1
            time.sleep(self.period)

    def start(self):
        self.thread.start()

    def stop(self):
        self.stop_flag.set()
        self.thread.join()
        self._sample()
        return list(self.peaks)
