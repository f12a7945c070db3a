"""Loading a pair: what is asked (options.py), the plan made once before any model is opened
(choices.py: backends, threads, context; memory.py: where a llama.cpp target lives and how its
buffers are sized; drafter_room.py: the drafter, or more of a streaming target's layers), the timed
passes those choices rest on (profiling.py), and the sequence that opens the models as planned (pair.py)."""
