"""A GRPO or SFT run: recipe parsing (`configs`), the checks before step 1 (`checks`), `VLMGRPOTrainer` (`trainer`), the run from recipe to published model (`session`)."""
