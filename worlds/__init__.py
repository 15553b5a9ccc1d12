"""The worlds the methods are tried in, each made in code: the exact-answer tasks (tasks), the real model's chat
prompts with their checkers (realworld), and the conversion's data for SmolLM2 (conversion)."""
