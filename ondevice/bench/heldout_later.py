"""Held-out prompt sets, the later ones (heldout17 to heldout40): written for one measurement each and
never iterated on. The earlier sets and the `NUMBERED` index of all three modules are in bench/heldout.py;
the latest are in bench/heldout_latest.py."""


HELDOUT17_CODE = [  # written before the page-cache plan was measured (1.2 and 0.9 GB), measured once
    "Write a Python function that merges overlapping intervals in a list of (start, end) tuples.",
    "Write a Go function that reads a CSV file and returns the sum of its second column.",
    "Write a bash script that deletes files older than 7 days in a given directory, printing each name.",
]

HELDOUT17_CHAT = [
    "Why do bread recipes ask you to let the dough rest? Keep it short.",
    "What should I check before buying a used bicycle?",
    "Explain the difference between a virus and a bacterium to a ten-year-old.",
]

HELDOUT18_CODE = [  # written before the measurements of the batched-pass kernels and overlap at 0.9 GB
    "Write a Python function that returns the k most frequent words in a text, ignoring case.",
    "Write a JavaScript function that debounces another function by a given number of milliseconds.",
    "Write a SQL query that lists each customer's total order amount for 2024, highest first.",
]

HELDOUT18_CHAT = [
    "How do I keep basil alive on a windowsill?",
    "What is the difference between weather and climate?",
    "Give me three tips for sleeping better after a long flight.",
]

HELDOUT19_CODE = [  # written before the planner's choices under 0.9 GB were measured with them
    "Write a Python function that merges overlapping intervals given as a list of (start, end) pairs.",
    "Write a TypeScript function that groups an array of objects by the value of a given key.",
    "Write a C function that reverses a singly linked list in place and returns the new head.",
]

HELDOUT19_CHAT = [
    "What are some good ways to learn to cook on a small budget?",
    "Why does the moon look bigger near the horizon?",
    "How should I prepare for a job interview at a small company?",
]

HELDOUT20_CODE = [  # written before llama.cpp's repacked (AMX) layouts were measured with them
    "Write a Python function that returns the k most frequent words in a text, ties broken alphabetically.",
    "Write a Go function that checks whether a string of brackets ()[]{} is balanced.",
    "Write a SQL query that finds the second highest salary in each department of an employees table.",
    "Write a Rust function that parses a line of comma-separated integers into a Vec<i64>, returning an error on bad input.",
]

HELDOUT20_CHAT = [
    "How can I keep houseplants alive while I am away for two weeks?",
    "What is the difference between weather and climate?",
    "Give me some tips for running my first 10 km race.",
    "Why do cats purr?",
]

HELDOUT21_CODE = [  # written before the AMX kernels ran on threads of their own
    "Write a Python function that flattens an arbitrarily nested list of integers.",
    "Write a JavaScript function that debounces another function by a given number of milliseconds.",
    "Write a C function that reverses a singly linked list in place and returns the new head.",
    "Write a Python class for an LRU cache with get and put in O(1) time.",
]

HELDOUT21_CHAT = [
    "What should I pack for a three-day hiking trip in autumn?",
    "Why is the sky blue during the day and red at sunset?",
    "How do I politely decline an invitation to a party?",
    "What are the benefits of learning a second language as an adult?",
]

HELDOUT22_CODE = [  # written before fixed trees were timed against the planner on them
    "Write a Python function that converts a Roman numeral string to an integer.",
    "Write a TypeScript function that groups an array of objects by the value of a given key.",
    "Write a Bash script that prints the ten largest files under a directory.",
    "Write a Java method that checks whether two strings are anagrams of each other.",
]

HELDOUT22_CHAT = [
    "How can I sleep better when I share a room with someone who snores?",
    "What is the difference between a virus and a bacterium?",
    "Give me a few ideas for a cheap weekend trip with friends.",
    "Why do leaves change colour in autumn?",
]

HELDOUT23_CODE = [  # written before the default was measured with them under 1.2 GB
    "Write a Python function that returns all permutations of a list without using itertools.",
    "Write a Go function that reads a file line by line and counts the lines that contain a given word.",
    "Write a SQL query that lists customers who placed no orders in the last 90 days.",
    "Write a C++ function that rotates a square matrix by 90 degrees clockwise in place.",
]

HELDOUT23_CHAT = [
    "How do I start learning to play the guitar as an adult?",
    "What causes thunder and lightning?",
    "Give me some advice for my first job interview.",
    "Why do we dream?",
]


HELDOUT24_CODE = [  # written before the planner's budgeted audits and the saved drafter choice were measured
    "Write a Python function that merges overlapping intervals in a list of (start, end) pairs.",
    "Write a JavaScript function that debounces another function by a given number of milliseconds.",
    "Write a Rust function that checks whether a string is a valid IPv4 address.",
    "Write a Python class for a least-recently-used cache with get and put methods.",
]

HELDOUT24_CHAT = [
    "What should I pack for a week-long hiking trip?",
    "How do vaccines train the immune system?",
    "Suggest a few ways to stay focused while working from home.",
    "Why is the ocean salty?",
]


HELDOUT25_CODE = [  # written before the sized rounds' record was measured
    "Write a Python function that finds the longest common prefix of a list of strings.",
    "Write a TypeScript function that groups an array of objects by the value of a given key.",
    "Write a Bash script that deletes files older than seven days in a given directory.",
    "Write a Java method that checks whether a linked list has a cycle.",
]

HELDOUT25_CHAT = [
    "How can I make my houseplants last longer?",
    "What is the difference between weather and climate?",
    "Give me tips for sleeping better at night.",
    "Why do cats purr?",
]


HELDOUT26_CODE = [  # written before the streaming chat's context was sized to keep the LM head
    "Write a Python function that merges overlapping intervals given as a list of (start, end) pairs.",
    "Write a Go function that returns the words of a sentence in reverse order.",
    "Write a C function that rotates an array of integers left by k positions in place.",
    "Write a Kotlin function that validates an email address with a regular expression.",
]

HELDOUT26_CHAT = [
    "What are some good habits for keeping a tidy kitchen?",
    "How does a rainbow form?",
    "Suggest a simple weekly plan for learning to play the guitar.",
    "What should I consider before adopting a dog?",
]

HELDOUT27_CODE = [  # written before the tokenizer shared the target's vocabulary
    "Write a Python function that run-length encodes a string, turning 'aaabcc' into 'a3b1c2'.",
    "Write a JavaScript function that converts Fahrenheit to Celsius, rounded to one decimal place.",
    "Write a Rust function that tells whether a given year is a leap year.",
    "Write a Java method that transposes a square matrix of integers in place.",
]

HELDOUT27_CHAT = [
    "How do ocean tides work?",
    "What can I put in a home compost bin, and what should I leave out?",
    "Any tips for getting over jet lag after a long flight?",
    "Why do volcanoes erupt?",
]


HELDOUT28_CODE = [  # written before a measured tree kept the lead from predicted ones
    "Write a Python function that converts a camelCase identifier to snake_case.",
    "Write a TypeScript function that returns the longest palindromic substring of a string.",
    "Write a C++ function that counts the set bits of an unsigned 32-bit integer.",
    "Write a Ruby method that groups a list of words by their first letter.",
]

HELDOUT28_CHAT = [
    "How do I keep a sourdough starter alive?",
    "What causes the northern lights?",
    "How often should I oil a bicycle chain?",
    "What is a good way to start journaling?",
]

HELDOUT29_CODE = [  # written before any run with the books rescaled to the machine's speed at load
    "Write a Java method that checks whether a binary tree is balanced.",
    "Write a Swift function that removes repeated elements from an array while keeping their order.",
    "Write a Python function that splits a list into chunks of a given size.",
    "Write a Go function that counts how many times each word appears in a string.",
]

HELDOUT29_CHAT = [
    "How can I sleep better when working night shifts?",
    "How do I remove a red wine stain from a carpet?",
    "How often should I check my car's tire pressure?",
    "What is a polite way to ask for a higher salary?",
]

HELDOUT30_CODE = [  # written before any run on the AVX-512 EPYC of 2026-12-06
    "Write a TypeScript function that deep-merges two plain objects.",
    "Write a Lua function that shuffles a table in place.",
    "Write a Kotlin function that returns the longest word in a sentence.",
    "Write a C# method that counts how many vowels a string contains.",
]

HELDOUT30_CHAT = [
    "How do I get my cat used to a new litter box?",
    "What is a good way to split chores with roommates?",
    "How can I stop my glasses from fogging up when I wear a mask?",
    "How should I prepare for a long flight with a toddler?",
]

HELDOUT31_CODE = [  # written before any run of the drafting priced per call of the search
    "Write an Elixir function that sums the even numbers in a list.",
    "Write a Swift function that returns the indices of a string's uppercase letters.",
    "Write a Dart function that capitalizes the first letter of every word in a string.",
    "Write a Go function that returns the greatest common divisor of two integers.",
]

HELDOUT31_CHAT = [
    "How do I stop my bread dough from sticking to my hands?",
    "What can I do on a rainy weekend with two bored kids?",
    "How should I store winter clothes over the summer?",
    "What should I bring to a friend's housewarming party?",
]

HELDOUT32_CODE = [  # written before any run of the search over a trimmed drafter's kept columns
    "Write a Rust function that reverses the words of a sentence.",
    "Write a PHP function that returns the second largest number in an array.",
    "Write a Python function that flattens a nested list of any depth.",
    "Write a Scala function that checks whether a string is a palindrome, ignoring case.",
]

HELDOUT32_CHAT = [
    "How do I keep basil growing on a windowsill?",
    "What is a gentle way to say no to extra work from my manager?",
    "How can I make my morning commute by bike less sweaty?",
    "What should I look for when buying a used piano?",
]

HELDOUT33_CODE = [  # written before any run of drafting in the streamed pass's disk waits on the EPYC
    "Write a Kotlin function that counts how many times each character appears in a string.",
    "Write a TypeScript function that removes duplicate objects from an array by their id field.",
    "Write a Python function that converts a Roman numeral to an integer.",
    "Write a C# method that returns the median of a list of integers.",
]

HELDOUT33_CHAT = [
    "How do I get my cat used to a new apartment?",
    "What is a good way to learn the names of people at a new job?",
    "How can I make a small balcony feel cozy in the evening?",
    "What should I pack for a three-day hiking trip in autumn?",
]

HELDOUT34_CODE = [  # written before any run of ranking by a learned step temperature
    "Write a Ruby method that groups an array of words by their first letter.",
    "Write a Python function that returns the longest common prefix of a list of strings.",
    "Write a Java method that rotates an array of integers to the right by k positions.",
    "Write a JavaScript function that converts a camelCase string to snake_case.",
]

HELDOUT34_CHAT = [
    "How do I keep my houseplants alive while I am away for two weeks?",
    "What are some cheap ways to make a rented flat feel like home?",
    "How can I get better at remembering what I read in books?",
    "What should I ask at the end of a job interview?",
]

HELDOUT35_CODE = [  # written before any run of the drafter requantized to IQ4_NL
    "Write a Go function that reverses the words in a sentence.",
    "Write a Python function that checks whether a string of brackets is balanced.",
    "Write a C function that counts the set bits in an unsigned integer.",
    "Write a TypeScript function that debounces another function by a given delay.",
]

HELDOUT35_CHAT = [
    "How do I start running if I have never exercised before?",
    "What is a good way to split chores fairly between flatmates?",
    "How can I make my morning routine less rushed?",
    "What should I pack for a weekend hiking trip in autumn?",
]

HELDOUT36_CODE = [  # written before any run on the AMX Xeon of 2026-12-06
    "Write a Rust function that returns the second largest number in a slice, if there is one.",
    "Write a Python function that flattens a nested list of any depth.",
    "Write a Kotlin function that checks whether two strings are anagrams.",
    "Write a Bash script that renames every .jpeg file in a folder to .jpg.",
]

HELDOUT36_CHAT = [
    "How do I say no to extra work without upsetting my manager?",
    "What are good habits for keeping a small kitchen tidy?",
    "How can I help a friend who is nervous about flying?",
    "What should I think about before adopting a cat?",
]

HELDOUT37_CODE = [  # written before any run of best-first's leaf margin
    "Write a Java method that returns the most frequent character in a string.",
    "Write a Python function that merges two sorted lists into one sorted list.",
    "Write a JavaScript function that groups an array of objects by a given key.",
    "Write a SQL query that finds the three highest-paid employees in each department.",
]

HELDOUT37_CHAT = [
    "How can I stop putting things off until the last minute?",
    "What is a good way to introduce myself at a meetup where I know no one?",
    "How should I prepare for my first week at a new job?",
    "What can I do on a rainy Sunday that doesn't involve a screen?",
]

HELDOUT38_CODE = [  # written before any run on the AVX2 EPYC of 2026-12-07
    "Write a Python function that checks whether a string is a valid IPv4 address.",
    "Write a C function that reverses a singly linked list in place.",
    "Write a TypeScript function that removes duplicate objects from an array by their id field.",
    "Write a Python function that returns the longest common prefix of a list of strings.",
]

HELDOUT38_CHAT = [
    "How do I keep a conversation going with someone who gives short answers?",
    "What should I pack for a weekend of camping in autumn?",
    "How can I get better at remembering people's names?",
    "What is a simple way to start saving money each month?",
]

HELDOUT39_CODE = [  # written before any run of the drafter's wider keep set
    "Write a Go function that counts the words in a string, ignoring punctuation.",
    "Write a Python function that returns the n-th Fibonacci number using memoization.",
    "Write a C# method that checks whether a year is a leap year.",
    "Write a Python function that splits a list into chunks of a given size.",
]

HELDOUT39_CHAT = [
    "How can I make my mornings less rushed before work?",
    "What are some ways to make new friends after moving to a new city?",
    "How do I ask my neighbor politely to keep the noise down at night?",
    "What should I know before buying my first bicycle for commuting?",
]

HELDOUT40_CODE = [  # written before any run of the drafter's larger keep set under a memory limit
    "Write a Python function that converts a temperature from Celsius to Fahrenheit and back.",
    "Write a JavaScript function that formats a number of seconds as hours, minutes and seconds.",
    "Write a Python function that finds all pairs in a list that add up to a target sum.",
    "Write a Rust function that counts how many times each word appears in a text.",
]

HELDOUT40_CHAT = [
    "How can I keep my houseplants alive while I travel for two weeks?",
    "What is a good way to explain my job to my grandparents?",
    "How do I start running if I have never exercised regularly?",
    "What should I consider when choosing a name for a small bakery?",
]
