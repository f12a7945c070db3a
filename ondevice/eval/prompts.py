"""Prompt sets for benchmarks, exactness tests and calibration (VocabTrim, acceptance priors).

CALIBRATION prompts are used to build things (trimmed vocabularies, acceptance-by-rank priors);
EVAL prompts are held out from those and used to measure them.
"""

CODE_EVAL = [
    "Write a Python function that checks whether a string is a palindrome, ignoring case and punctuation.",
    "Implement binary search over a sorted list in Python and explain its complexity.",
    "Write a JavaScript function that debounces another function.",
    "Write a SQL query that returns the five customers with the highest total order value.",
    "Write a Rust function that reverses the words in a sentence.",
    "Implement a least-recently-used cache class in Python with get and put methods.",
]

CHAT_EVAL = [
    "Explain the difference between a process and a thread to a new programmer.",
    "What are three good habits for writing maintainable code?",
    "Summarize what a hash table is and when you would use one.",
    "Give me a short plan for learning Git in one week.",
]

CODE_CALIBRATION = [
    "Write a Python function that merges two sorted lists into one sorted list.",
    "Write a C function that counts the set bits in an unsigned integer.",
    "Implement quicksort in Python.",
    "Write a bash script that prints the ten largest files in a directory.",
    "Write a Python class for a stack with push, pop and peek.",
    "Write a Go function that reads a file line by line and counts the lines.",
    "Write a Python generator that yields the Fibonacci numbers.",
    "Write a TypeScript interface for a user with a name, an email and an optional age, and a function that validates it.",
    "Write unit tests with pytest for a function add(a, b).",
    "Write a Python function that parses a CSV file and returns the sum of one column.",
    "Implement a breadth-first search on a graph given as an adjacency list in Python.",
    "Write a regular expression that matches an email address and explain it.",
]

CHAT_CALIBRATION = [
    "What is the difference between TCP and UDP?",
    "Explain recursion with a simple example.",
    "What does a compiler do?",
    "How do I choose good names for variables?",
    "What is Big-O notation?",
    "Explain what an API is.",
    "What are the pros and cons of dynamic typing?",
    "Describe how garbage collection works in one paragraph.",
]

# Edits of code given in the prompt: the answer copies most of it (where prompt lookup pays).
EDIT_EVAL = [
    """Rewrite this Python function with type hints. Keep the code otherwise unchanged and reply with the whole function.

```python
def summarize_orders(orders, min_total=0.0, currency="EUR"):
    totals = {}
    counts = {}
    for order in orders:
        customer = order["customer"]
        amount = order["amount"]
        if order.get("currency", currency) != currency:
            continue
        totals[customer] = totals.get(customer, 0.0) + amount
        counts[customer] = counts.get(customer, 0) + 1
    result = []
    for customer, total in totals.items():
        if total < min_total:
            continue
        average = total / counts[customer]
        result.append({"customer": customer, "total": round(total, 2), "average": round(average, 2)})
    result.sort(key=lambda row: row["total"], reverse=True)
    return result
```""",
    """Rename the variable `data` to `records` in this JavaScript function and reply with the whole function.

```javascript
function groupByCity(data) {
  const groups = {};
  for (const item of data) {
    const city = item.address.city;
    if (!groups[city]) {
      groups[city] = [];
    }
    groups[city].push(item.name);
  }
  for (const city of Object.keys(groups)) {
    groups[city].sort();
  }
  return groups;
}
```""",
]

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

EVAL = CODE_EVAL + CHAT_EVAL
HELDOUT = HELDOUT_CODE + HELDOUT_CHAT
CALIBRATION = CODE_CALIBRATION + CHAT_CALIBRATION
SETS = {"eval": EVAL, "code": CODE_EVAL, "chat": CHAT_EVAL, "edit": EDIT_EVAL, "calibration": CALIBRATION,  # by --prompts name
        "heldout": HELDOUT, "heldout-code": HELDOUT_CODE, "heldout-chat": HELDOUT_CHAT}
