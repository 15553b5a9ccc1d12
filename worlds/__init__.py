"""The worlds the methods are tried in, each made in code: the exact-answer tasks (tasks), the standard library's
preference and its pairs (stdlib), the real model's chat prompts with their checkers (realworld), and the
conversion's data for SmolLM2 (conversion)."""
