"""A target split across machines with llama.cpp's RPC backend: `ondevice worker` serves a machine's
memory and CPU (worker.py), `--rpc host:port,…` places the target's layers across this machine and
the workers (split.py), and a worker lost mid-answer ends the answer with one line (faults.py)."""
