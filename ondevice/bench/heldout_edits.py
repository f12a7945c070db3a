"""Held-out edit and agent-like prompts: written before the first measurement of sized free rounds
(draft/sizing.py) and never tuned on; the tuned ones are prompt_sets.EDIT_EVAL and prompt_sets.AGENT_EVAL."""

_RATE_LIMITER = """```python
import time


class RateLimiter:
    def __init__(self, rate, per):
        self.rate = rate
        self.per = per
        self.allowance = rate
        self.last_check = time.monotonic()

    def allow(self):
        now = time.monotonic()
        elapsed = now - self.last_check
        self.last_check = now
        self.allowance += elapsed * (self.rate / self.per)
        if self.allowance > self.rate:
            self.allowance = self.rate
        if self.allowance < 1.0:
            return False
        self.allowance -= 1.0
        return True
```"""

HELDOUT15_EDIT = [
    "Add type hints and a short docstring to every method of this class. Keep the logic unchanged and reply "
    f"with the whole class.\n\n{_RATE_LIMITER}",
    """Replace the for loop with a list comprehension where it is possible, and reply with the whole function.

```python
def active_emails(users, domain=None):
    emails = []
    for user in users:
        if not user.get("active"):
            continue
        email = user["email"].strip().lower()
        if domain is not None and not email.endswith("@" + domain):
            continue
        emails.append(email)
    return sorted(set(emails))
```""",
    """Convert this JavaScript function from callbacks to async/await and reply with the whole function.

```javascript
function loadProfile(userId, callback) {
  db.findUser(userId, function (err, user) {
    if (err) {
      return callback(err);
    }
    db.findPosts(user.id, function (err, posts) {
      if (err) {
        return callback(err);
      }
      callback(null, { name: user.name, email: user.email, posts: posts.length });
    });
  });
}
```""",
    """Rename the struct field `cnt` to `count` everywhere in this Rust code and reply with the whole code.

```rust
pub struct Histogram {
    buckets: Vec<u64>,
    cnt: u64,
    width: f64,
}

impl Histogram {
    pub fn new(n: usize, width: f64) -> Self {
        Histogram { buckets: vec![0; n], cnt: 0, width }
    }

    pub fn add(&mut self, value: f64) {
        let i = ((value / self.width) as usize).min(self.buckets.len() - 1);
        self.buckets[i] += 1;
        self.cnt += 1;
    }

    pub fn fraction(&self, i: usize) -> f64 {
        if self.cnt == 0 {
            return 0.0;
        }
        self.buckets[i] as f64 / self.cnt as f64
    }
}
```""",
]

_INVENTORY_V1 = """```python
class Inventory:
    def __init__(self):
        self.items = {}

    def add(self, name, quantity):
        self.items[name] = self.items.get(name, 0) + quantity

    def remove(self, name, quantity):
        if self.items.get(name, 0) < quantity:
            raise ValueError(f"not enough {name}")
        self.items[name] -= quantity
        if self.items[name] == 0:
            del self.items[name]

    def count(self, name):
        return self.items.get(name, 0)
```"""

_INVENTORY_V2 = _INVENTORY_V1.replace(
    """    def count(self, name):
        return self.items.get(name, 0)""",
    """    def count(self, name):
        return self.items.get(name, 0)

    def low_stock(self, threshold):
        return sorted(name for name, quantity in self.items.items() if quantity < threshold)""",
)

_INVENTORY_V3 = _INVENTORY_V2.replace(
    """    def add(self, name, quantity):
        self.items""",
    """    @staticmethod
    def _check(quantity):
        if not isinstance(quantity, int) or isinstance(quantity, bool) or quantity <= 0:
            raise ValueError(f"quantity must be a positive integer, not {quantity!r}")

    def add(self, name, quantity):
        self._check(quantity)
        self.items""",
).replace(
    """    def remove(self, name, quantity):
        if""",
    """    def remove(self, name, quantity):
        self._check(quantity)
        if""",
)

_TURNS = [
    "Write a Python class Inventory with add(name, quantity), remove(name, quantity) and count(name).",
    "Add low_stock(threshold), returning the sorted names with fewer items than threshold. Reply with the whole class.",
    "Make add and remove reject quantities that are not positive integers with a ValueError. Reply with the whole class.",
    "Write pytest tests for the class: adding, removing too many, low_stock, and a negative quantity.",
]
_ANSWERS = [f"Here is the class:\n\n{_INVENTORY_V1}", f"Updated:\n\n{_INVENTORY_V2}",
            f"The class with validation:\n\n{_INVENTORY_V3}"]


def _conversation(upto: int) -> list[dict[str, str]]:
    """The conversation up to user turn `upto` (0-based), with the earlier answers."""
    messages: list[dict[str, str]] = []
    for i in range(upto):
        messages += [{"role": "user", "content": _TURNS[i]}, {"role": "assistant", "content": _ANSWERS[i]}]
    return messages + [{"role": "user", "content": _TURNS[upto]}]


HELDOUT15_AGENT = [_conversation(i) for i in range(len(_TURNS))]
