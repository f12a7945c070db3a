"""Prompt sets for benchmarks, exactness tests and calibration (VocabTrim, acceptance priors).

CALIBRATION prompts are used to build things (trimmed vocabularies, acceptance-by-rank priors);
EVAL prompts are held out from those and used to measure them; the held-out sets the planner's and
streaming figures come from are in bench/heldout.py.
"""

from ondevice.bench.heldout_edits import HELDOUT15_AGENT, HELDOUT15_EDIT
from ondevice.bench.heldout import HELDOUT_CHAT, HELDOUT_CODE, NUMBERED

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

# More edits (held out from tuning, like everything below: no constant, prior or keep set was chosen on them).
EDIT_EVAL += [
    """Add a docstring and type hints to this Python function. Do not change its logic; reply with the whole function.

```python
def chunk_text(text, size=200, overlap=20):
    if size <= overlap:
        raise ValueError("size must be larger than overlap")
    chunks = []
    start = 0
    while start < len(text):
        end = min(start + size, len(text))
        chunks.append(text[start:end])
        if end == len(text):
            break
        start = end - overlap
    return chunks
```""",
    """In this Go function, return an error instead of calling log.Fatal, and update the signature accordingly. Reply with the whole function.

```go
func loadConfig(path string) Config {
\tdata, err := os.ReadFile(path)
\tif err != nil {
\t\tlog.Fatal(err)
\t}
\tvar cfg Config
\tif err := json.Unmarshal(data, &cfg); err != nil {
\t\tlog.Fatal(err)
\t}
\tif cfg.Port == 0 {
\t\tcfg.Port = 8080
\t}
\tif cfg.Host == "" {
\t\tcfg.Host = "localhost"
\t}
\treturn cfg
}
```""",
    """Replace the for loop in this TypeScript function with Array.prototype.reduce, keeping everything else as it is. Reply with the whole function.

```typescript
export function totalsByCategory(items: Item[]): Record<string, number> {
  const totals: Record<string, number> = {};
  for (const item of items) {
    if (item.archived) {
      continue;
    }
    const key = item.category ?? "other";
    totals[key] = (totals[key] ?? 0) + item.price * item.quantity;
  }
  return totals;
}
```""",
]

# Agent-like sessions: one conversation that revises the same code turn after turn, as an editor or
# coding agent drives it. Each prompt is the conversation up to a user turn (the assistant turns are
# written here), so later prompts carry earlier versions of the code the answer mostly re-emits.
# Held out from tuning: no constant, prior or keep set was chosen on them.
_LOG_V1 = """```python
def parse_log_line(line):
    date, time, level, rest = line.split(" ", 3)
    component, message = rest.split("] ", 1)
    return {
        "date": date,
        "time": time,
        "level": level,
        "component": component.lstrip("["),
        "message": message,
    }
```"""
_LOG_V2 = """```python
def parse_log_line(line):
    date, time, level, rest = line.split(" ", 3)
    if rest.startswith("["):
        component, message = rest.split("] ", 1)
        component = component.lstrip("[")
    else:
        component, message = None, rest
    return {
        "date": date,
        "time": time,
        "level": level,
        "component": component,
        "message": message,
    }
```"""
_LOG_V3 = """```python
from collections import Counter


def parse_log_line(line):
    date, time, level, rest = line.split(" ", 3)
    if rest.startswith("["):
        component, message = rest.split("] ", 1)
        component = component.lstrip("[")
    else:
        component, message = None, rest
    return {
        "date": date,
        "time": time,
        "level": level,
        "component": component,
        "message": message,
    }


def summarize(lines):
    counts = Counter()
    for line in lines:
        try:
            entry = parse_log_line(line.strip())
        except ValueError:
            continue
        counts[entry["level"]] += 1
    return dict(counts)
```"""
_LOG_V4 = """```python
from collections import Counter


def parse_log_line(line: str) -> dict[str, str | None]:
    \"\"\"Split a log line into date, time, level, component (None if absent) and message.\"\"\"
    date, time, level, rest = line.split(" ", 3)
    if rest.startswith("["):
        component, message = rest.split("] ", 1)
        component = component.lstrip("[")
    else:
        component, message = None, rest
    return {
        "date": date,
        "time": time,
        "level": level,
        "component": component,
        "message": message,
    }


def summarize(lines: list[str]) -> dict[str, int]:
    \"\"\"Count the lines per level, skipping lines that do not parse.\"\"\"
    counts: Counter[str] = Counter()
    for line in lines:
        try:
            entry = parse_log_line(line.strip())
        except ValueError:
            continue
        counts[entry["level"]] += 1
    return dict(counts)
```"""
_CART_V1 = """```javascript
class Cart {
  constructor() {
    this.items = new Map();
  }

  add(sku, price, quantity = 1) {
    const item = this.items.get(sku) || { price, quantity: 0 };
    item.quantity += quantity;
    this.items.set(sku, item);
  }

  remove(sku) {
    this.items.delete(sku);
  }

  total() {
    let sum = 0;
    for (const item of this.items.values()) {
      sum += item.price * item.quantity;
    }
    return sum;
  }
}
```"""
_CART_V2 = """```javascript
class Cart {
  constructor() {
    this.items = new Map();
    this.discount = 0;
  }

  add(sku, price, quantity = 1) {
    const item = this.items.get(sku) || { price, quantity: 0 };
    item.quantity += quantity;
    this.items.set(sku, item);
  }

  remove(sku) {
    this.items.delete(sku);
  }

  applyDiscount(percent) {
    if (percent < 0 || percent > 100) {
      throw new RangeError("percent must be between 0 and 100");
    }
    this.discount = percent;
  }

  total() {
    let sum = 0;
    for (const item of this.items.values()) {
      sum += item.price * item.quantity;
    }
    return sum * (1 - this.discount / 100);
  }
}
```"""

_CART_V3 = _CART_V2.replace(
    """  remove(sku) {
    this.items.delete(sku);
  }""",
    """  remove(sku, quantity) {
    const item = this.items.get(sku);
    if (!item) {
      return;
    }
    item.quantity -= quantity ?? item.quantity;
    if (item.quantity <= 0) {
      this.items.delete(sku);
    }
  }""",
)

def _session(turns: list[str], answers: list[str]) -> list[list[dict[str, str]]]:
    """The conversation up to each user turn (answers[i] follows turns[i])."""
    messages, prompts = [], []
    for i, turn in enumerate(turns):
        messages = messages + [{"role": "user", "content": turn}]
        prompts.append(messages)
        if i < len(answers):
            messages = messages + [{"role": "assistant", "content": answers[i]}]
    return prompts


AGENT_EVAL = _session(
    [
        "Write a Python function parse_log_line(line) that parses lines like "
        "'2024-05-01 12:00:03 ERROR [db] connection lost' into a dict with date, time, level, component and message.",
        "Some lines have no component, like '2024-05-01 12:00:03 INFO started'. Return component None for those. "
        "Reply with the whole function.",
        "Now add summarize(lines), which uses parse_log_line to count the lines per level and skips lines that do not "
        "parse. Reply with the whole module.",
        "Add type hints and a docstring to both functions. Reply with the whole module.",
        "Write pytest tests for parse_log_line and summarize, covering a line with a component, one without, and an "
        "unparseable line.",
    ],
    [f"Here is the function:\n\n{_LOG_V1}", f"Updated:\n\n{_LOG_V2}", f"The module:\n\n{_LOG_V3}",
     f"The module with type hints and docstrings:\n\n{_LOG_V4}"],
) + _session(
    [
        "Write a JavaScript class Cart with add(sku, price, quantity), remove(sku) and total().",
        "Add applyDiscount(percent), which total() applies; reject percentages outside 0-100. Reply with the whole class.",
        "Make remove(sku, quantity) remove only that many items, and the whole line when quantity is omitted or "
        "reaches zero. Reply with the whole class.",
        "Add JSDoc comments to every method. Reply with the whole class.",
    ],
    [_CART_V1, _CART_V2, _CART_V3],
)

EVAL = CODE_EVAL + CHAT_EVAL
HELDOUT = HELDOUT_CODE + HELDOUT_CHAT
CALIBRATION = CODE_CALIBRATION + CHAT_CALIBRATION
SETS = {"eval": EVAL, "code": CODE_EVAL, "chat": CHAT_EVAL, "edit": EDIT_EVAL, "agent": AGENT_EVAL,  # by --prompts name
        "calibration": CALIBRATION, "heldout": HELDOUT, "heldout-code": HELDOUT_CODE, "heldout-chat": HELDOUT_CHAT,
        **NUMBERED, "heldout15-edit": HELDOUT15_EDIT, "heldout15-agent": HELDOUT15_AGENT}


def messages(prompt: str | list[dict[str, str]]) -> list[dict[str, str]]:
    """A prompt of any set as chat messages: a string is one user message, a conversation stays as it is."""
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt


def encoded(name: str, limit: int, tokenizer) -> list[list[int]]:
    """The first `limit` prompts of set `name` (0: all) through `tokenizer`'s chat template, as the
    bench encodes them (anything with `encode_chat(messages)`)."""
    return [tokenizer.encode_chat(messages(t)) for t in SETS[name][: limit or None]]
