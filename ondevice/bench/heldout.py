"""Held-out prompt sets: written for one measurement each and never iterated on (README's planner
and streaming figures). Code and chat, as users ask. `ondevice bench --prompts heldout…` runs them:
every HELDOUT<n>_CODE / HELDOUT<n>_CHAT list here, in bench/heldout_later.py and in
bench/heldout_latest.py is the set heldout<n>-code / heldout<n>-chat (`NUMBERED`)."""

import re

from ondevice.bench import heldout_latest, heldout_later

# Held out from everything, the planner's tuning included: written for the planner's acceptance
# measurements (README, "How it decides"), never iterated on. Code and chat, as users ask.
HELDOUT_CODE = [
    "Write a Python function that groups a list of words by their first letter and returns a dict of sorted lists.",
    "Write a Go HTTP handler that returns the current server time as JSON.",
    "Write a Python context manager that times the block it wraps and logs the elapsed milliseconds.",
    "Implement a function in C that checks whether a binary tree is a valid binary search tree.",
]

HELDOUT_CHAT = [
    "Why do databases use indexes, and what do they cost?",
    "Explain what a race condition is with an everyday analogy.",
    "What should I check before merging a pull request?",
    "How is a linked list different from an array, and when does each win?",
]

# A second held-out pair of sets, written on 2026-11-26 after the planner's builder gains were tuned on
# the first pair's streamed results: the measurement of that change (README, "Larger than memory").
HELDOUT2_CODE = [
    "Write a Python function that returns the n most common words in a text file, ignoring case and punctuation.",
    "Write a Rust function that reverses the words of a sentence in place without allocating a new string.",
]

HELDOUT2_CHAT = [
    "What is the difference between a process and a thread?",
    "Give me three tips for writing clear commit messages, with an example of each.",
]

HELDOUT3_CODE = [  # written for the hybrid arm's audit, measured once
    "Write a Python class implementing an LRU cache with get and put in O(1), using a dict and a doubly linked list.",
    "Write a Go function that merges two sorted slices of integers into one sorted slice.",
]

HELDOUT3_CHAT = [
    "Explain how a hash table handles collisions, in plain words.",
    "What should I check before buying a used bicycle?",
]

HELDOUT4_CODE = [  # written after the decode slack was measured, measured once
    "Write a Python function that parses a duration like '1h30m15s' into a number of seconds.",
    "Write a C function that counts the set bits in a 32-bit unsigned integer, with a short test in main.",
]

HELDOUT4_CHAT = [
    "How do vaccines train the immune system?",
    "Suggest a simple weekly plan for learning to cook, for a complete beginner.",
]

HELDOUT5_CODE = [  # written before the spread kept layers were measured, measured once
    "Write a JavaScript function that debounces another function, with a short usage example.",
    "Write a Python function that checks whether a string of brackets ()[]{} is balanced.",
]

HELDOUT5_CHAT = [
    "Why does bread go stale, and how can I keep it fresh longer?",
    "Explain the difference between weather and climate to a ten-year-old.",
]

HELDOUT6_CODE = [  # written after heldout5's run, for a second look at the same code, measured once
    "Write a Python function that flattens an arbitrarily nested list of integers without recursion.",
    "Write a TypeScript function that groups an array of objects by a key and returns a Map.",
]

HELDOUT6_CHAT = [
    "What are the pros and cons of working from home?",
    "How does a refrigerator keep food cold?",
]

HELDOUT7_CODE = [  # written before the slots were mapped once, measured once
    "Write a Python function that returns the n most common words in a text file, ignoring case and punctuation.",
    "Write a Rust function that reverses the words in a sentence while keeping the whitespace between them.",
]

HELDOUT7_CHAT = [
    "What is the difference between a virus and a bacterium?",
    "How do noise-cancelling headphones work?",
]

HELDOUT8_CODE = [  # written before drafting in the disk waits was measured, measured once
    "Write a Python function that converts a Roman numeral string to an integer, rejecting invalid input.",
    "Write a C function that removes duplicate values from a sorted array in place and returns the new length.",
]

HELDOUT8_CHAT = [
    "Why is the sky blue during the day and red at sunset?",
    "What are good habits for keeping a small garden healthy through a dry summer?",
]

HELDOUT9_CODE = [  # written before the drafter's time was rescaled online, measured once
    "Write a Python function that merges overlapping intervals in a list of (start, end) pairs.",
    "Write a JavaScript function that deep-clones a plain object containing arrays and nested objects.",
]

HELDOUT9_CHAT = [
    "How do solar panels turn sunlight into electricity?",
    "What are some good ways to prepare for a job interview?",
]

HELDOUT10_CODE = [  # written before the drafter-or-kept-layers choice was built, measured once
    "Write a Python function that returns the n most common words in a text file, ignoring case and punctuation.",
    "Write a TypeScript function that debounces another function by a given number of milliseconds.",
]

HELDOUT10_CHAT = [
    "What is the difference between weather and climate?",
    "How can I get better at remembering people's names?",
]

HELDOUT11_CODE = [  # written before the free-tree-sized streaming buffers were measured, measured once
    "Write a Rust function that merges two sorted vectors of integers into one sorted vector.",
    "Write a Python class for a least-recently-used cache with get and put methods.",
    "Write a SQL query that lists each customer's total order amount for 2024, largest first.",
]

HELDOUT11_CHAT = [
    "Why do cats purr?",
    "Give me three tips for writing a clear email to my manager.",
    "What should I pack for a weekend hiking trip in autumn?",
]

HELDOUT12_CODE = [  # written before the streaming figure with the drafter's predicted side made to win by 2x, measured once
    "Write a Go function that counts the vowels in a string.",
    "Write a Python function that flattens a nested list of arbitrary depth.",
    "Write a Bash script that renames every .txt file in a folder to .md.",
]

HELDOUT12_CHAT = [
    "How do noise-cancelling headphones work?",
    "What are some good habits for saving money each month?",
    "Why is the sky blue during the day and red at sunset?",
]

HELDOUT13_CODE = [  # written before the streaming figure with the drafter-less regime planned, measured once
    "Write a Rust function that returns the second largest number in a slice.",
    "Write a JavaScript function that debounces another function.",
    "Write a SQL query that lists the five customers with the most orders.",
]

HELDOUT13_CHAT = [
    "What should I pack for a three-day hiking trip?",
    "How does a credit score get calculated?",
    "Why do cats purr?",
]

HELDOUT14_CODE = [  # written before the streaming figure after the timing warm-up, measured once
    "Write a C function that reverses a singly linked list.",
    "Write a Python class for a stack with push, pop and peek.",
    "Write a TypeScript function that groups an array of objects by a key.",
]

HELDOUT14_CHAT = [
    "How do vaccines train the immune system?",
    "What is a good way to start learning to draw?",
    "Why does bread go stale?",
]

HELDOUT16_CODE = [  # written before the deep-streaming measurement (0.9 GB), measured once
    "Write a Python function that flattens a nested dictionary into dotted keys, e.g. {'a': {'b': 1}} -> {'a.b': 1}.",
    "Write a TypeScript function that debounces another function and returns a cancel method.",
    "Write a SQL query that finds the three customers with the highest total order value in the last 30 days.",
]

HELDOUT16_CHAT = [
    "What is the difference between TCP and UDP, and when would I pick each?",
    "How can I make my morning routine less rushed? Give me a short plan.",
    "Explain what a content delivery network does, for someone who runs a small website.",
]


def _numbered() -> dict[str, list[str]]:
    """The numbered sets of the three modules by their --prompts names, in the order they were written."""
    sets = {**globals(), **vars(heldout_later), **vars(heldout_latest)}
    found = (re.fullmatch(r"HELDOUT(\d+)_(CODE|CHAT)", name) for name in sets)
    return {f"heldout{m[1]}-{m[2].lower()}": sets[m[0]] for m in found if m}


NUMBERED = _numbered()
