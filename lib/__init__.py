"""The plumbing the method scripts share, safe to skip on a first reading: the training loop's bookkeeping
(training, runner), a run's checkpoints (checkpoint) and Hugging Face directories (hf), corpus preparation (corpus),
data and the tokenizer, the command lines (cli), the compiled samplers' steps (compiling), the HumanEval sandbox and
the lm-evaluation-harness model (sandbox, harness), the GGUF reader (gguf_import), the terminal chat (chat) and the
curves (plot)."""
