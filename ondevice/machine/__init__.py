"""The ground floor: facts about this machine that every layer may ask and none decides on.

ram.py: the RAM this process may use (cgroup-aware), its peak and anonymous memory, disk reads;
facts.py: CPU, SIMD, cores and threads, GPUs, the machine's fingerprint, and measured bandwidths
(memory, PCIe, disk); llama_repack.py: whether llama.cpp's repacked weight layouts run here (measured
once per build, saved in the home). Nothing here imports the rest of ondevice but sizes.py and
paths.py; decisions live in plan/.
"""
