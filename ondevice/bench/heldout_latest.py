"""Held-out prompt sets, the latest ones (heldout41 on): written for one measurement each and never
iterated on. The earlier sets and the `NUMBERED` index of all three modules are in bench/heldout.py."""


HELDOUT41_CODE = [  # written before any run with the disk's reads capped
    "Write a Python function that merges two sorted lists into one sorted list.",
    "Write a TypeScript function that groups an array of objects by one of their keys.",
    "Write a Python function that checks whether a string is a valid IPv4 address.",
    "Write a C function that reverses a singly linked list in place.",
]

HELDOUT41_CHAT = [
    "How can I get better at remembering the names of people I meet?",
    "What are some easy dinners to cook when I am tired after work?",
    "How should I prepare for my first job interview after university?",
    "What can I do on a rainy weekend with two young children at home?",
]

HELDOUT42_CODE = [  # written before any run of the drafter's LM head in IQ4_NL
    "Write a Python function that returns the most common element of a list and how often it occurs.",
    "Write a Java method that checks whether two strings are anagrams of each other.",
    "Write a Python class for a simple stack with push, pop and peek methods.",
    "Write a JavaScript function that removes duplicate values from an array while keeping their order.",
]

HELDOUT42_CHAT = [
    "How can I make a long car trip more pleasant for the whole family?",
    "What are good habits for keeping my email inbox under control?",
    "How do I choose a good book to read when I have not read in years?",
    "What should I pack for a weekend camping trip in the mountains?",
]

HELDOUT43_CODE = [  # written before any run of the drafter held without its input table
    "Write a Python function that returns the second largest number in a list, or None if there is none.",
    "Write a Go function that reverses the order of the words in a sentence.",
    "Write a Python function that counts the vowels in a string, upper and lower case alike.",
    "Write a JavaScript function that checks whether a string is a palindrome, ignoring spaces and case.",
]

HELDOUT43_CHAT = [
    "How can I make working from home feel less lonely?",
    "What are some good ways to use up leftover rice?",
    "How do I politely decline an invitation from a coworker?",
    "What should I look for when renting my first apartment?",
]

HELDOUT44_CODE = [  # written before any run of the planner pricing a tree family's first rounds apart
    "Write a Python function that splits a list into chunks of a given size.",
    "Write a Rust function that returns the largest value in a slice of integers, or None if it is empty.",
    "Write a Python function that converts a number of seconds into a string like 1h 02m 03s.",
    "Write a JavaScript function that capitalizes the first letter of every word in a sentence.",
]

HELDOUT44_CHAT = [
    "How can I start running regularly if I have never exercised before?",
    "What are some polite ways to end a phone call that is going on too long?",
    "How do I keep my houseplants alive while I am away for two weeks?",
    "What should I think about before adopting a cat?",
]

HELDOUT45_CODE = [  # written before any run of the planner in a home that had answered other prompts before
    "Write a Python function that returns the longest word in a sentence.",
    "Write a C function that counts how many times a character occurs in a string.",
    "Write a Python function that flattens a list of lists by one level.",
    "Write a JavaScript function that returns the number of days between two dates.",
]

HELDOUT45_CHAT = [
    "How can I make my mornings less rushed before work?",
    "What are some ways to save money on groceries each week?",
    "How do I start learning to play the guitar as an adult?",
    "What should I do if I cannot fall asleep at night?",
]

HELDOUT46_CHAT = [  # written before any run of `ondevice chat` under 0.9 GB with the drafter held
    "How do I get my teenager interested in cooking?",
    "What are good ways to stay focused when studying at home?",
    "How can I tell whether a watermelon is ripe at the store?",
    "What should I bring to a friend's house when I am invited for dinner?",
]

HELDOUT47_CODE = [  # written before any run of the load weighing tree sizes against kept layers
    "Write a Python function that returns the second largest number in a list.",
    "Write a Go function that reverses the words in a sentence.",
    "Write a Python function that checks whether two strings are anagrams of each other.",
    "Write a TypeScript function that removes duplicate values from an array of numbers.",
]

HELDOUT47_CHAT = [
    "How can I make a long car trip with small children more pleasant?",
    "What are some easy ways to drink more water during the day?",
    "How do I prepare for my first job interview in years?",
    "What should I think about before buying a used bicycle?",
]

HELDOUT48_CODE = [  # written before any run of the load weighing tree sizes against kept layers from a home that answered before
    "Write a Python function that returns the most common character in a string.",
    "Write a Java method that checks whether a number is prime.",
    "Write a Python function that merges two dictionaries, adding the values of keys found in both.",
    "Write a JavaScript function that returns the sum of the digits of a positive integer.",
]

HELDOUT48_CHAT = [
    "How can I get better at remembering people's names?",
    "What are some fun things to do on a rainy weekend at home?",
    "How do I start composting in a small apartment?",
    "What should I pack for a three-day hiking trip?",
]

HELDOUT49_CODE = [  # written before any run of the tree-size weighing with the disk's reads not capped
    "Write a Python function that returns the indices of the two numbers in a list that add up to a target.",
    "Write a C function that reverses a singly linked list.",
    "Write a Python function that converts a Roman numeral to an integer.",
    "Write a JavaScript function that groups an array of objects by the value of a given key.",
]

HELDOUT49_CHAT = [
    "How can I make my small balcony feel like a garden?",
    "What are some ways to keep a conversation going on a first date?",
    "How do I get back into reading books after years of not reading?",
    "What should I consider before switching to a standing desk?",
]

HELDOUT50_CODE = [  # written before any run of the target streaming without llama.cpp's copy of the vocabulary
    "Write a Python function that flattens a nested list of any depth.",
    "Write a Go function that counts the words in a string.",
    "Write a Python function that returns True if two strings are anagrams of each other.",
    "Write a JavaScript function that debounces another function by a given number of milliseconds.",
]

HELDOUT50_CHAT = [
    "How can I keep my houseplants alive while I am away for two weeks?",
    "What are good ways to save money on groceries each month?",
    "How do I prepare for a job interview over video call?",
    "What should I know before adopting an older dog?",
]

HELDOUT51_CODE = [  # written before any run of the target's logits read in place
    "Write a Python function that rotates a square matrix by 90 degrees clockwise.",
    "Write a Rust function that returns the second largest number in a vector.",
    "Write a Python function that validates an IPv4 address given as a string.",
    "Write a TypeScript function that deep-clones a plain object.",
]

HELDOUT51_CHAT = [
    "How can I stop procrastinating on small household chores?",
    "What are some easy ways to make my morning routine calmer?",
    "How do I choose a good pair of running shoes?",
    "What should I think about before lending money to a friend?",
]

HELDOUT52_CODE = [  # written before any run of the streaming plan's smaller margin
    "Write a Python function that finds the longest common prefix of a list of strings.",
    "Write a C function that counts the set bits in an unsigned integer.",
    "Write a Python function that splits a list into chunks of a given size.",
    "Write a JavaScript function that converts a camelCase string to snake_case.",
]

HELDOUT52_CHAT = [
    "How can I make a long car trip with children less stressful?",
    "What are some good habits for keeping my email inbox under control?",
    "How do I pick a houseplant that survives in a dark room?",
    "What should I know before starting to run in cold weather?",
]
