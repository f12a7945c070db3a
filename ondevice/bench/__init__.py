"""`ondevice bench`'s machinery: the runner (runner.py: the same prompts decoded by the target alone
and by each draft configuration), llama-cpp-python's rows beside them (llamacpp_rows.py), and what it
measured on a real pair, kept for `ondevice models --predict` (measured.py); the prompt sets it and
the calibration run on (prompt_sets.py; the held-out sets: heldout.py, heldout_edits.py)."""
